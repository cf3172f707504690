#!/usr/bin/env bash
# Runs every test of the workspace after setup (README's test command; CI calls it).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh"
VENV=${SCDINO_VENV:-$ROOT/.venv}
cd "$ROOT"
export PATH=$VENV/bin:$PATH LIBTORCH_USE_PYTORCH=1
cargo test --release --workspace "$@"
