#!/usr/bin/env bash
# Which recipe learns on small real data without per-dataset tuning (issue 22): scDINO's
# defaults scaled to the image size, each of DINOv2's stabilisers added to them (KoLeo,
# Sinkhorn-Knopp centring, iBOT, register tokens), all four together, the digits recipe
# (configs/digits.yaml), the digits recipe with each of them (recipe_koleo, ...; not run unless
# named in VARIANTS) and with all four, on two datasets written from
# scikit-learn's digits:
#   digits16   16 px, 3 channels (digit, blurred, edges): the digits recipe's own data
#   digits12x4 12 px, 4 channels (digit, blurred, edges, blurred2): another size and channels
# Between the datasets only the data paths, the channel names and the image sizes change.
# Every run is evaluated after every epoch (`trainer evaluate` on each numbered checkpoint:
# 20-NN top-1 and linear-probe top-1 on the test folder); `untrained` is the network after
# one step at the warm-up's lr 0 (the initial weights). Learning means 20-NN top-1 at least
# 20 points above the untrained network's.
# Budget: scDINO's keys are its defaults except what a CPU run cannot afford and the image size
# forces: vit_tiny with 4 px patches, out_dim 512 (not 65,536), batch 32, EPOCHS epochs with
# one of warm-up, 8 local crops of 8 px.
# usage: [VARIANTS="untrained recipe ..."] [DATASETS="digits16 digits12x4"] [SEED=0]
#        [TRAINER=bin] [KEEP_CHECKPOINTS=1] bench/recipe.sh OUT [EPOCHS] [THREADS]
# Prints a Markdown table per dataset (also written to OUT/table.md); reruns skip finished runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OUT=$(realpath -m "${1:?usage: bench/recipe.sh OUT [EPOCHS] [THREADS]}")
EPOCHS=${2:-10} THREADS=${3:-1}
SEED=${SEED:-0}
ALL_VARIANTS="untrained scdino scdino_koleo scdino_sk scdino_ibot scdino_registers scdino_all recipe recipe_koleo recipe_sk recipe_ibot recipe_registers recipe_all"
VARIANTS=${VARIANTS:-$ALL_VARIANTS}
DATASETS=${DATASETS:-digits16 digits12x4}
mkdir -p "$OUT"

# The data keys of dataset $1 (written to stdout, YAML under `data:`), after writing it.
data_keys() {
  local size channels names
  case $1 in
    digits16) size=16 channels=3 names="digit, blurred, edges" ;;
    digits12x4) size=12 channels=4 names="digit, blurred, edges, blurred2" ;;
    *) echo "unknown dataset $1" >&2; exit 2 ;;
  esac
  [[ -d $OUT/data/$1/Training ]] ||
    "$PY" "$ROOT/scripts/digits.py" --out "$OUT/data/$1" --size "$size" --channels "$channels" >&2
  local combo
  combo=$(seq -s '' 0 $((channels - 1)))
  cat <<EOF
  dataset_dir: $OUT/data/$1/Training
  test_dir: $OUT/data/$1/Test
  label_folder_depth: 0
  train_fraction: 0.95
  channel_names: [$names]
  channel_combinations: ["$combo"]
  num_workers: 1
SIZE=$size
EOF
}

# The run config of variant $2 on dataset $1.
config() {
  local dataset=$1 variant=$2 keys size
  keys=$(data_keys "$dataset")
  size=$(sed -n 's/^SIZE=//p' <<<"$keys")
  keys=$(grep -v '^SIZE=' <<<"$keys")
  local base=${variant%%_*} extra=${variant#*_}
  [[ $variant == "$base" ]] && extra=""
  [[ $variant == untrained ]] && base=scdino
  local model train augment
  if [[ $base == recipe ]]; then
    # configs/digits.yaml's choices.
    model="  use_bn_in_head: true
  drop_path_rate: 0.0"
    train="  lr: 0.002
  momentum_teacher: 0.99
  warmup_teacher_temp: 0.02
  teacher_temp: 0.02
  warmup_teacher_temp_epochs: 0"
    augment="  global_crops_scale: [0.5, 1.0]
  local_crops_number: 0
  flips: false
  solarize: false"
  else
    model="" train="" augment=""
  fi
  case $extra in
    "") ;;
    koleo) train+=$'\n  koleo_weight: 0.1' ;;
    sk) train+=$'\n  centering: sinkhorn_knopp' ;;
    ibot) train+=$'\n  ibot:\n    weight: 1.0' ;;
    registers) model+=$'\n  num_register_tokens: 4' ;;
    all)
      train+=$'\n  koleo_weight: 0.1\n  centering: sinkhorn_knopp\n  ibot:\n    weight: 1.0'
      model+=$'\n  num_register_tokens: 4'
      ;;
    *) echo "unknown variant $variant" >&2; exit 2 ;;
  esac
  cat <<EOF
run:
  name: $variant
  output_dir: $OUT/$dataset
  seed: $SEED
data:
$keys
model:
  name: m
  arch: vit_tiny
  patch_size: 4
  out_dim: 512
${model}
train:
  epochs: $EPOCHS
  checkpoint_every: 1
  num_gpus: 1
  batch_size_per_gpu: 32
  precision: fp32
  warmup_epochs: 1
  log_every: 20
${train}
augment:
  global_crop_size: $size
  local_crop_size: 8
${augment}
downstream:
  features:
    batch_size_per_gpu: 64
    resize_length: $size
  knn:
    k: [20]
EOF
}

for dataset in $DATASETS; do
  for variant in $VARIANTS; do
    y=$OUT/$dataset-$variant.yaml log=$OUT/$dataset-$variant.log
    done_mark=$OUT/$dataset-$variant.done
    [[ -e $done_mark ]] && continue
    config "$dataset" "$variant" | sed '/^$/d' >"$y"
    "$TRAINER" config check "$y" >/dev/null
    : >"$log"
    "$TRAINER" mean-std --config "$y" >>"$log" 2>&1
    start=$(date +%s)
    if [[ $variant == untrained ]]; then
      # The first step runs at the warm-up's lr 0 and the teacher is the student's copy.
      "$TRAINER" train --config "$y" --threads "$THREADS" --max-steps 1 >>"$log" 2>&1
      cks=$(ls "$OUT/$dataset/$variant/scDINO_ViTs/"*/checkpoint.safetensors)
    else
      "$TRAINER" train --config "$y" --threads "$THREADS" >>"$log" 2>&1
      cks=$(ls "$OUT/$dataset/$variant/scDINO_ViTs/"*/checkpoint[0-9]*.safetensors)
    fi
    echo "train_seconds $(($(date +%s) - start))" >>"$log"
    for ck in $cks; do
      "$TRAINER" evaluate --config "$y" --checkpoint "$ck" --threads "$THREADS" >>"$log" 2>&1
    done
    # The evaluations are what the tables read; a run's numbered checkpoints (about 90 MB each,
    # one per epoch) would fill a disk over the whole matrix. KEEP_CHECKPOINTS=1 keeps them.
    [[ ${KEEP_CHECKPOINTS:-0} == 1 ]] || rm -f "$OUT/$dataset/$variant/scDINO_ViTs/"*/checkpoint[0-9]*.safetensors
    touch "$done_mark"
  done
done

"$PY" - "$OUT" "$DATASETS" "$ALL_VARIANTS" <<'PYEOF' | tee "$OUT/table.md"
import glob, json, os, re, sys
out, datasets, variants = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
for dataset in datasets:
    rows = {}
    for v in variants:
        found = glob.glob(os.path.join(out, dataset, v, "*_analyses", "evaluation", "*_evaluation.json"))
        per_epoch = {}
        for path in found:
            e = json.load(open(path))
            m = re.search(r"epoch(\d+)_evaluation", path)
            epoch = 0 if v == "untrained" else (int(m.group(1)) + 1 if m else None)
            if epoch is None:
                continue
            knn = {k["k"]: k["scores"]["top1_percent"] for k in e["knn"]}
            per_epoch[epoch] = (knn.get(20), e["linear_probe"]["scores"]["top1_percent"])
        if per_epoch:
            rows[v] = per_epoch
    if not rows:
        continue
    base = rows.get("untrained", {}).get(0, (None, None))[0]
    epochs = sorted({e for r in rows.values() for e in r if e > 0})
    print(f"\n{dataset}: 20-NN top-1 % after each epoch; probe top-1 % after the last"
          + (f"; untrained 20-NN {base:.1f} %, probe {rows['untrained'][0][1]:.1f} %" if base is not None else ""))
    print("| variant | " + " | ".join(str(e) for e in epochs) + " | probe | best 20-NN − untrained |")
    print("|---|" + "---|" * (len(epochs) + 2))
    for v, r in rows.items():
        if v == "untrained":
            continue
        cells = [f"{r[e][0]:.1f}" if e in r else "–" for e in epochs]
        last = max(r)
        best = max(x[0] for x in r.values())
        gain = f"{best - base:+.1f}" if base is not None else "–"
        print(f"| {v} | " + " | ".join(cells) + f" | {r[last][1]:.1f} | {gain} |")
PYEOF
