#!/usr/bin/env bash
# The learning benchmarks of issues 21 and 22 as one job queue, for a lent GPU machine (PyTorch,
# no Rust, a fixed time): bench/channels_learning.sh per seed and approach (fixed + fixed_zeros,
# bag, untrained + tokens, tokens_small, bag_small) and bench/recipe.sh per variant and dataset
# (10 epochs; recipe_all and scdino_all also at 30), every run one job, in priority order, on
# P parallel workers. Each job trains on the GPU (a small ViT uses a sliver of it) and evaluates
# on the CPU. Timings taken here share the machine with P-1 other jobs: they are not a cost
# measurement (the step benchmarks are). Every 20 s what has finished (evaluations, logs, cost
# lines, configs) is packed into $OUT/results.tgz, so a run cut by its time limit still returns
# every finished job; $OUT/jobs.txt lists each job's exit status and seconds.
# Run from the repository root with the binary of scripts/device-binary.sh:
#   OUT=dir [P=10] [LIMIT=540] [WORK=/tmp/gpu-learning] bench/gpu-learning.sh
# Here (no GPU), the same queue with a local binary: TRAINER=target/release/trainer ... (slow).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=$(realpath -m "${OUT:-$ROOT/device-out}")
WORK=$(realpath -m "${WORK:-/tmp/gpu-learning}")
P=${P:-10} LIMIT=${LIMIT:-540}
PY=${PYTHON:-python3}
export TRAINER=$(realpath "${TRAINER:-$ROOT/target/device/trainer}")
if [[ -z ${NO_TORCH_LIBS:-} ]]; then
  TORCH=$("$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))') || exit 1
  export LD_LIBRARY_PATH=$TORCH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PYTHON=$PY
mkdir -p "$OUT" "$WORK/jobs"
start=$(date +%s)
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  echo "cores $(nproc)  workers $P  limit ${LIMIT}s"
  ldd "$TRAINER" | grep "not found" || echo "the trainer finds all its libraries"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# The data every job reads, written once before the workers start.
"$PY" scripts/digits.py --out "$WORK/digits4" --size 16 --channels 4 >/dev/null
"$PY" scripts/digits.py --out "$WORK/recipe-s0/data/digits16" --size 16 --channels 3 >/dev/null
"$PY" scripts/digits.py --out "$WORK/recipe-s0/data/digits12x4" --size 12 --channels 4 >/dev/null
for d in recipe-s1 recipe-s0-e30; do
  mkdir -p "$WORK/$d" && ln -sfn "$WORK/recipe-s0/data" "$WORK/$d/data"
done

# The jobs, most wanted first.
jobs() {
  local s v d
  echo "timeout 300 \"\$TRAINER\" selftest --json --timeout 120 >\"$OUT/selftest.txt\" 2>&1"
  cl() { # seed runs
    echo "SEEDS=$1 RUNS=\"$2\" DATA=$WORK/digits4 bench/channels_learning.sh $WORK/cl-s$1-${2%% *} 10 2"
  }
  for s in 0 1; do cl $s "fixed fixed_zeros"; done
  for s in 0 1; do cl $s bag; done
  for s in 0 1; do cl $s "untrained tokens"; done
  for s in 0 1; do cl $s tokens_small; done
  for s in 0 1; do cl $s bag_small; done
  recipe() { # seed dir epochs variant dataset
    echo "SEED=$1 VARIANTS=$4 DATASETS=$5 bench/recipe.sh $WORK/$2 $3 2"
  }
  recipe_matrix() { # seed: every variant on both datasets, 10 epochs
    for d in digits12x4 digits16; do
      for v in untrained scdino scdino_all recipe recipe_all scdino_koleo scdino_sk scdino_ibot \
        scdino_registers recipe_koleo recipe_sk recipe_ibot recipe_registers; do
        recipe "$1" "recipe-s$1" 10 $v $d
      done
    done
  }
  recipe_matrix 0
  for d in digits12x4 digits16; do
    for v in untrained recipe_all scdino_all; do recipe 0 recipe-s0-e30 30 $v $d; done
  done
  cl 2 "fixed fixed_zeros"
  cl 2 bag
  cl 2 "untrained tokens"
  cl 2 tokens_small
  cl 2 bag_small
  recipe_matrix 1
}

pack() {
  (cd "$WORK" && find . -path ./digits4 -prune -o -path '*/data' -prune -o -type f \
    \( -name '*_evaluation.json' -o -name '*.log' -o -name 'log.txt' -o -name 'cost.txt' \
    -o -name '*.yaml' -o -name '*.done' -o -name 'jobs.txt' -o -name 'table.md' \) -print0 |
    tar czf "$OUT/results.tgz.tmp" --null -T - && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz")
}
(while sleep 20; do pack; done) &
packer=$!

: >"$WORK/jobs.txt"
total=$(jobs | wc -l)
n=0
while IFS= read -r line; do
  n=$((n + 1))
  printf '%s\0' "$n $line"
done < <(jobs) |
  timeout "$LIMIT" xargs -0 -P "$P" -I{} bash -c '
    n=${1%% *} cmd=${1#* } s=$(date +%s)
    bash -c "$cmd" >"$0/jobs/$n.log" 2>&1
    echo "$n rc=$? $(($(date +%s) - s))s $cmd" >>"$0/jobs.txt"' "$WORK" {}
echo "queue rc=$? after $(($(date +%s) - start)) s; $(wc -l <"$WORK/jobs.txt") of $total jobs ended"
kill "$packer" 2>/dev/null
wait "$packer" 2>/dev/null
pack
cp "$WORK/jobs.txt" "$OUT/jobs.txt"
sed -n 's/ \(SEEDS\|SEED\|timeout\).*//p' "$WORK/jobs.txt" | sort -n | tr '\n' ' '
echo
grep -v 'rc=0' "$WORK/jobs.txt" || echo "every ended job exited 0"
grep -v '^@scdino-report' "$OUT/selftest.txt" 2>/dev/null | tail -n 16
du -sh "$OUT/results.tgz"
