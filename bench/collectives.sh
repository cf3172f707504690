#!/usr/bin/env bash
# Our collectives (`trainer collectives-bench`, c10d through the shim) vs Python
# torch.distributed, both Gloo on NPROC local ranks, same ops, sizes, fill, iterations and busbw
# formulas (bench/collectives.py), in one invocation. Runs alternate R,P,R,P,... for ROUNDS
# rounds so machine noise hits both sides; the table gives per op and size the median busbw of
# each side and the ratio Rust/PyTorch (> 1: ours is faster). Both sides run with
# OMP_NUM_THREADS=1 (torchrun's default for several ranks per machine): Gloo's reduce_scatter
# reduces with ATen ops whose OpenMP pool would otherwise oversubscribe the cores.
# usage: [OPS="all_reduce all_gather reduce_scatter broadcast"] [RUNS_OUT=file.jsonl] \
#        bench/collectives.sh [MIN_BYTES] [MAX_BYTES] [FACTOR] [ITERS] [ROUNDS] [NPROC]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SCDINO_VENV:-$ROOT/.venv}
PY=$VENV/bin/python
TRAINER=$ROOT/target/release/trainer
for f in "$TRAINER" "$PY" "$VENV/bin/torchrun"; do
  [[ -x $f ]] || { echo "$f is missing: run scripts/setup.sh (venv and release build) first" >&2; exit 1; }
done
MIN=${1:-1048576} MAX=${2:-67108864} FACTOR=${3:-4} ITERS=${4:-20} ROUNDS=${5:-3} NPROC=${6:-2}
WARMUP=5
PORT=${PORT:-29591}
read -r -a OP_LIST <<<"${OPS:-all_reduce all_gather reduce_scatter broadcast}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RUNS=$WORK/runs.jsonl
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
export OMP_NUM_THREADS=1
common=(--min-bytes "$MIN" --max-bytes "$MAX" --factor "$FACTOR" --iters "$ITERS" --warmup "$WARMUP")

for op in "${OP_LIST[@]}"; do
  for _ in $(seq "$ROUNDS"); do
    "$TRAINER" launch --nproc "$NPROC" --master-port "$PORT" -- \
      collectives-bench --backend gloo --op "$op" "${common[@]}" --json "$WORK/r.json" >/dev/null
    cat "$WORK/r.json" >>"$RUNS"
    "$VENV/bin/torchrun" --standalone --nproc_per_node "$NPROC" \
      "$ROOT/bench/collectives.py" --op "$op" "${common[@]}" --json "$WORK/p.json" >/dev/null 2>&1
    cat "$WORK/p.json" >>"$RUNS"
  done
done

[[ -n ${RUNS_OUT:-} ]] && cp "$RUNS" "$RUNS_OUT"
echo "load average (1/5/15 min) at start: $LOAD0, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$RUNS" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
side = {"scdino.collectives_bench": "rust", "torch.distributed": "py"}
acc = {}
for r in runs:
    for o in r["ops"]:
        for s in o["sizes"]:
            assert s["wrong"] == 0, (r["kind"], o["op"], s)
            acc.setdefault((o["op"], s["size_bytes"]), {}).setdefault(side[r["kind"]], []).append(s)
w = runs[0]["world"]
print(f"| op | size (B) | ranks | runs/side | Rust time (us) | PyTorch time (us) | Rust busbw (GB/s) "
      f"| PyTorch busbw (GB/s) | Rust/PyTorch busbw |")
print("|---|---|---|---|---|---|---|---|---|")
for (op, size), v in acc.items():
    med = lambda k, key: statistics.median(s[key] for s in v[k])
    rb, pb = med("rust", "busbw_gbps"), med("py", "busbw_gbps")
    print(f"| {op} | {size} | {w} | {len(v['rust'])} | {med('rust', 'time_us'):.0f} | {med('py', 'time_us'):.0f} "
          f"| {rb:.3f} | {pb:.3f} | {rb / pb:.2f} |")
PYEOF
