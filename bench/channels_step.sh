#!/usr/bin/env bash
# Step time of each `model.channels` mode at the same image size, Rust (tch) and the PyTorch
# peer side by side: one full DINO step (teacher on 2 global crops, student on all crops, loss
# + centre, backward, clip, AdamW, EMA; fp32, random crops in memory) of
#   fixed  - scDINO's ViT over all C channels (N tokens per crop),
#   tokens - ChannelViT, each step on a hierarchically sampled subset of k channels (k·N tokens,
#            k uniform on 1..C),
#   tokens_mix_chdino - tokens with configs/tokens-small-data.yaml's channel DINO term
#            (`train.channel_dino_weight: 1`: each channel's own token through the head too)
#            and one channel-mixing block (`model.channel_mixing_blocks: 1`),
#   bag    - a single-channel ViT on the C channels of each image as C items (C·B items).
# imgs/s counts images (B per crop) for every mode; "vs fixed" is the mode's time per image
# over fixed's, per implementation. Runs alternate Rust, PyTorch, mode by mode, for ROUNDS
# rounds so machine noise hits every cell.
# usage: [RUNS_OUT=file.jsonl] bench/channels_step.sh [CHANNELS] [BATCH] [THREADS] [ITERS] [ROUNDS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh" >/dev/null 2>&1 || "$ROOT/scripts/setup.sh"
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
TRAINER=$ROOT/target/release/trainer
CHANNELS=${1:-5} BATCH=${2:-4} THREADS=${3:-2} ITERS=${4:-6} ROUNDS=${5:-3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RUNS=$WORK/runs.jsonl
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
common=(--arch vit_tiny --patch 16 --channels "$CHANNELS" --batch "$BATCH" --threads "$THREADS"
  --local-crops 4 --global-size 96 --local-size 48 --out-dim 4096 --warmup 1 --iters "$ITERS")
for _ in $(seq "$ROUNDS"); do
  for mode in fixed tokens tokens_mix_chdino bag; do
    flags=(--channel-mode "$mode")
    [[ $mode != tokens_mix_chdino ]] ||
      flags=(--channel-mode tokens --channel-mixing-blocks 1 --channel-dino-weight 1)
    "$TRAINER" bench step "${common[@]}" "${flags[@]}" >>"$RUNS"
    "$PY" "$ROOT/bench/train_step.py" "${common[@]}" "${flags[@]}" >>"$RUNS"
  done
done
[[ -n ${RUNS_OUT:-} ]] && cp "$RUNS" "$RUNS_OUT"
echo "load average (1/5/15 min) at start: $LOAD0, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$RUNS" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
cell = {}
for r in runs:
    mode = r["channel_mode"]
    if r.get("channel_mixing_blocks") or r.get("channel_dino_weight"):
        assert (r["channel_mixing_blocks"], r["channel_dino_weight"]) == (1, 1.0), r
        mode = "tokens_mix_chdino"
    cell.setdefault((mode, r["impl"]), []).append(r["throughput_imgs_per_s"])
med = {k: statistics.median(v) for k, v in cell.items()}
print(f"| mode | Rust imgs/s | PyTorch imgs/s | Rust/PyTorch | Rust time/image vs fixed | PyTorch time/image vs fixed |")
print("|---|---|---|---|---|---|")
for mode in ["fixed", "tokens", "tokens_mix_chdino", "bag"]:
    r, p = med[(mode, "rust-tch")], med[(mode, "pytorch")]
    rf, pf = med[("fixed", "rust-tch")], med[("fixed", "pytorch")]
    print(f"| {mode} | {r:.2f} | {p:.2f} | {r / p:.3f} | {rf / r:.2f}x | {pf / p:.2f}x |")
print(f"(median over {len(cell[('fixed', 'rust-tch')])} rounds of each cell's mean images/s over its timed steps)")
PYEOF
