#!/usr/bin/env bash
# Fine-tuning from a pretrained model vs training from scratch, same recipe and epochs (issue 35
# item 5). Two variants of scikit-learn's digits (scripts/digits.py, the same stratified split,
# seed 0, so the source never trains on the target's test images in another rendering):
#   source  16 px, 3 channels (digit, blurred, edges): the digits recipe's own data
#   target  12 px, 4 channels (digit, blurred, edges, blurred2): another size and channel count
# 1. The source model: SOURCE_EPOCHS epochs on the source (seed SOURCE_SEED), exported with
#    `trainer export --format timm` (the timm folder a user would download).
# 2. For every seed in SEEDS and every arm in ARMS, EPOCHS epochs on the target:
#      repeat, mean  model.init from the timm folder, model.init.channels repeat / mean
#                    (3 source channels onto 4: docs/pretrained.md, "Channels")
#      scratch       the same config without model.init (scDINO's random init)
#    Epoch 0 of each arm is its network before training (`trainer train --max-steps 1`: the
#    first step runs at the warm-up's lr 0 and the teacher is the student's copy): for scratch
#    the untrained floor, for repeat/mean the source's weights adapted to 4 channels.
# Every run is evaluated after every epoch (`trainer evaluate` on each numbered checkpoint:
# 20-NN top-1 and linear-probe top-1 on the target's Test folder, the Training folder as the
# bank). Epoch times are the trainer's own ("Epoch: [e/N] Total time: Xs" in its log), so both
# arms' times come from the same host load. The recipe is configs/small-data.yaml (the digits
# recipe + DINOv2's four stabilisers) with model.pos_embed: timm_no_class in every run: the
# layout `trainer export --format timm` writes a model with registers in, which a run started
# from the timm folder takes from it (written in every run, so scratch trains the same network).
# usage: [SEEDS="0 1 2"] [ARMS="scratch repeat mean"] [SOURCE_SEED=0] [TRAINER=bin]
#        bench/finetune.sh OUT [EPOCHS] [SOURCE_EPOCHS] [THREADS]
# SEEDS="" (set, empty): the source only (trained and exported), e.g. to give it every core
# before the targets run side by side at one thread each.
# Prints the tables (bench/finetune_table.py) and writes them to OUT/table.md; reruns skip what
# is finished (OUT/logs/*.done). Instances started side by side on one OUT share the runs
# (a lock per run), e.g. `for s in "0 1 2" "1 2 0" "2 0 1"; do SEEDS=$s bench/finetune.sh OUT &
# done; wait`; the table of the last one to finish has every run (or run finetune_table.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OUT=$(realpath -m "${1:?usage: bench/finetune.sh OUT [EPOCHS] [SOURCE_EPOCHS] [THREADS]}")
EPOCHS=${2:-5} SOURCE_EPOCHS=${3:-10} THREADS=${4:-1}
SEEDS=${SEEDS-0 1 2}
ARMS=${ARMS:-scratch repeat mean}
SOURCE_SEED=${SOURCE_SEED:-0}
mkdir -p "$OUT/logs"
[[ -d $OUT/data/source/Training ]] ||
  "$PY" "$ROOT/scripts/digits.py" --out "$OUT/data/source" --size 16 --channels 3 --seed 0 >&2
[[ -d $OUT/data/target/Training ]] ||
  "$PY" "$ROOT/scripts/digits.py" --out "$OUT/data/target" --size 12 --channels 4 --seed 0 >&2
SOURCE_TIMM=$OUT/source-timm

# The run config (stdout): $1 run name (its folder under OUT/runs), $2 source|target, $3 seed,
# $4 epochs, $5 arm (scratch: no model.init).
config() {
  local name=$1 data=$2 seed=$3 epochs=$4 arm=$5 size names combo init=""
  if [[ $data == source ]]; then
    size=16 names="digit, blurred, edges" combo=012
  else
    size=12 names="digit, blurred, edges, blurred2" combo=0123
  fi
  if [[ $arm != scratch ]]; then
    init="  init:
    from: $SOURCE_TIMM
    format: timm
    channels: $arm"
  fi
  cat <<EOF
run:
  name: $name
  output_dir: $OUT/runs
  seed: $seed
data:
  dataset_dir: $OUT/data/$data/Training
  test_dir: $OUT/data/$data/Test
  label_folder_depth: 0
  train_fraction: 0.95
  channel_names: [$names]
  channel_combinations: ["$combo"]
  num_workers: 1
model:
  name: m
  arch: vit_tiny
  patch_size: 4
  out_dim: 512
  use_bn_in_head: true
  drop_path_rate: 0.0
  num_register_tokens: 4
  pos_embed: timm_no_class
$init
train:
  epochs: $epochs
  checkpoint_every: 1
  num_gpus: 1
  batch_size_per_gpu: 32
  precision: fp32
  lr: 0.002
  warmup_epochs: 1
  momentum_teacher: 0.99
  warmup_teacher_temp: 0.02
  teacher_temp: 0.02
  warmup_teacher_temp_epochs: 0
  log_every: 20
  koleo_weight: 0.1
  centering: sinkhorn_knopp
  ibot:
    weight: 1.0
augment:
  global_crop_size: $size
  global_crops_scale: [0.5, 1.0]
  local_crop_size: 8
  local_crops_number: 0
  flips: false
  solarize: false
downstream:
  features:
    batch_size_per_gpu: 64
    resize_length: $size
  knn:
    k: [20]
EOF
}

# Trains and evaluates run $1 ($2 source|target, $3 seed, $4 epochs, $5 arm); $4 = 0: one step
# at lr 0 (the network it starts from). An interrupted run resumes (the trainer's own resume; the
# epoch it was stopped in then logs only the time after the resume). Numbered checkpoints are
# deleted once evaluated (180 MB each).
run() {
  local name=$1 data=$2 seed=$3 epochs=$4 arm=$5
  local y=$OUT/logs/$name.yaml log=$OUT/logs/$name.log lock
  [[ -e $OUT/logs/$name.done ]] && return 0
  # Several instances on one OUT share the runs (each takes the next free one; all wait for the
  # source): on a host shared with other work, each process gets its own share of the cores.
  exec {lock}>"$OUT/logs/$name.lock"
  if [[ $name == source ]]; then
    flock "$lock"
  elif ! flock -n "$lock"; then
    echo "run $name: another instance has it" >&2
    exec {lock}>&-
    return 0
  fi
  if [[ -e $OUT/logs/$name.done ]]; then # finished by another instance meanwhile
    exec {lock}>&-
    return 0
  fi
  config "$name" "$data" "$seed" "$((epochs > 0 ? epochs : 1))" "$arm" | sed '/^$/d' >"$y"
  "$TRAINER" config check "$y" >/dev/null
  "$TRAINER" mean-std --config "$y" >>"$log" 2>&1
  echo "run $name: $(date -u +%H:%M:%S) start" >&2
  if ((epochs == 0)); then
    "$TRAINER" train --config "$y" --threads "$THREADS" --max-steps 1 >>"$log" 2>&1
  else
    "$TRAINER" train --config "$y" --threads "$THREADS" >>"$log" 2>&1
  fi
  "$TRAINER" evaluate --config "$y" --threads "$THREADS" >>"$log" 2>&1
  [[ $name == source ]] || rm -f "$OUT/runs/$name/scDINO_ViTs/"*/checkpoint*.safetensors
  touch "$OUT/logs/$name.done"
  exec {lock}>&-
}

run source source "$SOURCE_SEED" "$SOURCE_EPOCHS" scratch
# The source folder is exported once (under the lock, so a second instance waits for it).
exec {lock}>"$OUT/logs/source-timm.lock"
flock "$lock"
if [[ ! -e $OUT/logs/source-timm.done ]]; then
  [[ -e $OUT/logs/source.done ]] || { echo "the source run is not finished" >&2; exit 1; }
  "$TRAINER" export --format timm --checkpoint "$(ls "$OUT/runs/source/scDINO_ViTs/"*/checkpoint.safetensors)" \
    --out "$SOURCE_TIMM" --force >>"$OUT/logs/source.log" 2>&1
  touch "$OUT/logs/source-timm.done"
fi
exec {lock}>&-
for seed in $SEEDS; do
  for arm in $ARMS; do
    run "seed$seed-$arm-e0" target "$seed" 0 "$arm"
    run "seed$seed-$arm" target "$seed" "$EPOCHS" "$arm"
  done
done

[[ -n ${SEEDS// /} ]] || exit 0
"$PY" "$ROOT/bench/finetune_table.py" "$OUT" --seeds $SEEDS --arms $ARMS | tee "$OUT/table.md"
