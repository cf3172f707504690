#!/usr/bin/env bash
# Rust (`trainer knn`) vs Python (scDINO's global weighted kNN as trainer/tests/py/knn_reference.py
# implements it) at scDINO scale: N = 113,564 L2-normalised 384-d features of 8 classes
# (clustered Gaussian, seeded), split 80/20 inside (90,851 train / 22,713 test), k = 5 10 50 100
# 200 500, T = 0.1, same seed. The features are generated once (bench/knn.py gen) as the
# safetensors bundle `trainer knn` reads; both sides read that same file. Same thread count on
# both sides. Runs alternate R,P,R,P,... for ROUNDS rounds; the script fails unless every run's
# top-1/top-2 counts agree exactly for every k.
# Timings: wall clock of the whole `trainer knn` process (start, bundle read + checksum, kNN,
# confusion PNG, JSON/txt outputs) vs the Python peer's process (interpreter + torch import,
# bundle read, kNN); the peer also reports its load and kNN seconds separately.
# usage: [DTYPE=f64|f32] [RUNS_OUT=file.jsonl] bench/knn.sh [THREADS] [ROUNDS] [ROWS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
THREADS=${1:-2} ROUNDS=${2:-1} ROWS=${3:-113564}
DTYPE=${DTYPE:-f64}
KS=5,10,50,100,200,500 T=0.1 SEED=40
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RUNS=$WORK/runs.jsonl
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

g0=$(date +%s.%N)
"$PY" "$ROOT/bench/knn.py" gen --out "$WORK" --rows "$ROWS" --dtype "$DTYPE" --seed "$SEED" \
  --ks "$KS" --temperature "$T" --noise 0.25 >"$WORK/gen.json"
gen_s=$(echo "$(date +%s.%N) - $g0" | bc)
CFG=$WORK/knn.yaml
BUNDLE=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["bundle"])' "$WORK/gen.json")
JSON=$(dirname "$(dirname "$BUNDLE")")/kNN/bench_knn_metrics.json

for _ in $(seq "$ROUNDS"); do
  t0=$(date +%s.%N)
  "$TRAINER" knn --config "$CFG" --tag bench --threads "$THREADS" >/dev/null
  t1=$(date +%s.%N)
  "$PY" - "$JSON" "$t0" "$t1" "$THREADS" >>"$RUNS" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({"impl": "rust", "threads": int(sys.argv[4]), "wall_s": float(sys.argv[3]) - float(sys.argv[2]),
                  "n_train": d["n_train"], "n_test": d["n_test"], "chunk": d["chunk_size"],
                  "results": [{"k": r["k"], "top1": r["top1_correct"], "top2": r["top2_correct"],
                               "total": r["total"], "top1_percent": r["top1_percent"],
                               "top2_percent": r["top2_percent"]} for r in d["results"]]}))
PYEOF
  t0=$(date +%s.%N)
  "$PY" "$ROOT/bench/knn.py" peer --bundle "$BUNDLE" --seed "$SEED" --ks "$KS" --temperature "$T" \
    --threads "$THREADS" >"$WORK/peer.json"
  t1=$(date +%s.%N)
  with_wall "$WORK/peer.json" "$t0" "$t1" >>"$RUNS"
done

[[ -n ${RUNS_OUT:-} ]] && cp "$RUNS" "$RUNS_OUT"
echo "load average (1/5/15 min) at start: $LOAD0, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "features: $ROWS x 384 $DTYPE, 8 classes, generated + written in ${gen_s}s (not timed below)"
"$PY" - "$RUNS" <<'PYEOF'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
rust = [r for r in runs if r["impl"] == "rust"]
py = [r for r in runs if r["impl"] == "python"]
ref = rust[0]
for r in runs:
    assert (r["n_train"], r["n_test"]) == (ref["n_train"], ref["n_test"]), r
    got = [(x["k"], x["top1"], x["top2"]) for x in r["results"]]
    want = [(x["k"], x["top1"], x["top2"]) for x in ref["results"]]
    assert got == want, f"top-1/top-2 counts differ: {r['impl']} {got} vs rust {want}"
print(f"top-1/top-2 counts identical in all {len(runs)} runs "
      f"(n_train {ref['n_train']}, n_test {ref['n_test']}, chunk {ref['chunk']})")
print("| k | top-1 correct | top-2 correct | top-1 % | top-2 % |")
print("|---|---|---|---|---|")
for x in ref["results"]:
    print(f"| {x['k']} | {x['top1']} | {x['top2']} | {x['top1_percent']:.2f} | {x['top2_percent']:.2f} |")
med = lambda v: sorted(v)[len(v) // 2]
rw, pw = med([r["wall_s"] for r in rust]), med([r["wall_s"] for r in py])
pl, pk = med([r["load_s"] for r in py]), med([r["knn_s"] for r in py])
print()
print("| threads | runs/side | Rust wall s | Python wall s | Python load s | Python kNN s | Python/Rust (wall) |")
print("|---|---|---|---|---|---|---|")
print(f"| {ref['threads']}/{py[0]['threads']} | {len(rust)} | {rw:.1f} | {pw:.1f} | {pl:.1f} | {pk:.1f} | {pw / rw:.2f} |")
print("raw wall s: rust " + ", ".join(f"{r['wall_s']:.1f}" for r in rust)
      + "; python " + ", ".join(f"{r['wall_s']:.1f}" for r in py))
PYEOF
