#!/usr/bin/env bash
# Rust (`trainer features`) vs PyTorch (bench/features.py, scDINO's compute_CLS_features work):
# CLS features of the held-out split of a synthetic dataset (`trainer synth`, 8 classes of
# 50×50×5 uint16 TIFFs), vit_small patch 16, images resized to 224 (bilinear), normalised with
# the dataset mean/std, batches of 24 (scDINO's batch_size_per_gpu), CLS token, L2 norm, CSV
# written. Same weights on both sides: the teacher backbone of a checkpoint made by
# `trainer train --max-steps 1` (read by the peer from our safetensors file). Same images in the
# same order (the peer reads the image_paths.csv ours wrote). Same thread count. Runs alternate
# R,P,R,P,... for ROUNDS rounds; medians per side. Fails unless the features agree (cosine).
# Timings: wall clock of each whole process (start, checkpoint load, TIFF reads, preprocessing,
# forward, writing features CSV (+ our bundle/labels/paths)); the peer also reports its
# in-process split (torch import, setup, preprocess, forward, CSV write).
# usage: [RUNS_OUT=file.jsonl] bench/features.sh [PER_CLASS] [THREADS] [ROUNDS]
# (held-out images = 20 % of 8 × PER_CLASS; default 320 -> 512 images)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
PER_CLASS=${1:-320} THREADS=${2:-2} ROUNDS=${3:-2}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RUNS=$WORK/runs.jsonl
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

cat >"$WORK/f.yaml" <<YAML
run:
  name: featbench
  output_dir: $WORK/out
  seed: 40
data:
  dataset_dir: $WORK/data/Training
  label_folder_depth: 0
  train_fraction: 0.8
  channel_names: [APC, BF, DAPI, GREEN, PE]
  channel_combinations: ["01234"]
  num_workers: 1
model:
  name: benchViT
  arch: vit_small
  patch_size: 16
  out_dim: 1024
train:
  epochs: 1
  warmup_epochs: 0
  batch_size_per_gpu: 2
  precision: fp32
augment:
  global_crop_size: 96
  local_crop_size: 48
  local_crops_number: 2
downstream:
  features:
    batch_size_per_gpu: 24
    resize_length: 224
YAML
# Untimed preparation: data, mean/std, a checkpoint (one training step).
"$TRAINER" synth --out "$WORK/data" --seed 0 --per-class "$PER_CLASS" >/dev/null
"$TRAINER" mean-std --config "$WORK/f.yaml" >/dev/null 2>&1
"$TRAINER" train --config "$WORK/f.yaml" --max-steps 1 >/dev/null 2>&1
RUN=$WORK/out/featbench
CKPT=$RUN/scDINO_ViTs/benchViT_channel_APC_BF_DAPI_GREEN_PE/checkpoint.safetensors
AN=$RUN/benchViT_channel_APC_BF_DAPI_GREEN_PE_analyses

for _ in $(seq "$ROUNDS"); do
  rm -rf "$AN"
  t0=$(date +%s.%N)
  "$TRAINER" features --config "$WORK/f.yaml" --checkpoint "$CKPT" --threads "$THREADS" >/dev/null
  t1=$(date +%s.%N)
  n=$(wc -l <"$AN/image_paths.csv")
  echo "{\"impl\": \"rust\", \"threads\": $THREADS, \"images\": $n, \"wall_s\": $(echo "$t1 - $t0" | bc)}" >>"$RUNS"
  cp "$AN/image_paths.csv" "$WORK/paths.csv"
  cp "$AN"/CLS_features/*_features.safetensors "$WORK/ours.safetensors"
  t0=$(date +%s.%N)
  "$PY" "$ROOT/bench/features.py" --checkpoint "$CKPT" --paths "$WORK/paths.csv" \
    --mean-std "$RUN/mean_and_std_of_dataset.txt" --batch 24 --threads "$THREADS" \
    --out "$WORK/peer_features.csv" --compare "$WORK/ours.safetensors" >"$WORK/peer.json"
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
print(f"features agree: max |diff| {max(r['max_abs_diff'] for r in py):.2e}, "
      f"min cosine {min(r['min_cosine'] for r in py):.7f}")
print("| images | batch | threads | runs/side | Rust wall s | PyTorch wall s | Rust imgs/s | PyTorch imgs/s | Rust/PyTorch |")
print("|---|---|---|---|---|---|---|---|---|")
print(f"| {n} | {py[0]['batch']} | {rust[0]['threads']}/{py[0]['threads']} | {len(rust)} | {rw:.1f} | {pw:.1f} "
      f"| {n / rw:.2f} | {n / pw:.2f} | {pw / rw:.3f} |")
keys = ["import_s", "setup_s", "preprocess_s", "forward_s", "write_s"]
print("PyTorch in-process split (median s): " + ", ".join(f"{k[:-2]} {med([r[k] for r in py]):.2f}" for k in keys)
      + f"; forward-only imgs/s {n / med([r['forward_s'] for r in py]):.2f}")
print("raw wall s: rust " + ", ".join(f"{r['wall_s']:.1f}" for r in rust)
      + "; pytorch " + ", ".join(f"{r['wall_s']:.1f}" for r in py))
PYEOF
