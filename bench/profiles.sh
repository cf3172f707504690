#!/usr/bin/env bash
# Features as scDINO's %.18e CSV against the Parquet profile table, at scDINO's full PBMC size
# (90,851 images × 384, vit_small): `trainer bench profiles` writes both (timed) and reads
# both back (timed, checked bit for bit), then bench/profiles.py reads the same files with
# numpy/pandas/polars and writes the same matrix as scDINO (np.savetxt) and pandas
# (to_parquet) do. Alternates trainer, peer for ROUNDS rounds; prints each run's JSON.
# With BEFORE=/path/to/an/older/trainer, each round also runs that binary (a change's
# before/after in the same rounds).
# usage: [BEFORE=trainer-old] bench/profiles.sh [ROWS] [DIM] [ROUNDS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
TRAINER=$ROOT/target/release/trainer
[[ -x $TRAINER ]] || { echo "build first: cargo build --release (or scripts/setup.sh)" >&2; exit 1; }
ROWS=${1:-90851} DIM=${2:-384} ROUNDS=${3:-3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  [[ -z ${BEFORE:-} ]] ||
    echo "before  $r: $("$BEFORE" bench profiles --rows "$ROWS" --dim "$DIM" --out "$WORK")"
  echo "trainer $r: $("$TRAINER" bench profiles --rows "$ROWS" --dim "$DIM" --out "$WORK")"
  echo "peer    $r: $("$PY" "$ROOT/bench/profiles.py" "$WORK")"
done
ls -l "$WORK"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
