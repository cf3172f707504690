#!/usr/bin/env bash
# Linear probe: ours (`trainer bench probe`, L-BFGS in libtorch, f64) vs scikit-learn's
# LogisticRegression (lbfgs, multinomial) on the same features: N = 90,851 L2-normalised 384-d
# features of 8 classes (clustered Gaussian, seeded; the scDINO training-split size), one λ
# (sklearn C = 1/(λ·N)), same thread count. Both fits are timed inside their process (data
# loading excluded and reported apart). Runs alternate R,P,... for ROUNDS rounds; the script
# fails unless both reach the same objective (within 1e-6 relative).
# usage: bench/linear_probe.sh [THREADS] [ROUNDS] [ROWS] [L2]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
TRAINER=$ROOT/target/release/trainer
[[ -x $TRAINER ]] || { echo "build first: cargo build --release (or scripts/setup.sh)" >&2; exit 1; }
THREADS=${1:-2} ROUNDS=${2:-1} ROWS=${3:-90851} L2=${4:-1e-4}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DATA=$WORK/features.safetensors
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
"$PY" "$ROOT/bench/linear_probe.py" gen --data "$DATA" --rows "$ROWS" >/dev/null
for _ in $(seq "$ROUNDS"); do
  "$TRAINER" bench probe --data "$DATA" --l2 "$L2" --threads "$THREADS" >>"$WORK/runs.jsonl"
  OMP_NUM_THREADS=$THREADS "$PY" "$ROOT/bench/linear_probe.py" peer --data "$DATA" --l2 "$L2" \
    --threads "$THREADS" >>"$WORK/runs.jsonl"
done
echo "load average (1/5/15 min) at start: $LOAD0, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$WORK/runs.jsonl" <<'PYEOF'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
rust = [r for r in runs if r["impl"] == "rust"]
py = [r for r in runs if r["impl"] != "rust"]
for r in rust + py:
    rel = abs(r["objective"] - py[0]["objective"]) / py[0]["objective"]
    assert rel <= 1e-6, f"objectives differ: {r['impl']} {r['objective']} vs sklearn {py[0]['objective']}"
med = lambda v: sorted(v)[len(v) // 2]
rf, pf = med([r["fit_s"] for r in rust]), med([r["fit_s"] for r in py])
print(f"{rust[0]['rows']} x {rust[0]['dim']} features, {rust[0]['classes']} classes, λ {rust[0]['l2']}")
print("| threads | runs/side | ours fit s (iterations) | sklearn fit s (iterations) | objective ours / sklearn | train top-1 ours / sklearn | sklearn/ours |")
print("|---|---|---|---|---|---|---|")
print(f"| {rust[0]['threads']} | {len(rust)} | {rf:.2f} ({rust[0]['iterations']}) | {pf:.2f} ({py[0]['iterations']}) | "
      f"{rust[0]['objective']:.8f} / {py[0]['objective']:.8f} | {rust[0]['train_top1_percent']:.2f} / {py[0]['train_top1_percent']:.2f} | {pf / rf:.2f} |")
PYEOF
