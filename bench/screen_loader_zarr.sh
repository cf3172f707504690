#!/usr/bin/env bash
# Cells per CPU-second into the training loader from an OME-Zarr HCS plate (issue 46), the
# sibling of bench/screen_loader.sh on the same synthetic cells: scDINO's multi-crop batches
# (2×224² + 8×96², batch 32) out of each reader, no model.
#   zarr-disk  `trainer bench loader --config plate.yaml`: the plate on disk (`trainer synth
#              --layout ome-zarr`, fields chunked CHUNK px square per channel, zstd), cells
#              from its object table, each cell's box read from only the chunks it touches, in
#              training's shuffled order over all cells;
#   zarr-s3    the same plate from a moto S3 server on 127.0.0.1 (the tests' moto_s3.py);
#   cells      the per-cell TIFFs the plate was made of (`trainer synth` writes both);
#   python     bench/screen_loader_peer.py --plate: zarr-python reads the selected channels of a
#              whole field per item (NGFF metadata for wells, fields and channel labels), NumPy
#              crops around each object-table centre, scDINO's augmentation, a DataLoader over
#              shuffled fields (the peer's best case: every cell of a field from one read);
#   python-s3  the same peer on the plate in moto, through zarr's ObjectStore on obstore's
#              S3Store (zarr-python's object-store path; no s3fs in the venv).
# One loader thread/worker each; per core = cells per CPU-second of the reading process (moto's
# own CPU is not counted for either side; a `moto` line after each S3 run gives the CPU seconds
# moto spent serving it). Runs alternate within each of ROUNDS rounds.
# usage: [TRAINER=bin] bench/screen_loader_zarr.sh [ROUNDS] [PER_SITE] [CHUNK]
#   TRAINER: a trainer binary to use as it is (default: the release build, built beforehand)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${1:-2}
PER_SITE=${2:-25}
CHUNK=${3:-64}
T=${TRAINER:-${CARGO_TARGET_DIR:-$ROOT/target}/release/trainer}
[[ -x $T ]] || { echo "build first: cargo build --release" >&2; exit 1; }
PY=$ROOT/.venv/bin/python
W=$(mktemp -d /tmp/screen_loader_zarr.XXXX)
MOTO=
trap '[[ -n $MOTO ]] && kill $MOTO; rm -rf "$W"' EXIT
export OMP_WAIT_POLICY=PASSIVE
echo "load average (1/5/15 min) at start: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) vCPUs" >&2
"$T" synth --out "$W/s" --layout ome-zarr --classes 4 --per-class 600 --size 50 --channels 5 \
  --plates 1 --per-site "$PER_SITE" --chunk "$CHUNK" >/dev/null
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir "$W/bucket" && mv "$W/s/P1.zarr" "$W/bucket/" && ln -s "$W/bucket/P1.zarr" "$W/s/P1.zarr"
"$PY" "$ROOT/trainer/tests/py/moto_s3.py" "$PORT" bench pbmc "$W/bucket" >"$W/moto.log" 2>&1 &
MOTO=$!
until grep -q ready "$W/moto.log"; do kill -0 $MOTO 2>/dev/null || { cat "$W/moto.log"; exit 1; }; sleep 0.2; done
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench
cfg() { # dataset_dir
  cat <<YAML
run: {name: bench, output_dir: $W/out}
data:
  dataset_dir: $1
  channel_names: [APC, BF, DAPI, GREEN, PE]
  channel_combinations: ["01234"]
  object_store: {endpoint: "http://127.0.0.1:$PORT", region: us-east-1, allow_http: true}
  screen: {layout: ome_zarr, objects: $W/s/P1_Nuclei.csv, box_size: 50, label_column: Metadata_Well}
YAML
}
cfg "$W/s/P1.zarr" >"$W/disk.yaml"
cfg "s3://bench/pbmc/P1.zarr" >"$W/s3.yaml"
cells=$(($(wc -l <"$W/s/P1_Nuclei.csv") - 1))
echo "plate: $cells cells of 5 x 50 x 50 in fields of $PER_SITE cells, $CHUNK-px chunks" >&2
args=(--batch 32 --batches 40 --threads 1 --path cpu)
peer() { # plate args...
  (cd "$ROOT/bench" && "$PY" screen_loader_peer.py --plate "$@" --objects "$W/s/P1_Nuclei.csv" \
    --channels APC,BF,DAPI,GREEN,PE --workers 1 --batch 32 --batches 40)
}
TCK=$(getconf CLK_TCK)
moto_cpu() { sed 's/.*) //' "/proc/$MOTO/stat" | awk -v t="$TCK" '{print ($12 + $13) / t}'; }
on_moto() { # label round command...: its lines, then the CPU seconds moto spent serving it
  local label=$1 r=$2 c0; shift 2
  c0=$(moto_cpu)
  "$@" | sed "s/^/$label $r /"
  awk -v a="$c0" -v b="$(moto_cpu)" -v p="moto $r $label" \
    'BEGIN { printf "%s {\"moto_cpu_s\": %.2f}\n", p, b - a }'
}
for r in $(seq "$ROUNDS"); do
  "$T" bench loader --config "$W/disk.yaml" "${args[@]}" | sed "s/^/zarr-disk $r /"
  on_moto zarr-s3 "$r" "$T" bench loader --config "$W/s3.yaml" "${args[@]}"
  "$T" bench loader --data "$W/s/cells/Training" "${args[@]}" | sed "s/^/cells $r /"
  peer "$W/s/P1.zarr" | sed "s/^/python $r /"
  on_moto python-s3 "$r" peer s3://bench/pbmc/P1.zarr --s3-endpoint "http://127.0.0.1:$PORT"
done
echo "load average (1/5/15 min) at end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
