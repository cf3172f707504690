#!/usr/bin/env bash
# scDINO's one model per channel combination against one channel-adaptive model (bag, tokens),
# trained with the same recipe (configs/digits.yaml), back to back on one machine, for every
# seed in SEEDS, on one of two datasets (DATASET):
#   digits  scikit-learn's digits written with 4 channels (digit, two blurred copies, edges),
#           16 px, patch 4 (the default)
#   interaction  scripts/interaction.py's 3 channels (a, b, c: a disk and a dot each), 6
#           classes defined by which channel's dot lies in which other channel's disk, so no
#           single channel decides the class; 1200 training and 300 test images, 16 px, patch 4;
#           every approach gets model.img_size: 16 (a 4 × 4 position table, the crops' grid,
#           instead of a 56 × 56 one resampled in every forward)
#   colocalisation  scripts/colocalisation.py's 3 channels (a, b, c: six spots each), 4 classes
#           defined by which two channels light the same cells (none, a_b, a_c, b_c), so no
#           single channel decides the class and every view keeps it; 1200 training and 300
#           test images, 16 px, patch 4, model.img_size: 16 as for interaction
#   pbmc    `trainer synth`'s PBMC-like cells, 5 channels (APC, BF, DAPI, GREEN, PE: the
#           class is spread over the marker stains, the cell size and the nucleus shape),
#           8 classes of 96 training images, 32 px, patch 8 (the same 4×4 patch grid)
# For every combination (each single channel, all channels, one pair: digit+edges,
# BF+DAPI) each approach is scored on
# the test folder by `trainer evaluate` (20-NN top-1, linear-probe top-1 and macro-F1) from
# the last checkpoint:
#   untrained   the tokens network after one epoch at lr 1e-12 (weights move by ~1e-11)
#   fixed       scDINO's way: one model per combination (six trainings)
#   fixed_zeros the all-channel fixed model on each subset, the missing channels fed as zeros
#               after normalisation (downstream.features.missing_channels: zeros)
#   tokens, bag one model each on all channels, evaluated on every combination
#   tokens_small, bag_small
#               the same with configs/small-data.yaml (the digits recipe + DINOv2's four
#               stabilisers: KoLeo, Sinkhorn-Knopp centring, iBOT, 4 registers; not run unless
#               named in RUNS)
#   tokens_mix  tokens_small with the two settings that made a supervised tokens ViT learn the
#               interaction task (BENCHMARKS.md run 9): model.channel_mixing_blocks: 1 (the
#               first block attends within a position) and model.channel_embed_std: 1.0 (not run
#               unless named in RUNS)
#   tokens_matched
#               tokens_small with as many optimizer steps as bag_small: an epoch of bag is
#               C steps per image (each channel its own sample), of tokens one, so this run
#               trains C × EPOCHS epochs with C × the warm-up epochs (the same lr, weight-decay,
#               teacher-momentum schedules over the same steps; not run unless named in RUNS)
#   tokens_teacher_all
#               tokens_matched with train.teacher_channels: all (the teacher sees every
#               channel, the student the step's subset; not run unless named in RUNS)
#   tokens_separate
#               tokens_matched with model.channel_separate_blocks: 12 (every block of vit_tiny
#               encodes each channel's patches on its own; only the CLS and register tokens read
#               across channels; not run unless named in RUNS)
#   tokens_chdino, tokens_separate_chdino
#               tokens_matched and tokens_separate with train.channel_dino_weight: 1.0 (a second
#               DINO loss on each channel's mean patch token, every (image, channel) a sample, as
#               bag trains each channel's CLS; configs/tokens-small-data.yaml was tokens_chdino
#               before runs 21-22, now tokens_recipe; not run unless named in RUNS)
#   tokens_mix_chdino
#               tokens_chdino with tokens_mix's two settings (the candidate recipe for the
#               interaction task, where channels must be read together; not run unless named in
#               RUNS)
#   tokens_recipe
#               configs/tokens-small-data.yaml's recipe: tokens_chdino with one channel-mixing
#               block first at the default channel scale (model.channel_mixing_blocks: 1) and half
#               the steps on one channel alone (train.single_channel_steps: 0.5); read as
#               tokens_recipe_alone (BENCHMARKS.md issue 48 runs 21 and 22 ran it as
#               tokens_mix_chdino with CONFIG_SED='s|channel_embed_std: 1.0|channel_embed_std:
#               0.02|;s|^train:|train:\n  single_channel_steps: 0.5|', the same config; not run
#               unless named in RUNS)
#   tokens_dichavit
#               tokens with configs/dichavit.yaml (small-data's recipe plus DiChaViT's channel
#               and token diversification losses and diverse channel sampling; not run unless
#               named in RUNS)
# Every tokens approach (the untrained network included) is scored three times from the same
# last checkpoint: with its CLS token (downstream.features.tokens_pool: cls, as RUN), with
# tokens_pool: cls_and_channels (the CLS and each channel's mean patch token, as RUN_pool;
# BENCHMARKS.md run 12) and with tokens_pool: joint_and_alone (that feature of the pass over the
# combination, then each channel's from a pass over it alone, as RUN_alone; run 16).
# Cost: CPU and wall seconds of each approach's trainings and evaluations (bash `time`).
# Prints one Markdown table per approach: mean and spread over the seeds.
# usage: [SEEDS="0 1 2"] [RUNS="untrained tokens bag fixed fixed_zeros"] [TRAINER=bin] [DATA=dir]
#        [DATASET=digits|interaction|colocalisation|pbmc] bench/channels_learning.sh OUT [EPOCHS] [THREADS]
#   RUNS: the approaches to run, in this order (fixed_zeros needs fixed of the same seed).
#   TRAINER: a trainer binary to use as it is (no setup, no build: e.g. a GPU machine with the
#   binary of scripts/device-binary.sh); DATA: the dataset written beforehand
#   (`scripts/digits.py --out DATA --size 16 --channels 4`, or `trainer synth --out DATA
#   --size 32 --per-class 96 --channels 5`), else written into OUT.
#   CONFIG_SED: one more sed script applied to every run's config after the harness's own (a
#   recipe change on top of each approach's base config, e.g. the interaction task's
#   class-preserving views: 's|  flips: false|  flips: true\n  blur: false|').
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OUT=$(realpath -m "${1:?usage: bench/channels_learning.sh OUT [EPOCHS] [THREADS]}")
EPOCHS=${2:-10} THREADS=${3:-2}
SEEDS=${SEEDS:-0}
RUNS=${RUNS:-untrained tokens bag fixed fixed_zeros}
DATA=$(realpath -m "${DATA:-$OUT/data}")
DATASET=${DATASET:-digits}
MODEL_EXTRA=""  # more model keys for every approach (sed's newlines)
mkdir -p "$OUT"
case $DATASET in
  digits)
    [[ -d $DATA/Training ]] || "$PY" "$ROOT/scripts/digits.py" --out "$DATA" --size 16 --channels 4
    NAMES="digit, blurred, edges, blurred2" SIZE=16 PATCH=4
    COMBOS='["0", "1", "2", "3", "0123", "02"]'
    ALL=4 # the index of "0123"
    ;;
  interaction)
    [[ -d $DATA/Training ]] || "$PY" "$ROOT/scripts/interaction.py" --out "$DATA" --size 16 >/dev/null
    NAMES="a, b, c" SIZE=16 PATCH=4
    COMBOS='["0", "1", "2", "012", "01"]'
    ALL=3
    MODEL_EXTRA="\\n  img_size: 16"
    ;;
  colocalisation)
    [[ -d $DATA/Training ]] || "$PY" "$ROOT/scripts/colocalisation.py" --out "$DATA" --size 16 >/dev/null
    NAMES="a, b, c" SIZE=16 PATCH=4
    COMBOS='["0", "1", "2", "012", "01"]'
    ALL=3
    MODEL_EXTRA="\\n  img_size: 16"
    ;;
  pbmc)
    [[ -d $DATA/Training ]] || "$TRAINER" synth --out "$DATA" --size 32 --per-class 96 --channels 5 >/dev/null
    NAMES="APC, BF, DAPI, GREEN, PE" SIZE=32 PATCH=8
    COMBOS='["0", "1", "2", "3", "4", "01234", "12"]'
    ALL=5
    ;;
  *) echo "DATASET is digits, interaction, colocalisation or pbmc, not $DATASET" >&2; exit 2 ;;
esac
NCOMBOS=$(tr -cd , <<<"$COMBOS" | wc -c)
NCOMBOS=$((NCOMBOS + 1))
COST=$OUT/cost.txt
: >"$COST"

# Whether approach $1 trains tokens_matched's steps (C × the epochs and the warm-up).
matched() {
  case $1 in
    tokens_matched | tokens_teacher_all | tokens_separate | tokens_chdino | tokens_separate_chdino | tokens_mix_chdino | \
      tokens_recipe) return 0 ;;
    *) return 1 ;;
  esac
}

# The run config of approach $2 for seed $1 (written to stdout).
config() {
  local seed=$1 run=$2 mode=$2 lr=0.002 base=digits
  case $run in
    untrained) mode=tokens lr=1.0e-12 ;;
    fixed_zeros) mode=fixed ;;
    *_small) mode=${run%_small} base=small-data ;;
    tokens_mix | tokens_matched | tokens_teacher_all | tokens_separate | tokens_chdino | tokens_separate_chdino | \
      tokens_mix_chdino | tokens_recipe)
      mode=tokens base=small-data ;;
    # configs/dichavit.yaml says channels: tokens itself.
    tokens_dichavit) mode="" base=dichavit ;;
  esac
  local channels=""
  [[ -z $mode ]] || channels="\\n  channels: $mode"  # sed's newline
  [[ $run != tokens_mix* ]] || channels+="\\n  channel_mixing_blocks: 1\\n  channel_embed_std: 1.0"
  [[ $run != tokens_separate* ]] || channels+="\\n  channel_separate_blocks: 12"
  [[ $run != tokens_recipe ]] || channels+="\\n  channel_mixing_blocks: 1"
  channels+=$MODEL_EXTRA
  sed -e "s|output_dir: digits/output|output_dir: $OUT/seed$seed|" \
    -e "s|dataset_dir: digits/data/Training|dataset_dir: $DATA/Training|" \
    -e "s|test_dir: digits/data/Test|test_dir: $DATA/Test|" \
    -e "s|name: digits$|name: $run|" -e "s|name: small-data$|name: $run|" -e "s|name: dichavit$|name: $run|" \
    -e "s|  seed: 0|  seed: $seed|" \
    -e "s|channel_names: \[digit, blurred, edges\]|channel_names: [$NAMES]|" \
    -e "s|global_crop_size: 16|global_crop_size: $SIZE|" -e "s|resize_length: 16|resize_length: $SIZE|" \
    -e "s|patch_size: 4|patch_size: $PATCH|" \
    -e "s|channel_combinations: \[\"012\"\]|channel_combinations: $COMBOS|" \
    -e "s|  epochs: 30|  epochs: $EPOCHS|" -e "s|  checkpoint_every: 3|  checkpoint_every: $EPOCHS|" \
    -e "s|  lr: 0.002|  lr: $lr|" \
    -e "s|  use_bn_in_head: true|  use_bn_in_head: true$channels|" \
    "$ROOT/configs/$base.yaml" | sed -e "${CONFIG_SED:-}" |
    if [[ $run == untrained ]]; then
      sed -e "s|  epochs: $EPOCHS|  epochs: 1|" -e "s|  checkpoint_every: $EPOCHS|  checkpoint_every: 1|" \
        -e "s|  lr: $lr|  lr: $lr\n  min_lr: $lr|"
    elif matched "$run"; then
      # C × the epochs and the warm-up (small-data.yaml's is one epoch), every schedule in steps
      # as bag_small's.
      local nch=$(($(tr -cd , <<<"$NAMES" | wc -c) + 1)) train_extra=""
      [[ $run != tokens_teacher_all ]] || train_extra="\n  teacher_channels: all"
      [[ $run != *_chdino ]] || train_extra="\n  channel_dino_weight: 1.0"
      [[ $run != tokens_recipe ]] || train_extra="\n  channel_dino_weight: 1.0\n  single_channel_steps: 0.5"
      sed -e "s|  epochs: $EPOCHS|  epochs: $((EPOCHS * nch))|" \
        -e "s|  checkpoint_every: $EPOCHS|  checkpoint_every: $((EPOCHS * nch))|" \
        -e "s|  warmup_epochs: 1$|  warmup_epochs: $nch|" -e "s|^train:|train:$train_extra|"
    elif [[ $run == fixed_zeros ]]; then
      sed -e "s|^  features:|  features:\n    missing_channels: zeros|"
    else
      cat
    fi
}

# Runs a trainer command, appending "label user sys real" to $COST.
timed() {
  local label=$1 log=$2
  shift 2
  local TIMEFORMAT="$label %U %S %R"
  { time "$TRAINER" "$@" --threads "$THREADS" >>"$log" 2>&1; } 2>>"$COST"
}

for seed in $SEEDS; do
  for run in $RUNS; do
    y=$OUT/seed$seed-$run.yaml log=$OUT/seed$seed-$run.log
    config "$seed" "$run" >"$y"
    grep -q "missing_channels: zeros" "$y" || [[ $run != fixed_zeros ]] ||
      { echo "configs/digits.yaml has no downstream.features section to add missing_channels to" >&2; exit 1; }
    # The matched runs' seds must have found what they change (a base config with another
    # warm-up would otherwise train with its own, silently).
    if matched "$run"; then
      nch=$(($(tr -cd , <<<"$NAMES" | wc -c) + 1))
      grep -q "^  warmup_epochs: $nch\$" "$y" && grep -q "^  epochs: $((EPOCHS * nch))\$" "$y" ||
        { echo "$y: configs/small-data.yaml no longer has the warm-up (1 epoch) or epochs the matched runs multiply" >&2; exit 1; }
      [[ $run != tokens_teacher_all ]] || grep -q "^  teacher_channels: all\$" "$y" ||
        { echo "$y: no train section to add teacher_channels to" >&2; exit 1; }
      [[ $run != *_chdino ]] || grep -q "^  channel_dino_weight: 1.0\$" "$y" ||
        { echo "$y: no train section to add channel_dino_weight to" >&2; exit 1; }
      [[ $run != tokens_recipe ]] || { grep -q "^  channel_dino_weight: 1.0\$" "$y" &&
        grep -q "^  single_channel_steps: 0.5\$" "$y" && grep -q "^  channel_mixing_blocks: 1\$" "$y"; } ||
        { echo "$y: no train or model section to add tokens_recipe's keys to" >&2; exit 1; }
      [[ $run != tokens_separate* ]] || grep -q "^  channel_separate_blocks: 12\$" "$y" ||
        { echo "$y: no model section to add channel_separate_blocks to" >&2; exit 1; }
      # 12 is every block of the 12-block presets; another depth needs another count.
      [[ $run != tokens_separate* ]] || grep -Eq "^  arch: vit_(tiny|small|base)\$" "$y" ||
        { echo "$y: tokens_separate sets 12 separate blocks, for a 12-block arch only" >&2; exit 1; }
    fi
    "$TRAINER" config check "$y" >/dev/null
    case $run in
      fixed)
        "$TRAINER" mean-std --config "$y" >>"$log" 2>&1
        for c in $(seq 0 $((NCOMBOS - 1))); do
          timed "seed$seed $run train" "$log" train --config "$y" --combination "$c"
          timed "seed$seed $run evaluate" "$log" evaluate --config "$y" --combination "$c"
        done
        ;;
      fixed_zeros)
        # The all-channel fixed model of this seed, on every other combination.
        all=$(ls -d "$OUT/seed$seed/fixed/scDINO_ViTs/"*_channel_"$(tr -d ' ' <<<"$NAMES" | tr , _)")
        mkdir -p "$OUT/seed$seed/fixed_zeros"
        cp "$OUT/seed$seed/fixed/mean_and_std_of_dataset.txt" "$OUT/seed$seed/fixed_zeros/"
        for c in $(seq 0 $((NCOMBOS - 1))); do
          [[ $c == "$ALL" ]] && continue
          timed "seed$seed $run evaluate" "$log" evaluate --config "$y" --combination "$c" \
            --checkpoint "$all/checkpoint.safetensors"
        done
        ;;
      *)
        "$TRAINER" mean-std --config "$y" >>"$log" 2>&1
        timed "seed$seed $run train" "$log" train --config "$y"
        for c in $(seq 0 $((NCOMBOS - 1))); do
          timed "seed$seed $run evaluate" "$log" evaluate --config "$y" --combination "$c"
        done
        if grep -q "^  channels: tokens\$" "$y"; then
          # The same last checkpoint with the per-channel features, as ${run}_pool
          # (cls_and_channels) and ${run}_alone (joint_and_alone).
          ck=$(ls "$OUT/seed$seed/$run/scDINO_ViTs/"*_channel_*/checkpoint.safetensors)
          for pool in cls_and_channels:pool joint_and_alone:alone; do
            name=${run}_${pool#*:}
            yp=$OUT/seed$seed-$name.yaml
            sed -e "s|^  name: $run\$|  name: $name|" \
              -e "s|^  features:|  features:\n    tokens_pool: ${pool%:*}|" "$y" >"$yp"
            grep -q "^  name: $name\$" "$yp" && grep -q "tokens_pool: ${pool%:*}" "$yp" ||
              { echo "$yp: no run name or downstream.features section to change" >&2; exit 1; }
            "$TRAINER" config check "$yp" >/dev/null
            mkdir -p "$OUT/seed$seed/$name"
            cp "$OUT/seed$seed/$run/mean_and_std_of_dataset.txt" "$OUT/seed$seed/$name/"
            for c in $(seq 0 $((NCOMBOS - 1))); do
              timed "seed$seed $name evaluate" "$log" evaluate --config "$yp" --combination "$c" \
                --checkpoint "$ck"
            done
          done
        fi
        ;;
    esac
  done
done

"$PY" - "$OUT" "$SEEDS" "$NAMES" "$COMBOS" <<'PYEOF'
import glob, json, os, re, statistics, sys
out, seeds = sys.argv[1], sys.argv[2].split()
names = [n.strip() for n in sys.argv[3].split(",")]
combos = ["_".join(names[int(i)] for i in c) for c in json.loads(sys.argv[4])]
runs = ["untrained", "fixed", "fixed_zeros", "tokens", "bag", "tokens_small", "bag_small",
        "tokens_mix", "tokens_matched", "tokens_teacher_all", "tokens_separate", "tokens_chdino",
        "tokens_separate_chdino", "tokens_mix_chdino", "tokens_recipe", "tokens_dichavit"]
# Each tokens run beside its cls_and_channels and joint_and_alone evaluations.
runs = [x for r in runs for x in ([r] if r in ("fixed", "fixed_zeros", "bag", "bag_small") else [r, r + "_pool", r + "_alone"])]
scores = {}  # (run, combo) -> list of (knn20, probe, f1)
for seed in seeds:
    for run in runs:
        for combo in combos:
            pattern = os.path.join(out, f"seed{seed}", run, f"*_channel_{combo}_analyses",
                                   "evaluation", "epoch*_evaluation.json")
            found = sorted(glob.glob(pattern), key=lambda p: int(re.search(r"epoch(\d+)_evaluation", p).group(1)))
            if not found:
                continue
            v = json.load(open(found[-1]))  # the last checkpoint
            knn = {k["k"]: k["scores"]["top1_percent"] for k in v["knn"]}
            p = v["linear_probe"]["scores"]
            scores.setdefault((run, combo), []).append((knn.get(20, float("nan")), p["top1_percent"], p["macro_f1"]))

runs = [r for r in runs if any((r, c) in scores for c in combos)]

def cell(vals, fmt):
    if not vals:
        return "–"
    m = statistics.mean(vals)
    if len(vals) == 1:
        return fmt.format(m)
    return (fmt + " ± " + fmt).format(m, statistics.stdev(vals))

print(f"\nseeds: {' '.join(seeds)} (mean ± sample standard deviation over the seeds)")
print("| combination | " + " | ".join(f"{r}: 20-NN / probe / F1" for r in runs) + " |")
print("|---|" + "---|" * len(runs))
for combo in combos:
    row = [combo.replace("_", "+")]
    for run in runs:
        s = scores.get((run, combo), [])
        row.append(" / ".join([cell([x[0] for x in s], "{:.1f}"), cell([x[1] for x in s], "{:.1f}"),
                               cell([x[2] for x in s], "{:.3f}")]))
    print("| " + " | ".join(row) + " |")

cost = {}
for line in open(os.path.join(out, "cost.txt")):
    label, user, sys_, real = line.rsplit(" ", 3)
    seed, run, _ = label.split(" ")
    c = cost.setdefault((run, seed), [0.0, 0.0])
    c[0] += float(user) + float(sys_)
    c[1] += float(real)
print("\n| approach | CPU s (train + evaluate) | wall s |")
print("|---|---|---|")
for run in runs:
    per = [cost[(run, f"seed{s}")] for s in seeds if (run, f"seed{s}") in cost]
    if per:
        print(f"| {run} | {cell([c[0] for c in per], '{:.0f}')} | {cell([c[1] for c in per], '{:.0f}')} |")
PYEOF
