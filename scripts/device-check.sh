#!/usr/bin/env bash
# The GPU checks, for a lent GPU machine that has PyTorch but no Rust: run from the repository
# root with the binary of scripts/device-binary.sh at target/device/trainer. Writes everything
# under $OUT (default ./device-out), step by step, so a cut-short run still leaves what it did:
#   env.txt        GPU, driver, PyTorch and CUDA versions, libraries the binary cannot find
#   selftest.txt   `trainer selftest --json` (CUDA, NCCL, the training step in fp32/bf16/fp16
#                  against the CPU, device augmentation, a one-rank NCCL all-reduce, and one
#                  step under DDP and under FSDP over a one-rank NCCL group on Cuda(0)
#                  against the single-process step: hooks, buckets, shard storage on CUDA)
#   step.jsonl     one DINO training step on the GPU, ours (`trainer bench step --device cuda`)
#                  and PyTorch's (bench/train_step.py --device cuda), alternating R,P per round
#   graphs.jsonl   `train.cuda_graphs`: the same 14 steps (ViT-S, fp32 and bf16) from the same
#                  init without and with the captured step (`bench step --cuda-graphs`: 3 eager
#                  steps, capture at the 4th, 10 timed replays); graphs.txt compares the losses
#                  (relative tolerance 1e-4 fp32, 1e-2 bf16) and prints both step times
#   demo/          the demo pipeline (configs/demo.yaml) trained on the GPU, resumed after its
#                  first 3 steps: log, kNN, report
#   embed/         `trainer embed` of demo/data/Test with the demo checkpoint on the CPU (fp32)
#                  and the GPU (fp32, bf16): compare with scripts/device-compare-embed.py
# usage: [OUT=dir] [ROUNDS=2] [BATCH=64] scripts/device-check.sh
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/device-out}
ROUNDS=${ROUNDS:-2} BATCH=${BATCH:-64} THREADS=${THREADS:-8}
mkdir -p "$OUT"
T=$ROOT/target/device/trainer
PY=${PYTHON:-python3}
TORCH=$("$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))') || exit 1
export LD_LIBRARY_PATH=$TORCH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export RUST_BACKTRACE=1
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "nccl", torch.cuda.nccl.version())'
  nproc
  echo "libraries the trainer cannot find:"
  ldd "$T" | grep "not found" || echo "(none)"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

timeout 240 "$T" selftest --json --timeout 120 >"$OUT/selftest.txt" 2>&1
echo "selftest rc=$?" | tee -a "$OUT/selftest.txt"
grep -v '^@scdino-report' "$OUT/selftest.txt"

step() { # precision mode
  local common=(--arch vit_small --batch "$BATCH" --threads "$THREADS" --warmup 3 --iters 10
    --device cuda --precision "$1" --channel-mode "$2")
  timeout 120 "$T" bench step "${common[@]}" >>"$OUT/step.jsonl" 2>>"$OUT/step.err"
  timeout 120 "$PY" bench/train_step.py "${common[@]}" >>"$OUT/step.jsonl" 2>>"$OUT/step.err"
}
for _ in $(seq "$ROUNDS"); do
  for p in fp32 bf16 fp16; do step "$p" fixed; done
done
step bf16 tokens
BATCH=$((BATCH / 4)) step bf16 bag
cut -c1-400 "$OUT/step.jsonl"
tail -n 20 "$OUT/step.err" 2>/dev/null

graphs() { # precision
  local common=(--arch vit_small --batch "$BATCH" --threads "$THREADS" --warmup 4 --iters 10
    --device cuda --precision "$1")
  timeout 120 "$T" bench step "${common[@]}" >>"$OUT/graphs.jsonl" 2>>"$OUT/graphs.err"
  timeout 150 "$T" bench step "${common[@]}" --cuda-graphs >>"$OUT/graphs.jsonl" 2>>"$OUT/graphs.err"
}
for p in fp32 bf16; do graphs "$p"; done
"$PY" - "$OUT/graphs.jsonl" <<'PYEOF' 2>&1 | tee "$OUT/graphs.txt"
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
tolerance = {"fp32": 1e-4, "bf16": 1e-2}
for p, tol in tolerance.items():
    eager = [r for r in runs if r["precision"] == p and not r["cuda_graphs"]]
    graphed = [r for r in runs if r["precision"] == p and r["cuda_graphs"]]
    if not eager or not graphed:
        print(f"cuda_graphs {p}: MISSING (see graphs.err)")
        continue
    e, g = eager[0], graphed[0]
    diff = max(abs(a - b) / abs(a) for a, b in zip(e["losses"], g["losses"]))
    verdict = "PASS" if diff <= tol and len(e["losses"]) == len(g["losses"]) else "FAIL"
    print(f"cuda_graphs {p}: step {e['median_s'] * 1e3:.2f} ms eager, {g['median_s'] * 1e3:.2f} ms "
          f"graphed ({e['median_s'] / g['median_s']:.2f}x); max relative loss difference "
          f"{diff:.2e} over {len(g['losses'])} steps (tolerance {tol:g}): {verdict}")
PYEOF
tail -n 5 "$OUT/graphs.err" 2>/dev/null

mkdir -p "$OUT/demo"
{
  "$T" synth --out demo/data --seed 0 --per-class 40 &&
    # Stopped after 3 steps, so the pipeline's training resumes mid-epoch on the GPU (the
    # first GPU resume stopped at its first step: the restored centre stayed on the CPU).
    timeout 100 "$T" train --config configs/demo.yaml --max-steps 3 &&
    timeout 200 "$T" pipeline --config configs/demo.yaml
} >"$OUT/demo/pipeline.log" 2>&1
echo "demo rc=$?" | tee -a "$OUT/demo/pipeline.log"
tail -n 15 "$OUT/demo/pipeline.log"
A=demo/output/demo
find "$A" \( -name '*kNN*.txt' -o -name 'report.html' -o -name '*.jsonl' -o -name '*.json' \) \
  -size -2M -exec cp --parents {} "$OUT/demo/" \; 2>/dev/null

# `trainer embed` on the GPU (fp32 and bf16) and on the CPU, same checkpoint and images: the
# tables come back under embed/ and are compared on the Rust machine
# (scripts/device-compare-embed.py), as this machine may lack pyarrow.
mkdir -p "$OUT/embed"
CK=$(find "$A" -name checkpoint.safetensors | head -n 1)
for run in cpu-fp32 cuda-fp32 cuda-bf16; do
  timeout 120 "$T" embed --checkpoint "$CK" --images demo/data/Test --device "${run%-*}" \
    --precision "${run#*-}" --out "$OUT/embed/$run.parquet" >>"$OUT/embed/embed.log" 2>&1
  echo "embed $run rc=$?" | tee -a "$OUT/embed/embed.log"
  rm -rf "$OUT/embed/$run.parquet.parts"
done
tail -n 6 "$OUT/embed/embed.log"
du -sh "$OUT"
