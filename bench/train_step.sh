#!/usr/bin/env bash
# Rust (tch) vs PyTorch: one full DINO training step (teacher on the 2 global crops, student on
# all crops, loss + centre, backward, per-parameter clip, AdamW, teacher EMA; fp32), multi-crop
# 2×224² + 8×96², 5 channels, 65536 prototypes, for vit_tiny and vit_small, with the loader
# excluded (random crops in memory) and included (each side's real input pipeline over the same
# synthetic TIFF folder: Rust = EpochLoader threads, PyTorch = torch DataLoader processes with
# scDINO's dataset and torchvision DataAugmentationDINO). Same threads and shapes, one
# invocation; runs alternate R,P,R,P,... for ROUNDS rounds so machine noise hits both sides.
# Also measures an fp32 matmul peak (4096², both sides) and reports achieved FLOP/s (FLOPs of
# one step counted by torch.utils.flop_counter on the PyTorch side; the Rust step does the
# same math) as a fraction of it.
# usage: [ARCHS="vit_tiny vit_small"] [RUNS_OUT=file.jsonl] bench/train_step.sh [BATCH] [THREADS] [ITERS] [ROUNDS] [WORKERS]
# RUNS_OUT keeps the raw JSON line of every run (per-step times, data waits, FLOPs, peaks).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh" >/dev/null 2>&1 || "$ROOT/scripts/setup.sh"
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
TRAINER=$ROOT/target/release/trainer
BATCH=${1:-4} THREADS=${2:-2} ITERS=${3:-3} ROUNDS=${4:-3} WORKERS=${5:-1}
WARMUP=1
read -r -a ARCH_LIST <<<"${ARCHS:-vit_tiny vit_small}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RUNS=$WORK/runs.jsonl
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

# Enough images for WARMUP+ITERS batches of one epoch (8 classes).
per_class=$(((BATCH * (WARMUP + ITERS) + 7) / 8))
((per_class < 8)) && per_class=8
"$TRAINER" synth --out "$WORK/data" --seed 0 --per-class "$per_class" >/dev/null
DATA=$WORK/data/Training

for _ in 1 2; do
  "$TRAINER" bench matmul --n 4096 --threads "$THREADS" --reps 3 >>"$RUNS"
  "$PY" "$ROOT/bench/matmul_peak.py" --n 4096 --threads "$THREADS" --reps 3 >>"$RUNS"
done

for arch in "${ARCH_LIST[@]}"; do
  common=(--arch "$arch" --batch "$BATCH" --threads "$THREADS" --warmup "$WARMUP" --iters "$ITERS")
  real=(--loader real --data "$DATA" --workers "$WORKERS")
  flops=(--count-flops)
  for _ in $(seq "$ROUNDS"); do
    "$TRAINER" bench step "${common[@]}" --loader none >>"$RUNS"
    "$PY" "$ROOT/bench/train_step.py" "${common[@]}" --loader none "${flops[@]}" >>"$RUNS"
    flops=()
    "$TRAINER" bench step "${common[@]}" "${real[@]}" >>"$RUNS"
    "$PY" "$ROOT/bench/train_step.py" "${common[@]}" "${real[@]}" >>"$RUNS"
  done
done

[[ -n ${RUNS_OUT:-} ]] && cp "$RUNS" "$RUNS_OUT"
echo "load average (1/5/15 min) at start: $LOAD0, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$RUNS" "$WORKERS" <<'PYEOF'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
workers = sys.argv[2]
peaks = {r["impl"]: [] for r in runs if r["bench"] == "matmul"}
for r in runs:
    if r["bench"] == "matmul":
        peaks[r["impl"]].append(r["gflops"])
peak = max(max(v) for v in peaks.values())
flops = {r["arch"]: r["flops_per_step"] for r in runs if "flops_per_step" in r}
print(f"fp32 matmul 4096², best: Rust {max(peaks['rust-tch']):.1f} GFLOP/s, "
      f"PyTorch {max(peaks['pytorch']):.1f} GFLOP/s; peak used = {peak:.1f} GFLOP/s")
print("FLOPs per step (FlopCounterMode: teacher fwd + student fwd/bwd): "
      + ", ".join(f"{a} {f / 1e9:.1f} G" for a, f in flops.items()))
print()
print("| arch | loader | batch/crop | threads | workers | timed steps/side | Rust imgs/s | PyTorch imgs/s "
      "| Rust/PyTorch | Rust data wait s/step | PyTorch data wait s/step "
      "| Rust GFLOP/s (% peak) | PyTorch GFLOP/s (% peak) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
keys = []
for r in runs:
    if r["bench"] == "step" and (r["arch"], r["loader"]) not in keys:
        keys.append((r["arch"], r["loader"]))
for arch, loader in keys:
    side = {}
    for impl in ("rust-tch", "pytorch"):
        rs = [r for r in runs if r["bench"] == "step" and r["impl"] == impl
              and r["arch"] == arch and r["loader"] == loader]
        times = sorted(t for r in rs for t in r["times_s"])
        waits = sorted(w for r in rs for w in r["data_wait_s"])
        med = times[len(times) // 2]
        side[impl] = (rs[0]["batch"] / med, waits[len(waits) // 2], flops[arch] / med / 1e9,
                      len(times), rs[0])
    (ri, rw, rg, n, r0), (pi, pw, pg, _, _) = side["rust-tch"], side["pytorch"]
    w = workers if loader == "real" else "-"
    print(f"| {arch} | {loader} | {r0['batch']} | {r0['threads']} | {w} | {n} | {ri:.3f} | {pi:.3f} "
          f"| {ri / pi:.3f} | {rw:.3f} | {pw:.3f} | {rg:.1f} ({100 * rg / peak:.0f} %) "
          f"| {pg:.1f} ({100 * pg / peak:.0f} %) |")
PYEOF
