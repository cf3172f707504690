#!/usr/bin/env bash
# Rust (tch) vs PyTorch: student forward+backward of one multi-crop batch (2×224² + 8×96²,
# 5 channels, DINO head with 65536 prototypes), same threads and shapes, in one invocation.
# The two sides alternate for ROUNDS rounds so machine noise hits both alike; the medians of
# all timed iterations are compared. Ratio = PyTorch time / Rust time (>1: Rust is faster).
# usage: bench/model.sh [BATCH] [THREADS] [ITERS] [ROUNDS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh" >/dev/null 2>&1 || "$ROOT/scripts/setup.sh"
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
BATCH=${1:-4} THREADS=${2:-2} ITERS=${3:-4} ROUNDS=${4:-3}
echo "| arch | batch/crop | threads | timed iters/side | Rust median s | PyTorch median s | PyTorch/Rust |"
echo "|---|---|---|---|---|---|---|"
for arch in vit_tiny vit_small; do
  args=(--arch "$arch" --batch "$BATCH" --threads "$THREADS" --iters "$ITERS" --warmup 1)
  runs=()
  for _ in $(seq "$ROUNDS"); do
    runs+=("$("$ROOT/target/release/trainer" bench model "${args[@]}")")
    runs+=("$("$PY" "$ROOT/bench/model_fwd_bwd.py" "${args[@]}")")
  done
  "$PY" - "$arch" "$BATCH" "$THREADS" "${runs[@]}" <<'PYEOF'
import json, statistics, sys
arch, batch, threads, *runs = sys.argv[1:]
t = {"rust-tch": [], "pytorch": []}
for r in map(json.loads, runs):
    t[r["impl"]] += r["times_s"]
r, p = statistics.median(t["rust-tch"]), statistics.median(t["pytorch"])
print(f"| {arch} | {batch} | {threads} | {len(t['pytorch'])} | {r:.3f} | {p:.3f} | {p / r:.3f} |")
PYEOF
done
