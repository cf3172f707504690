#!/usr/bin/env bash
# Storage side of the loader: read + decode every image (5×50×50 uint16 TIFFs, shuffled order,
# no augmentation) from local files, from S3 on a local moto server (streaming), from S3
# with the node-local cache (epoch 0 fills it, epoch 1 reads it), and from packed shards on S3
# in `shard_sequential` order without a cache, streamed in chunks (default) and by one ranged
# GET per sample (`shard_chunks_ahead: 0`). One `trainer data read-bench` JSON line per epoch;
# the table lists images/s.
# moto is a single-threaded-ish Python server, so the S3 rows measure our client against a
# slow server, not AWS; they show the overheads (listing, request concurrency, cache), not
# S3's own throughput.
# usage: bench/s3_read.sh [PER_CLASS] [WORKERS] [CONCURRENCY]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh" >/dev/null 2>&1 || "$ROOT/scripts/setup.sh"
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
T=$ROOT/target/release/trainer
PER_CLASS=${1:-250} WORKERS=${2:-2} CONC=${3:-16}
W=$(mktemp -d)
trap 'kill $MOTO 2>/dev/null || true; rm -rf "$W"' EXIT
"$T" synth --out "$W/data" --seed 1 --classes 8 --per-class "$PER_CLASS" --donors 1 >/dev/null
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$PY" "$ROOT/trainer/tests/py/moto_s3.py" "$PORT" bench pbmc "$W/data" >"$W/moto.log" 2>&1 &
MOTO=$!
until grep -q ready "$W/moto.log"; do kill -0 $MOTO 2>/dev/null || { cat "$W/moto.log"; exit 1; }; sleep 0.2; done
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench
cfg() { # dataset_dir, extra data lines, extra data.object_store keys
  cat <<YAML
run: {name: b, output_dir: $W/out, seed: 1}
data:
  dataset_dir: $1
  channel_names: [a, b, c, d, e]
  channel_combinations: ["01234"]
  num_workers: $WORKERS
  object_store: {endpoint: "http://127.0.0.1:$PORT", allow_http: true, max_concurrency: $CONC${3:-}}
$2
YAML
}
cfg "$W/data/Training" "" >"$W/local.yaml"
cfg "s3://bench/pbmc/Training" "" >"$W/s3.yaml"
cfg "s3://bench/pbmc/Training" "  cache: {dir: $W/nvme}" >"$W/cache.yaml"
"$T" data pack --config "$W/local.yaml" --out s3://bench/packed --shard-size 8M \
  --staging "$W/staging" >/dev/null 2>"$W/pack.log" || { cat "$W/pack.log"; exit 1; }
SEQ="  format: shards
  order: shard_sequential
  shuffle_buffer: 256"
cfg "s3://bench/packed" "$SEQ" >"$W/chunked.yaml"
cfg "s3://bench/packed" "$SEQ" ", shard_chunks_ahead: 0" >"$W/persample.yaml"
echo "| source | images | workers | S3 GETs in flight | epoch 0 imgs/s | epoch 1 imgs/s |"
echo "|---|---|---|---|---|---|"
for kind in local s3 cache chunked persample; do
  out=$("$T" data read-bench --config "$W/$kind.yaml" --epochs 2)
  "$PY" - "$kind" "$CONC" "$out" <<'PYEOF'
import json, sys
kind, conc, out = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [json.loads(l) for l in out.splitlines()]
name = {"local": "local files", "s3": "S3 (moto), streaming", "cache": "S3 (moto) + node-local cache",
        "chunked": "S3 (moto) packed shards, shard_sequential, chunk GETs",
        "persample": "S3 (moto) packed shards, shard_sequential, a ranged GET per sample"}[kind]
print(f"| {name} | {rows[0]['images']} | {rows[0]['threads']} | {conc if kind != 'local' else '-'} | {rows[0]['images_per_s']:.0f} | {rows[1]['images_per_s']:.0f} |")
PYEOF
done
