#!/usr/bin/env bash
# Reading + decoding throughput of one training epoch from packed shards vs the loose TIFFs,
# on the same machine in one invocation: `trainer data read-bench` reads (and decodes to
# C×H×W f32) every training sample of a synthetic dataset (`trainer synth`, 8 classes of
# 50×50×5 uint16 TIFFs) in the order training would, with THREADS reader threads:
#   loose        data.format: folder, data.order: exact (scDINO's permutation, one file per image)
#   shards-exact packed, data.order: exact (same permutation, pread at the index's offsets)
#   shards-seq   packed, data.order: shard_sequential, shuffle_buffer 1000 (streams shards)
# each cold (this dataset's pages evicted from the page cache with posix_fadvise(DONTNEED) on
# every file, so other users of the machine keep theirs; residency checked with fincore) and
# warm (the same read again). Cases alternate per round; medians of ROUNDS rounds.
# Caveat: "cold" is cold for this VM's page cache; a hypervisor's own cache may still serve
# the disk reads.
# usage: [RUNS_OUT=file.jsonl] bench/shards.sh [PER_CLASS] [THREADS] [ROUNDS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
TRAINER=$ROOT/target/release/trainer
for f in "$TRAINER" "$PY"; do
  [[ -x $f ]] || { echo "$f is missing: run scripts/setup.sh (venv and release build) first" >&2; exit 1; }
done
PER_CLASS=${1:-1500} THREADS=${2:-2} ROUNDS=${3:-3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RUNS=${RUNS_OUT:-$WORK/runs.jsonl}
: >"$RUNS"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

"$TRAINER" synth --out "$WORK/data" --seed 1 --classes 8 --per-class "$PER_CLASS" --donors 1 >/dev/null
cfg() { # name dataset_dir data-extra
  printf 'run:\n  name: %s\n  output_dir: %s/out\n  seed: 40\ndata:\n  dataset_dir: %s\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: ["01234"]\n%s' \
    "$1" "$WORK" "$2" "$3" >"$WORK/$1.yaml"
}
cfg loose "$WORK/data/Training" "  format: folder\n"
cfg shards-exact "$WORK/packed" "  format: shards\n  order: exact\n"
cfg shards-seq "$WORK/packed" "  format: shards\n  order: shard_sequential\n  shuffle_buffer: 1000\n"
sed -i 's/\\n/\n/g' "$WORK"/*.yaml
PACK_OUT=$("$TRAINER" data pack --config "$WORK/loose.yaml" --out "$WORK/packed" --shard-size 64M 2>/dev/null)
echo "$PACK_OUT"

evict() { # paths... : drop their pages from the page cache, print resident bytes after
  "$PY" - "$@" <<'EOF'
import os, sys
n = 0
for root in sys.argv[1:]:
    paths = [root] if os.path.isfile(root) else [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        n += 1
EOF
}
resident() { # sum of resident bytes of the files under $1 (fincore)
  find "$1" -type f -print0 | xargs -0 fincore -b -n -o RES 2>/dev/null | awk '{s += $1} END {print s + 0}'
}

for round in $(seq "$ROUNDS"); do
  for c in loose shards-exact shards-seq; do
    if [[ $c == loose ]]; then dir=$WORK/data/Training; else dir=$WORK/packed; fi
    evict "$dir"
    res=$(resident "$dir")
    "$TRAINER" data read-bench --config "$WORK/$c.yaml" --threads "$THREADS" --label "$c cold" |
      "$PY" -c "import sys, json; r = json.load(sys.stdin); r['resident_before'] = $res; r['round'] = $round; print(json.dumps(r))" >>"$RUNS"
    "$TRAINER" data read-bench --config "$WORK/$c.yaml" --threads "$THREADS" --label "$c warm" |
      "$PY" -c "import sys, json; r = json.load(sys.stdin); r['round'] = $round; print(json.dumps(r))" >>"$RUNS"
  done
done

LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
"$PY" - "$RUNS" "$THREADS" "$LOAD0" "$LOAD1" <<'EOF'
import sys, json, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["label"], []).append(r)
images = rows[0]["images"]
print(f"one epoch = {images} training images (5x50x50 uint16), {sys.argv[2]} reader threads, read + decode; "
      f"medians of {len(by[rows[0]['label']])} rounds; loadavg {sys.argv[3]} -> {sys.argv[4]}")
print(f"{'case':<20}{'images/s':>12}{'MB/s (f32)':>12}{'vs loose':>10}{'resident before (MB)':>22}")
for temp in ["cold", "warm"]:
    base = statistics.median(r["images_per_s"] for r in by[f"loose {temp}"])
    for c in ["loose", "shards-exact", "shards-seq"]:
        rs = by[f"{c} {temp}"]
        ips = statistics.median(r["images_per_s"] for r in rs)
        mbs = statistics.median(r["mb_per_s"] for r in rs)
        res = statistics.median(r.get("resident_before", 0) for r in rs) / 1e6 if temp == "cold" else float("nan")
        print(f"{c + ' ' + temp:<20}{ips:>12.0f}{mbs:>12.1f}{ips / base:>10.2f}{res:>22.1f}")
EOF
