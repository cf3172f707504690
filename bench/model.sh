#!/usr/bin/env bash
# Rust (tch) vs PyTorch: forward+backward of one multi-crop batch (2×224² + 8×96²), same
# threads, same shapes, run back to back in one invocation. Prints a markdown table row per
# arch with the ratio (PyTorch time / Rust time; >1 means Rust is faster).
# usage: bench/model.sh [BATCH] [THREADS] [ITERS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh" >/dev/null 2>&1 || "$ROOT/scripts/setup.sh"
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
BATCH=${1:-4} THREADS=${2:-2} ITERS=${3:-5}
echo "| arch | batch/crop | threads | Rust median s | PyTorch median s | PyTorch/Rust |"
echo "|---|---|---|---|---|---|"
for arch in vit_tiny vit_small; do
  args=(--arch "$arch" --batch "$BATCH" --threads "$THREADS" --iters "$ITERS" --warmup 1)
  rust=$("$ROOT/target/release/trainer" bench model "${args[@]}")
  py=$("$PY" "$ROOT/bench/model_fwd_bwd.py" "${args[@]}")
  "$PY" - "$rust" "$py" <<'PYEOF'
import json, sys
r, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"| {p['arch']} | {p['batch']} | {p['threads']} | {r['median_s']:.3f} | {p['median_s']:.3f} | {p['median_s'] / r['median_s']:.3f} |")
PYEOF
done
