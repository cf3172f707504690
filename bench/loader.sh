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
# Sources (`trainer bench loader --config`, opened with trainer::data::open_source):
#   local   the synthetic TIFF folder;
#   cache   s3:// on a local moto server + node-local cache, warm (`--warm` reads the timed
#           images once first: the second epoch of an s3:// + cache run);
#   shards  the folder packed with `trainer data pack`;
#   s3      s3:// on the moto server, streaming (moto runs in another process on the same
#           cores: its CPU is not counted in our per-core rate but slows the wall clock).
# Our CPU path runs over all four, our device path over local and shards; the Python peer
# reads local files only, as scDINO does (it has no shards/S3 support).
# Per core = images per CPU-second of the whole process (all threads; for Python the main
# process plus its workers), which stays meaningful on a shared machine where wall-clock
# throughput depends on what else runs. Runs alternate within each of ROUNDS rounds.
# usage: [RUNS_OUT=file.jsonl] bench/loader.sh [--source all|local] [THREADS_LIST] [ROUNDS]
#   --source local: only local files, plus the `read` and `kernels` rows (the old bench);
#   all (default): the source matrix above.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SOURCE=all
if [[ ${1:-} == --source ]]; then
  SOURCE=$2
  shift 2
fi
case $SOURCE in
  all | local) ;;
  *) echo "unknown --source $SOURCE (available: all, local)" >&2; exit 2 ;;
esac
"$ROOT/scripts/setup.sh" >/dev/null 2>&1 || "$ROOT/scripts/setup.sh"
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
TRAINER=$ROOT/target/release/trainer
read -r -a THREADS_LIST <<<"${1:-2}"
ROUNDS=${2:-2}
BATCH=32 WARMUP=2
RUST_BATCHES=${RUST_BATCHES:-$([[ $SOURCE == all ]] && echo 90 || echo 36)} DEVICE_BATCHES=${DEVICE_BATCHES:-6} PEER_BATCHES=${PEER_BATCHES:-6}
WORK=$(mktemp -d)
MOTO=
trap '[[ -n $MOTO ]] && kill $MOTO 2>/dev/null; rm -rf "$WORK"' EXIT
RUNS=$WORK/runs.jsonl
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

per_class=$(((BATCH * (WARMUP + RUST_BATCHES) + 7) / 8))
"$TRAINER" synth --out "$WORK/data" --seed 0 --per-class "$per_class" >/dev/null
DATA=$WORK/data/Training

cfg() { # dataset_dir, extra data lines
  cat <<YAML
run: {name: b, output_dir: $WORK/out, seed: 0}
data:
  dataset_dir: $1
  channel_names: [a, b, c, d, e]
  channel_combinations: ["01234"]
  object_store: {endpoint: "http://127.0.0.1:${PORT:-0}", allow_http: true, max_concurrency: 16}
$2
YAML
}
if [[ $SOURCE == all ]]; then
  # moto as bench/s3_read.sh starts it: the synth folder under s3://bench/pbmc/.
  PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$PY" "$ROOT/trainer/tests/py/moto_s3.py" "$PORT" bench pbmc "$WORK/data" >"$WORK/moto.log" 2>&1 &
  MOTO=$!
  until grep -q ready "$WORK/moto.log"; do kill -0 $MOTO 2>/dev/null || { cat "$WORK/moto.log"; exit 1; }; sleep 0.2; done
  export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench
  cfg "$DATA" "" >"$WORK/local.yaml"
  "$TRAINER" data pack --config "$WORK/local.yaml" --out "$WORK/shards" >/dev/null
  cfg "$WORK/shards" "  format: shards" >"$WORK/shards.yaml"
  cfg "s3://bench/pbmc/Training" "" >"$WORK/s3.yaml"
  cfg "s3://bench/pbmc/Training" "  cache: {dir: $WORK/nvme}" >"$WORK/cache.yaml"
fi
tag() { sed "s/^{/{\"source\":\"$1\",/" >>"$RUNS"; }

for _ in $(seq "$ROUNDS"); do
  for t in "${THREADS_LIST[@]}"; do
    common=(--batch "$BATCH" --warmup "$WARMUP" --threads "$t")
    "$TRAINER" bench loader --data "$DATA" "${common[@]}" --path cpu --batches "$RUST_BATCHES" | tag local
    "$PY" "$ROOT/bench/loader_peer.py" --data "$DATA" --batch "$BATCH" --warmup "$WARMUP" --workers "$t" \
      --batches "$PEER_BATCHES" | tag local
    "$TRAINER" bench loader --data "$DATA" "${common[@]}" --path device --batches "$DEVICE_BATCHES" | tag local
    if [[ $SOURCE == all ]]; then
      "$TRAINER" bench loader --config "$WORK/shards.yaml" "${common[@]}" --path cpu --batches "$RUST_BATCHES" | tag shards
      "$TRAINER" bench loader --config "$WORK/cache.yaml" --warm "${common[@]}" --path cpu --batches "$RUST_BATCHES" | tag cache
      "$TRAINER" bench loader --config "$WORK/s3.yaml" "${common[@]}" --path cpu --batches "$RUST_BATCHES" | tag s3
      "$TRAINER" bench loader --config "$WORK/shards.yaml" "${common[@]}" --path device --batches "$DEVICE_BATCHES" | tag shards
    else
      "$TRAINER" bench loader --data "$DATA" "${common[@]}" --path read --batches "$RUST_BATCHES" | tag local
    fi
  done
  if [[ $SOURCE == local ]]; then
    "$TRAINER" bench loader --data "$DATA" --batch "$BATCH" --path kernels --batches 8 | tag local
  fi
done

[[ -n ${RUNS_OUT:-} ]] && cp "$RUNS" "$RUNS_OUT"
echo "sources: $SOURCE; $(nproc) vCPUs (shared machine); load average (1/5/15 min) at start: $LOAD0, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$RUNS" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) if xs else float("nan")
groups = {}
for r in runs:
    groups.setdefault((r["impl"], r["path"], r["source"], r["threads"]), []).append(r)
peer = {t: med([r["imgs_per_cpu_s"] for r in rs]) for (i, p, s, t), rs in groups.items() if i == "python"}
print("| pipeline | source | threads | runs | images/run | wall images/s | images per CPU-second (per core) | × scDINO per core | cores for 1,700 images/s |")
print("|---|---|---|---|---|---|---|---|---|")
names = {("rust", "cpu"): "ours, CPU path", ("rust", "device"): "ours, device path on CPU",
         ("rust", "read"): "ours, device path: worker part (read + min–max)",
         ("rust", "kernels"): "ours, CPU augmentation kernels alone (1 thread, no I/O)",
         ("python", "scdino"): "scDINO peer (tifffile + torchvision, DataLoader)"}
order = [("python", "scdino"), ("rust", "cpu"), ("rust", "device"), ("rust", "read"), ("rust", "kernels")]
srcs = {"local": "local files", "cache": "S3 (moto) + node-local cache, warm", "shards": "packed shards",
        "s3": "S3 (moto), streaming"}
sorder = ["local", "cache", "shards", "s3"]
for key in order:
    for (i, p, s, t), rs in sorted(groups.items(), key=lambda kv: (sorder.index(kv[0][2]), kv[0][3])):
        if (i, p) != key:
            continue
        per_core = med([r["imgs_per_cpu_s"] for r in rs])
        ref = peer.get(t, peer.get(1))
        print(f"| {names[key]} | {srcs[s]} | {t} | {len(rs)} | {rs[0]['images']} | {med([r['imgs_per_s'] for r in rs]):.1f} "
              f"| {per_core:.1f} | {per_core / ref:.1f} | {1700 / per_core:.1f} |")
PYEOF
