#!/usr/bin/env bash
# Data-parallel step time, one invocation, side by side: `trainer train` on 1 rank, on 2 ranks
# with DDP (buckets all-reduced after backward, and overlapped with backward through gradient
# hooks) and with FSDP, vs PyTorch's DistributedDataParallel over Gloo (bench/ddp_step.py) on 1
# and 2 ranks. Same per-rank batch on every run (weak scaling: 2 ranks do twice the work per
# step), vit_tiny, 2 channels, 2x64² + 2x32² crops, 4096 prototypes, fp32, one thread per rank
# (OMP_NUM_THREADS=1, torchrun's default). Our time per step is the `step:` field of the
# progress lines (wall time per iteration, loader wait included, log_every 1); the peer's is
# the wall time of its step on random in-memory crops. Medians after WARMUP steps; runs
# alternate over ROUNDS rounds so machine noise hits all variants.
# usage: bench/ddp.sh [BATCH] [STEPS] [ROUNDS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SCDINO_VENV:-$ROOT/.venv}
TRAINER=$ROOT/target/release/trainer
for f in "$TRAINER" "$VENV/bin/python" "$VENV/bin/torchrun"; do
  [[ -x $f ]] || { echo "$f is missing: run scripts/setup.sh (venv and release build) first" >&2; exit 1; }
done
BATCH=${1:-8} STEPS=${2:-8} ROUNDS=${3:-2}
WARMUP=2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
# 2 ranks x BATCH x STEPS training images (train_fraction 0.8).
per_class=$(((2 * BATCH * STEPS * 5 / 4 + 7) / 8 + 1))
"$TRAINER" synth --out "$WORK/data" --seed 0 --per-class "$per_class" >/dev/null
cfg() { # name extra-train-lines
  printf 'run:\n  name: %s\n  output_dir: %s\ndata:\n  dataset_dir: %s\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: ["02"]\n  num_workers: 1\nmodel:\n  name: m\n  arch: vit_tiny\n  out_dim: 4096\ntrain:\n  epochs: 1\n  warmup_epochs: 0\n  freeze_last_layer: 0\n  batch_size_per_gpu: %s\n  precision: fp32\n  log_every: 1\n%baugment:\n  global_crop_size: 64\n  local_crop_size: 32\n  local_crops_number: 2\n' \
    "$1" "$WORK/out" "$WORK/data/Training" "$BATCH" "$2" >"$WORK/$1.yaml"
}
median_steps() { # stderr file -> median of the step: fields after WARMUP
  grep -o 'step: [0-9.]*s' "$1" | tr -dc '0-9.\n' | tail -n +$((WARMUP + 1)) | sort -g |
    awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'
}
cfg rust1 "" ; cfg ddp_after "  ddp_overlap: false\n"; cfg ddp_overlap "  ddp_overlap: true\n"; cfg fsdp "  strategy: fsdp\n"
declare -A T
for round in $(seq "$ROUNDS"); do
  for v in rust1 ddp_after ddp_overlap fsdp; do
    rm -rf "$WORK/out/$v"
    n=2; [[ $v == rust1 ]] && n=1
    "$TRAINER" launch --nproc $n --master-port $((29400 + RANDOM % 300)) -- train --config "$WORK/$v.yaml" --threads 1 \
      --max-steps $((WARMUP + STEPS)) 2>"$WORK/err" || { cat "$WORK/err" >&2; exit 1; }
    T[$v]="${T[$v]:-} $(median_steps "$WORK/err")"
  done
  for n in 1 2; do
    out=$("$VENV/bin/torchrun" --standalone --nproc_per_node $n "$ROOT/bench/ddp_step.py" --batch "$BATCH" \
      --warmup $WARMUP --iters "$STEPS" 2>/dev/null)
    T[py$n]="${T[py$n]:-} $(echo "$out" | "$VENV/bin/python" -c 'import json,sys; print(json.loads(sys.stdin.read())["median_step_s"])')"
  done
done
med() { echo "$@" | tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
echo "load average before: $LOAD0, after: $(cut -d' ' -f1-3 /proc/loadavg); batch $BATCH per rank, $STEPS steps x $ROUNDS rounds"
printf '%-28s %10s %14s\n' variant "s/step" "vs 1 rank"
r1=$(med ${T[rust1]}); p1=$(med ${T[py1]})
for v in rust1 ddp_after ddp_overlap fsdp; do
  m=$(med ${T[$v]}); printf '%-28s %10.3f %14.2f\n' "ours $v" "$m" "$(echo "$m / $r1" | bc -l)"
done
for n in 1 2; do
  m=$(med ${T[py$n]}); printf '%-28s %10.3f %14.2f\n' "pytorch ${n} rank(s) (DDP)" "$m" "$(echo "$m / $p1" | bc -l)"
done
echo "raw (s/step per round): $(for k in "${!T[@]}"; do printf '%s:[%s] ' "$k" "${T[$k]# }"; done)"
