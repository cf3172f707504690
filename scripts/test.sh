#!/usr/bin/env bash
# Runs every test of the workspace after setup (README's test command; CI calls it).
# Starts a real single-node Slurm on localhost for the launcher's end-to-end tests and
# stops it again on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh"
VENV=${SCDINO_VENV:-$ROOT/.venv}
cd "$ROOT"
export PATH=$VENV/bin:$PATH LIBTORCH_USE_PYTORCH=1
"$ROOT/scripts/slurm-local.sh" start
trap '"$ROOT/scripts/slurm-local.sh" stop || true' EXIT
eval "$("$ROOT/scripts/slurm-local.sh" env)"
export SCDINO_TEST_SLURM=1
cargo test --release --workspace "$@"
