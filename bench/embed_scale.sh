#!/usr/bin/env bash
# `trainer embed` at screen scale: N image paths (default 1,000,000) in a plate/well layout,
# embedded once without interruption and once killed with SIGKILL halfway and rerun. Reports,
# per size, the wall time, images/s and the peak resident memory (GNU time), and checks that
# the resumed table is byte-identical to the uninterrupted one and has exactly N rows, N
# distinct paths and no error rows.
#
# The N paths are symbolic links (`{Plate}/{Well}/{Cell}.tiff`, 1000 wells of 1000 cells) to
# the DISTINCT images of a `trainer synth` dataset, cycled: a million real 50×50×5 TIFFs would
# need 25 GB here. Every path is listed, opened, read, decoded, prepared and embedded as its own
# image, but the file contents repeat and sit in the page cache, so this measures the embedding
# machinery (listing, metadata parsing, parts, manifest, merge, resume, memory) and the compute,
# not a storage system's throughput. The model is small on purpose (vit_tiny, patch 16, images
# resized to 32 px: 4 patches) so that a million images fit a 2-core machine's afternoon.
# usage: bench/embed_scale.sh [N] [DISTINCT] [SIZES_FOR_MEMORY...]
#   e.g. bench/embed_scale.sh 1000000 10000 10000 100000
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/bench/kill_and_resume.sh"
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
TRAINER=${TRAINER:-${CARGO_TARGET_DIR:-$ROOT/target}/release/trainer}
[[ -x $TRAINER ]] || { echo "build first: cargo build --release" >&2; exit 1; }
N=${1:-1000000} DISTINCT=${2:-10000}
shift 2 || true
SMALLER=("$@")
THREADS=${THREADS:-2} READERS=${READERS:-2} BATCH=${BATCH:-256} PART=${PART:-1024}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$WORK"' EXIT
echo "work dir: $WORK; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

cat >"$WORK/f.yaml" <<YAML
run: {name: embedscale, output_dir: $WORK/out, seed: 40}
data: {dataset_dir: $WORK/data/Training, channel_names: [APC, BF, DAPI, GREEN, PE], channel_combinations: ["01234"], num_workers: 1}
model: {name: scaleViT, arch: vit_tiny, patch_size: 16, out_dim: 256}
train: {epochs: 1, warmup_epochs: 0, batch_size_per_gpu: 2, precision: fp32}
augment: {global_crop_size: 32, local_crop_size: 16, local_crops_number: 2}
downstream: {features: {batch_size_per_gpu: $BATCH, resize_length: 32}}
YAML
PER_CLASS=$(((DISTINCT + 7) / 8))
[[ -d $WORK/data ]] || "$TRAINER" synth --out "$WORK/data" --seed 0 --per-class "$PER_CLASS" >/dev/null
CKPT=$WORK/out/embedscale/scDINO_ViTs/scaleViT_channel_APC_BF_DAPI_GREEN_PE/checkpoint.safetensors
[[ -f $CKPT ]] || "$TRAINER" train --config "$WORK/f.yaml" --max-steps 1 >/dev/null 2>&1

# The screen: N links, and a list CSV of the first n for each smaller size.
"$PY" - "$WORK" "$N" "${SMALLER[@]}" <<'PYEOF'
import os, sys, glob
work, n, smaller = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3:]]
screen = os.path.join(work, "screen")
marker = os.path.join(work, "screen.n")
if os.path.exists(screen) and (not os.path.exists(marker) or open(marker).read() != str(n)):
    import shutil
    shutil.rmtree(screen)  # a screen of another size: its extra links would be embedded too
files = sorted(glob.glob(os.path.join(work, "data", "Training", "**", "*.tif*"), recursive=True))
paths = []
for i in range(n):
    rel = f"P{i // 1_000_000:02d}/W{(i // 1000) % 1000:03d}/c{i % 1000:03d}.tiff"
    paths.append(rel)
    dst = os.path.join(screen, rel)
    if i % 1000 == 0:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
    if not os.path.lexists(dst):
        os.symlink(files[i % len(files)], dst)
with open(marker, "w") as f:
    f.write(str(n))
for m in smaller:
    with open(os.path.join(work, f"list{m}.csv"), "w") as f:
        f.write("path\n")
        f.writelines(p + "\n" for p in paths[:m])
print(f"screen: {n} paths over {len(files)} distinct images")
PYEOF

# `exec`: the background job below must BE the trainer, so that its SIGKILL reaches the
# trainer (killing a subshell leaves its child running).
embed() { # out [extra args...]
  local out=$1
  shift
  exec env OMP_NUM_THREADS="$THREADS" "$TRAINER" embed --checkpoint "$CKPT" --images "$WORK/screen" \
    --path-pattern '{Plate}/{Well}/{Cell}.tiff' --out "$out" --batch-size "$BATCH" \
    --readers "$READERS" --part-size "$PART" --device cpu "$@"
}
# GNU time runs a program, not a shell function: it runs this script's `embed` through bash.
export -f embed
export THREADS TRAINER CKPT WORK BATCH READERS PART
timed() { # label n out [extra args...]: appends a JSON line to $WORK/runs.jsonl
  local label=$1 n=$2 out=$3
  shift 3
  rm -rf "$out" "$out.parts" "${out%.parquet}.errors.parquet"
  /usr/bin/time -f '%e %M' -o "$WORK/time.txt" bash -c 'embed "$@"' _ "$out" "$@" >"$WORK/$label.log" 2>&1
  read -r wall rss_kb <"$WORK/time.txt"
  echo "{\"run\": \"$label\", \"images\": $n, \"wall_s\": $wall, \"max_rss_mib\": $((rss_kb / 1024))}" |
    tee -a "$WORK/runs.jsonl"
}
for m in "${SMALLER[@]}"; do timed "n$m" "$m" "$WORK/n$m.parquet" --list "$WORK/list$m.csv"; done
# UNINTERRUPTED=0 skips the uninterrupted run of all N (half the time): the resumed table is
# then checked against the largest smaller run's table on its rows.
[[ ${UNINTERRUPTED:-1} == 0 ]] || timed full "$N" "$WORK/full.parquet"

# Killed halfway (by finished parts), then rerun with the same command.
OUT=$WORK/resumed.parquet
rm -rf "$OUT" "$OUT.parts"
PARTS=$(((N + PART - 1) / PART))
kill_halfway_and_rerun images "$N" "$OUT" "$PARTS" "$OUT"
if [[ -f $WORK/full.parquet ]]; then
  cmp "$WORK/full.parquet" "$OUT" && echo "resumed table is byte-identical to the uninterrupted one"
fi

PART=$PART "$PY" - "$WORK" "$N" <<'PYEOF'
import json, os, sys
import pyarrow.parquet as pq
work, n = sys.argv[1], int(sys.argv[2])
t = pq.read_table(os.path.join(work, "resumed.parquet"), columns=["Metadata_ImagePath", "Metadata_Well"])
paths = t.column("Metadata_ImagePath").to_pylist()
assert len(paths) == n and len(set(paths)) == n, (len(paths), len(set(paths)))
assert t.column("Metadata_Well").null_count == 0
errors = os.path.join(work, "resumed.errors.parquet")
assert not os.path.exists(errors) or pq.read_metadata(errors).num_rows == 0
print(f"resumed table: {n} rows, {n} distinct paths, no nulls in Metadata_Well, no error rows")
import re
smaller = sorted(int(m.group(1)) for m in map(re.compile(r"n(\d+)\.parquet").fullmatch, os.listdir(work)) if m)
if smaller:
    m = smaller[-1]
    head = pq.read_table(os.path.join(work, "resumed.parquet")).slice(0, m)
    ref = pq.read_table(os.path.join(work, f"n{m}.parquet"))
    keep = [c for c in ref.column_names if c != "Metadata_Checkpoint"]
    assert head.select(keep).equals(ref.select(keep)), "the resumed table's first rows differ from the smaller run's"
    print(f"its first {m} rows equal the {m}-image run's table (metadata and features, bit for bit)")
runs = [json.loads(l) for l in open(os.path.join(work, "runs.jsonl"))]
print("| run | images in the table | images embedded by this process | wall s | embedded images/s | peak RSS MiB |")
print("|---|---|---|---|---|---|")
part = int(os.environ.get("PART", "1024"))
for r in runs:
    done = r["images"] - min(r.get("parts_kept", 0) * part, r["images"])
    print(f"| {r['run']} | {r['images']} | {done} | {r['wall_s']:.0f} | {done / r['wall_s']:.0f} | {r['max_rss_mib']} |")
PYEOF
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
