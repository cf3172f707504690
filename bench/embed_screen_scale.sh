#!/usr/bin/env bash
# `trainer embed --screen` at screen scale: N cells (default 1,000,000) of a screen stored as
# fields of view (a 16-bit TIFF per site and channel, a CellProfiler LoadData table, an object
# table), embedded at smaller sizes for memory and at N killed with SIGKILL halfway and rerun.
# Reports, per run, the wall time, cells/s and the peak resident memory (GNU time), and checks
# that the resumed table has exactly N rows, N distinct (plate, well, site, object) keys, no
# null metadata and no error rows, and that its first rows equal the largest smaller run's.
#
# The screen: `trainer synth --layout fov --per-site CELLS_PER_SITE` writes a small real screen
# once (DISTINCT full sites of CELLS_PER_SITE cells, about 1050×1050 px at 100 cells a site); then a
# LoadData table of N / CELLS_PER_SITE rows, each a distinct site (`Metadata_Plate` P00.., 1000
# sites a plate, `Metadata_Well` W000..W099, `Metadata_Site` 1..10), whose
# `PathName_<Ch>`/`FileName_<Ch>` name the distinct sites' files cycled, and an object table
# listing each row's cells (its source site's centres, joined by the row's plate/well/site). The
# smaller sizes are the first rows of the same layout, so their cells are the first cells of N.
# What this measures: the listing (LoadData and object table joined, cells sorted), each site
# read and decoded once per pass (the embed log does not count site reads: `strace -e openat`
# does), the crops, the embedding, parts,
# manifest, merge and resume, and the memory of all that. What it does not: storage throughput
# (the site files repeat and sit in the page cache). The model is small on purpose (vit_tiny,
# patch 16, cells resized to 32 px) so that a million cells fit a 2-core machine.
# usage: bench/embed_screen_scale.sh [N] [DISTINCT_SITES] [SIZES_FOR_MEMORY...]
#   e.g. bench/embed_screen_scale.sh 1000000 96 10000 100000
#   (N and the sizes multiples of CELLS_PER_SITE, default 100)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/bench/kill_and_resume.sh"
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
TRAINER=${TRAINER:-${CARGO_TARGET_DIR:-$ROOT/target}/release/trainer}
[[ -x $TRAINER ]] || { echo "build first: cargo build --release" >&2; exit 1; }
N=${1:-1000000} DISTINCT=${2:-96}
shift 2 || true
SMALLER=("$@")
CELLS_PER_SITE=${CELLS_PER_SITE:-100}
THREADS=${THREADS:-2} READERS=${READERS:-2} BATCH=${BATCH:-256} PART=${PART:-1024}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$WORK"' EXIT
echo "work dir: $WORK; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# The small real screen: 8 classes (one well each) × 2 plates; per class 2 × sites-per-well full
# sites of CELLS_PER_SITE cells, so every site is full.
PER_WELL=$(((DISTINCT + 15) / 16))
PER_CLASS=$((2 * PER_WELL * CELLS_PER_SITE))
[[ -f $WORK/fov/load_data.csv ]] ||
  "$TRAINER" synth --out "$WORK/fov" --layout fov --seed 0 --per-class "$PER_CLASS" \
    --per-site "$CELLS_PER_SITE" >/dev/null

# The checkpoint, trained as bench/embed_scale.sh trains its own (one step, on the per-cell set
# the screen was made of).
train_yaml() { # data lines
  cat <<YAML
run: {name: embedscreen, output_dir: $WORK/out, seed: 40}
$1
model: {name: scaleViT, arch: vit_tiny, patch_size: 16, out_dim: 256}
train: {epochs: 1, warmup_epochs: 0, batch_size_per_gpu: 2, precision: fp32}
augment: {global_crop_size: 32, local_crop_size: 16, local_crops_number: 2}
downstream: {features: {batch_size_per_gpu: $BATCH, resize_length: 32}}
YAML
}
train_yaml "data: {dataset_dir: $WORK/fov/cells/Training, channel_names: [APC, BF, DAPI, GREEN, PE], channel_combinations: [\"01234\"], num_workers: 1}" >"$WORK/f.yaml"
CKPT=$WORK/out/embedscreen/scDINO_ViTs/scaleViT_channel_APC_BF_DAPI_GREEN_PE/checkpoint.safetensors
[[ -f $CKPT ]] || "$TRAINER" train --config "$WORK/f.yaml" --max-steps 1 >/dev/null 2>&1

# The screens: one folder per size, each a LoadData table, an object table and a config.
"$PY" - "$WORK" "$CELLS_PER_SITE" "$DISTINCT" "$N" "${SMALLER[@]}" <<'PYEOF'
import csv, os, sys
work, per_site, distinct = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sizes = [int(s) for s in sys.argv[4:]]
fov = os.path.join(work, "fov")
rows = list(csv.DictReader(open(os.path.join(fov, "load_data.csv"))))
objs = {}
for o in csv.DictReader(open(os.path.join(fov, "Nuclei.csv"))):
    objs.setdefault(o["ImageNumber"], []).append(o)
full = [r for r in rows if len(objs.get(r["ImageNumber"], [])) == per_site][:distinct]
assert len(full) == distinct, f"{len(full)} full sites of {per_site} cells, asked for {distinct}"
chans = [c[len("FileName_"):] for c in rows[0] if c.startswith("FileName_")]
chans = [c for c in chans if f"PathName_{c}" in rows[0]]
for n in sizes:
    assert n % per_site == 0, f"{n} is not a multiple of {per_site} cells a site"
    d = os.path.join(work, f"screen{n}")
    if os.path.exists(os.path.join(d, "done")):
        continue
    os.makedirs(d, exist_ok=True)
    head = ["ImageNumber", "Metadata_Plate", "Metadata_Well", "Metadata_Site", "Metadata_Treatment"]
    for c in chans:
        head += [f"FileName_{c}", f"PathName_{c}"]
    with open(os.path.join(d, "load_data.csv"), "w", newline="") as lf, \
         open(os.path.join(d, "Nuclei.csv"), "w", newline="") as of:
        lw, ow = csv.writer(lf), csv.writer(of)
        lw.writerow(head)
        ow.writerow(["ImageNumber", "ObjectNumber", "Metadata_Plate", "Metadata_Well",
                     "Metadata_Site", "Nuclei_Location_Center_X", "Nuclei_Location_Center_Y"])
        for s in range(n // per_site):
            src = full[s % distinct]
            plate, well, site = f"P{s // 1000:02d}", f"W{(s // 10) % 100:03d}", str(s % 10 + 1)
            row = [s + 1, plate, well, site, src["Metadata_Treatment"]]
            for c in chans:
                row += [src[f"FileName_{c}"], os.path.join(fov, src[f"PathName_{c}"])]
            lw.writerow(row)
            for o in objs[src["ImageNumber"]]:
                ow.writerow([s + 1, o["ObjectNumber"], plate, well, site,
                             o["Nuclei_Location_Center_X"], o["Nuclei_Location_Center_Y"]])
    open(os.path.join(d, "done"), "w").close()
    print(f"screen{n}: {n // per_site} sites over {distinct} distinct ones, {n} cells")
PYEOF
for n in "${SMALLER[@]}" "$N"; do
  train_yaml "data:
  dataset_dir: $WORK/screen$n/load_data.csv
  channel_names: [APC, BF, DAPI, GREEN, PE]
  channel_combinations: [\"01234\"]
  num_workers: 1
  screen: {layout: load_data, objects: $WORK/screen$n/Nuclei.csv, box_size: 50}" >"$WORK/screen$n/screen.yaml"
done

# `exec`: the background job below must BE the trainer, so that its SIGKILL reaches the
# trainer (killing a subshell leaves its child running).
embed() { # n out
  exec env OMP_NUM_THREADS="$THREADS" "$TRAINER" embed --checkpoint "$CKPT" \
    --screen "$WORK/screen$1/screen.yaml" --out "$2" --batch-size "$BATCH" \
    --readers "$READERS" --part-size "$PART" --device cpu
}
# GNU time runs a program, not a shell function: it runs this script's `embed` through bash.
export -f embed
export THREADS TRAINER CKPT WORK BATCH READERS PART
timed() { # label n out: appends a JSON line to $WORK/runs.jsonl
  local label=$1 n=$2 out=$3
  rm -rf "$out" "$out.parts" "${out%.parquet}.errors.parquet"
  /usr/bin/time -f '%e %M' -o "$WORK/time.txt" bash -c 'embed "$@"' _ "$n" "$out" >"$WORK/$label.log" 2>&1
  read -r wall rss_kb <"$WORK/time.txt"
  echo "{\"run\": \"$label\", \"cells\": $n, \"wall_s\": $wall, \"max_rss_mib\": $((rss_kb / 1024))}" |
    tee -a "$WORK/runs.jsonl"
}
for m in "${SMALLER[@]}"; do timed "n$m" "$m" "$WORK/n$m.parquet"; done

# Killed halfway (by finished parts), then rerun with the same command.
OUT=$WORK/resumed.parquet
rm -rf "$OUT" "$OUT.parts" "${OUT%.parquet}.errors.parquet"
PARTS=$(((N + PART - 1) / PART))
kill_halfway_and_rerun cells "$N" "$OUT" "$PARTS" "$N" "$OUT"

PART=$PART CELLS_PER_SITE=$CELLS_PER_SITE "$PY" - "$WORK" "$N" <<'PYEOF'
import json, os, re, sys
import pyarrow.parquet as pq
work, n = sys.argv[1], int(sys.argv[2])
keys = ["Metadata_Plate", "Metadata_Well", "Metadata_Site", "Metadata_ObjectNumber"]
t = pq.read_table(os.path.join(work, "resumed.parquet"))
meta = [c for c in t.column_names if c.startswith("Metadata_")]
assert t.num_rows == n, (t.num_rows, n)
k = t.select(keys).to_pandas()
distinct = len(k.drop_duplicates())
assert distinct == n, (distinct, n)
nulls = {c: t.column(c).null_count for c in meta if t.column(c).null_count}
assert not nulls, nulls
errors = os.path.join(work, "resumed.errors.parquet")
assert not os.path.exists(errors) or pq.read_metadata(errors).num_rows == 0
print(f"resumed table: {n} rows, {n} distinct (plate, well, site, object) keys, "
      f"no null in {len(meta)} Metadata_* columns, no error rows")
smaller = sorted(int(m.group(1)) for m in map(re.compile(r"n(\d+)\.parquet").fullmatch, os.listdir(work)) if m)
if smaller:
    m = smaller[-1]
    head = t.slice(0, m)
    ref = pq.read_table(os.path.join(work, f"n{m}.parquet"))
    # the image path names the table (screen{n}/load_data.csv): compared without that folder
    keep = [c for c in ref.column_names if c not in ("Metadata_Checkpoint", "Metadata_ImagePath")]
    assert head.select(keep).equals(ref.select(keep)), "the resumed table's first rows differ from the smaller run's"
    strip = lambda col: [p.split("/load_data.csv", 1)[1] for p in col.to_pylist()]
    assert strip(head.column("Metadata_ImagePath")) == strip(ref.column("Metadata_ImagePath"))
    print(f"its first {m} rows equal the {m}-cell run's table (metadata and features, bit for bit)")
part = int(os.environ["PART"])
per_site = int(os.environ["CELLS_PER_SITE"])
runs = [json.loads(l) for l in open(os.path.join(work, "runs.jsonl"))]
print("| run | cells in the table | sites | parts | cells embedded by this process | wall s | cells/s | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|")
for r in runs:
    c = r["cells"]
    done = c - min(r.get("parts_kept", 0) * part, c)
    print(f"| {r['run']} | {c} | {c // per_site} | {-(-c // part)} | {done} | {float(r['wall_s']):.0f} | "
          f"{done / float(r['wall_s']):.0f} | {r['max_rss_mib']} |")
PYEOF
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
