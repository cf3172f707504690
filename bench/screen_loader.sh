#!/usr/bin/env bash
# Cells per CPU-second into the training loader from a screen stored as fields of view (issue
# 46): the same cells read four ways, scDINO's multi-crop batches (2×224² + 8×96², batch 32)
# out of each, no model.
#   fov     `trainer bench loader --config screen.yaml`: the LoadData table + object table,
#           cells cut from their sites (site cache of `data.screen.site_cache` sites), in
#           training's default order (`data.order: exact`, a shuffle over all cells);
#   sites   the same with `data.order: sites` (sites shuffled, cells shuffled within windows
#           of half the site cache: each site decoded once per epoch);
#   packed  the same screen after `trainer data pack` (the documented path for long runs);
#   cells   the per-cell TIFFs the synthetic screen was made of (`trainer synth` writes both);
#   python  bench/screen_loader_peer.py: DeepProfiler's way (a Dataset over sites, tifffile +
#           NumPy crop around each centre, scDINO's augmentation, DataLoader over shuffled sites).
# One loader thread/worker each (per core = cells per CPU-second of the whole process); runs
# alternate within each of ROUNDS rounds.
# usage: bench/screen_loader.sh [ROUNDS] [PER_SITE]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${1:-2}
PER_SITE=${2:-25}
T=$ROOT/target/release/trainer
W=$(mktemp -d /tmp/screen_loader.XXXX)
trap 'rm -rf "$W"' EXIT
export OMP_WAIT_POLICY=PASSIVE
"$T" synth --out "$W/s" --layout fov --classes 4 --per-class 600 --size 50 --channels 5 \
  --plates 2 --per-site "$PER_SITE" >/dev/null
cat >"$W/screen.yaml" <<EOF
run: {name: bench, output_dir: $W/out}
data:
  dataset_dir: $W/s/load_data.csv
  channel_names: [APC, BF, DAPI, GREEN, PE]
  channel_combinations: ["01234"]
  screen: {objects: $W/s/Nuclei.csv, box_size: 50, label_column: Metadata_Treatment}
EOF
"$T" data pack --config "$W/screen.yaml" --out "$W/packed" >/dev/null 2>&1
sed "s|dataset_dir: .*|dataset_dir: $W/packed|; /screen:/d" "$W/screen.yaml" >"$W/packed.yaml"
sed "s|^data:|data:\n  order: sites|" "$W/screen.yaml" >"$W/sites.yaml"
sites=$(($(wc -l <"$W/s/load_data.csv") - 1))
echo "screen: $sites sites of $PER_SITE cells (5 x $((PER_SITE > 0 ? 50 : 0))-px cells, sites $(python3 -c "import math;g=math.ceil(math.sqrt($PER_SITE));print(g*100+50)") px square)" >&2
args=(--batch 32 --batches 40 --threads 1 --path cpu)
for r in $(seq "$ROUNDS"); do
  "$T" bench loader --config "$W/screen.yaml" "${args[@]}" | sed "s/^/fov $r /"
  "$T" bench loader --config "$W/sites.yaml" "${args[@]}" | sed "s/^/sites $r /"
  "$T" bench loader --config "$W/packed.yaml" "${args[@]}" | sed "s/^/packed $r /"
  "$T" bench loader --data "$W/s/cells/Training" "${args[@]}" | sed "s/^/cells $r /"
  (cd "$ROOT/bench" && python screen_loader_peer.py --load-data "$W/s/load_data.csv" \
    --objects "$W/s/Nuclei.csv" --channels APC,BF,DAPI,GREEN,PE --workers 1 --batch 32 \
    --batches 40) | sed "s/^/python $r /"
done
