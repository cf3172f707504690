#!/usr/bin/env bash
# Loader throughput per core: our input pipeline vs scDINO's (Python peer), no model.
# Every side reads the same synthetic 5×50×50 uint16 TIFF folder (`trainer synth`) and produces
# scDINO's multi-crop batches (2×224² + 8×96², batch 32, crop scales (0.4, 1)/(0.05, 0.4)):
#   rust cpu     `trainer bench loader --path cpu`: worker threads decode, min–max, augment
#                straight into the batch tensors;
#   rust device  `--path device`: workers decode + min–max, the batched tensor augmentation
#                runs on the consumer thread with the same number of libtorch threads (on the
#                CPU here: the cost of the device path when there is no GPU);
#   rust read    `--path read`: workers decode + min–max only (the CPU cost of the device path
#                when the augmentation runs on a GPU);
#   python       bench/loader_peer.py: tifffile + scDINO's DataAugmentationDINO on torchvision,
#                DataLoader with num_workers = threads.
# Per core = images per CPU-second of the whole process (all threads; for Python the main
# process plus its workers), which stays meaningful on a shared machine where wall-clock
# throughput depends on what else runs. Runs alternate rust/python for ROUNDS rounds.
# usage: [RUNS_OUT=file.jsonl] bench/loader.sh [--source local] [THREADS_LIST] [ROUNDS]
#   THREADS_LIST e.g. "1 2"; --source picks where the images come from (only `local` so far;
#   the cache, shards and s3 sources plug in here).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SOURCE=local
if [[ ${1:-} == --source ]]; then
  SOURCE=$2
  shift 2
fi
case $SOURCE in
  local) ;;
  *) echo "unknown --source $SOURCE (available: local)" >&2; exit 2 ;;
esac
"$ROOT/scripts/setup.sh" >/dev/null 2>&1 || "$ROOT/scripts/setup.sh"
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
TRAINER=$ROOT/target/release/trainer
read -r -a THREADS_LIST <<<"${1:-1 2}"
ROUNDS=${2:-2}
BATCH=32 WARMUP=2
RUST_BATCHES=${RUST_BATCHES:-36} DEVICE_BATCHES=${DEVICE_BATCHES:-6} PEER_BATCHES=${PEER_BATCHES:-6}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RUNS=$WORK/runs.jsonl
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

per_class=$(((BATCH * (WARMUP + RUST_BATCHES) + 7) / 8))
"$TRAINER" synth --out "$WORK/data" --seed 0 --per-class "$per_class" >/dev/null
DATA=$WORK/data/Training

for _ in $(seq "$ROUNDS"); do
  for t in "${THREADS_LIST[@]}"; do
    common=(--data "$DATA" --batch "$BATCH" --warmup "$WARMUP")
    "$TRAINER" bench loader "${common[@]}" --path cpu --threads "$t" --batches "$RUST_BATCHES" >>"$RUNS"
    "$PY" "$ROOT/bench/loader_peer.py" "${common[@]}" --workers "$t" --batches "$PEER_BATCHES" >>"$RUNS"
    "$TRAINER" bench loader "${common[@]}" --path device --threads "$t" --batches "$DEVICE_BATCHES" >>"$RUNS"
    "$TRAINER" bench loader "${common[@]}" --path read --threads "$t" --batches "$RUST_BATCHES" >>"$RUNS"
  done
  "$TRAINER" bench loader --data "$DATA" --batch "$BATCH" --path kernels --batches 8 >>"$RUNS"
done

[[ -n ${RUNS_OUT:-} ]] && cp "$RUNS" "$RUNS_OUT"
echo "source: $SOURCE; load average (1/5/15 min) at start: $LOAD0, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$RUNS" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) if xs else float("nan")
groups = {}
for r in runs:
    groups.setdefault((r["impl"], r["path"], r["threads"]), []).append(r)
peer = {t: med([r["imgs_per_cpu_s"] for r in rs]) for (i, p, t), rs in groups.items() if i == "python"}
print("| pipeline | threads | runs | images/run | wall images/s | images per CPU-second (per core) | × scDINO per core | cores for 1,700 images/s |")
print("|---|---|---|---|---|---|---|---|")
names = {("rust", "cpu"): "ours, CPU path", ("rust", "device"): "ours, device path on CPU",
         ("rust", "read"): "ours, device path: worker part (read + min–max)",
         ("rust", "kernels"): "ours, CPU augmentation kernels alone (1 thread, no I/O)",
         ("python", "scdino"): "scDINO peer (tifffile + torchvision, DataLoader)"}
order = [("python", "scdino"), ("rust", "cpu"), ("rust", "device"), ("rust", "read"), ("rust", "kernels")]
for key in order:
    for (i, p, t), rs in sorted(groups.items(), key=lambda kv: kv[0][2]):
        if (i, p) != key:
            continue
        per_core = med([r["imgs_per_cpu_s"] for r in rs])
        ref = peer.get(t, peer.get(1))
        print(f"| {names[key]} | {t} | {len(rs)} | {rs[0]['images']} | {med([r['imgs_per_s'] for r in rs]):.1f} "
              f"| {per_core:.1f} | {per_core / ref:.1f} | {1700 / per_core:.1f} |")
PYEOF
