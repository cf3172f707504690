#!/usr/bin/env bash
# `trainer embed` vs a PyTorch peer (bench/embed_peer.py: scDINO's compute_CLS_features loop, a
# torch DataLoader over the same folder) on every image of a synthetic dataset (`trainer synth`,
# 8 classes of 50×50×5 uint16 TIFFs), vit_small patch 16, resize 224, batches of 24, same
# weights (the teacher of a `trainer train --max-steps 1` checkpoint) and the mean/std it
# records. Runs alternate R,P for ROUNDS rounds; medians per side. Fails unless the features
# of the same images agree. Whole processes timed (start, listing, reads, preprocessing,
# forward, Parquet written).
# usage: [RUNS_OUT=file.jsonl] bench/embed.sh [PER_CLASS] [THREADS] [WORKERS] [ROUNDS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
PER_CLASS=${1:-64} THREADS=${2:-2} WORKERS=${3:-2} ROUNDS=${4:-2}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RUNS=$WORK/runs.jsonl
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
cat >"$WORK/f.yaml" <<YAML
run: {name: embedbench, output_dir: $WORK/out, seed: 40}
data: {dataset_dir: $WORK/data/Training, channel_names: [APC, BF, DAPI, GREEN, PE], channel_combinations: ["01234"], num_workers: 1}
model: {name: benchViT, arch: vit_small, patch_size: 16, out_dim: 1024}
train: {epochs: 1, warmup_epochs: 0, batch_size_per_gpu: 2, precision: fp32}
augment: {global_crop_size: 96, local_crop_size: 48, local_crops_number: 2}
downstream: {features: {batch_size_per_gpu: 24, resize_length: 224}}
YAML
"$TRAINER" synth --out "$WORK/data" --seed 0 --per-class "$PER_CLASS" >/dev/null
"$TRAINER" train --config "$WORK/f.yaml" --max-steps 1 >/dev/null 2>&1
CKPT=$WORK/out/embedbench/scDINO_ViTs/benchViT_channel_APC_BF_DAPI_GREEN_PE/checkpoint.safetensors
for _ in $(seq "$ROUNDS"); do
  rm -rf "$WORK/ours.parquet" "$WORK/ours.parquet.parts"
  t0=$(date +%s.%N)
  OMP_NUM_THREADS=$THREADS "$TRAINER" embed --checkpoint "$CKPT" --images "$WORK/data/Training" \
    --out "$WORK/ours.parquet" --batch-size 24 --readers "$WORKERS" --device cpu >/dev/null
  t1=$(date +%s.%N)
  n=$(find "$WORK/data/Training" -name '*.tif*' | wc -l)
  echo "{\"impl\": \"rust\", \"threads\": $THREADS, \"workers\": $WORKERS, \"images\": $n, \"wall_s\": $(echo "$t1 - $t0" | bc)}" >>"$RUNS"
  t0=$(date +%s.%N)
  "$PY" "$ROOT/bench/embed_peer.py" --checkpoint "$CKPT" --images "$WORK/data/Training" \
    --batch 24 --threads "$THREADS" --workers "$WORKERS" --out "$WORK/peer.parquet" \
    --compare "$WORK/ours.parquet" >"$WORK/peer.json"
  t1=$(date +%s.%N)
  with_wall "$WORK/peer.json" "$t0" "$t1" >>"$RUNS"
done
[[ -n ${RUNS_OUT:-} ]] && cp "$RUNS" "$RUNS_OUT"
echo "load average (1/5/15 min) at start: $LOAD0, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$RUNS" <<'PYEOF'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
rust = [r for r in runs if r["impl"] == "rust"]
py = [r for r in runs if r["impl"] == "pytorch"]
for r in py:
    assert r["images"] == rust[0]["images"], r
    assert r["min_cosine"] > 0.9999, f"features differ: {r}"
med = lambda v: sorted(v)[len(v) // 2]
n = rust[0]["images"]
rw, pw = med([r["wall_s"] for r in rust]), med([r["wall_s"] for r in py])
print(f"features agree: max |diff| {max(r['max_abs_diff'] for r in py):.2e}, min cosine {min(r['min_cosine'] for r in py):.7f}")
print("| images | batch | threads/readers (both) | runs/side | Rust wall s | PyTorch wall s | Rust imgs/s | PyTorch imgs/s | Rust/PyTorch |")
print("|---|---|---|---|---|---|---|---|---|")
print(f"| {n} | {py[0]['batch']} | {rust[0]['threads']}/{rust[0]['workers']} | {len(rust)} | {rw:.1f} | {pw:.1f} | {n / rw:.2f} | {n / pw:.2f} | {pw / rw:.3f} |")
print("raw wall s: rust " + ", ".join(f"{r['wall_s']:.1f}" for r in rust) + "; pytorch " + ", ".join(f"{r['wall_s']:.1f}" for r in py))
PYEOF
