#!/usr/bin/env bash
# scDINO's one model per channel combination against one channel-adaptive model (bag, tokens),
# trained with the same recipe (configs/digits.yaml) on the digits written with 4 channels
# (digit, two blurred copies, edges), back to back on one machine. For every combination
# (each single channel, all four, one pair) each approach's kNN/probe scores on the test folder
# land in the run's combination table; the untrained network is the same recipe at lr 1e-12 for one
# epoch (its weights move by about 1e-11). Training cost: CPU seconds of each `trainer pipeline`
# (user + system, from /usr/bin/time, analyses of the last checkpoint included) and the
# analytic FLOPs in metrics.prom. Only the last epoch's checkpoint is analysed.
# usage: bench/channels_learning.sh OUT [EPOCHS] [THREADS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh" >/dev/null 2>&1 || "$ROOT/scripts/setup.sh"
PY=${SCDINO_VENV:-$ROOT/.venv}/bin/python
TRAINER=$ROOT/target/release/trainer
OUT=$(realpath -m "${1:?usage: bench/channels_learning.sh OUT [EPOCHS] [THREADS]}")
EPOCHS=${2:-10} THREADS=${3:-2}
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
mkdir -p "$OUT"
[[ -d $OUT/data ]] || "$PY" "$ROOT/scripts/digits.py" --out "$OUT/data" --size 16 --channels 4
COMBOS='["0", "1", "2", "3", "0123", "02"]'
for run in untrained tokens fixed bag; do
  mode=$run lr=0.002
  [[ $run == untrained ]] && mode=tokens lr=1.0e-12
  sed -e "s|output_dir: digits/output|output_dir: $OUT/output|" \
    -e "s|dataset_dir: digits/data/Training|dataset_dir: $OUT/data/Training|" \
    -e "s|test_dir: digits/data/Test|test_dir: $OUT/data/Test|" \
    -e "s|name: digits$|name: $run|" \
    -e "s|channel_names: \[digit, blurred, edges\]|channel_names: [digit, blurred, edges, blurred2]|" \
    -e "s|channel_combinations: \[\"012\"\]|channel_combinations: $COMBOS|" \
    -e "s|  epochs: 30|  epochs: $EPOCHS|" -e "s|  checkpoint_every: 3|  checkpoint_every: $EPOCHS|" \
    -e "s|  lr: 0.002|  lr: $lr|" \
    -e "s|  use_bn_in_head: true|  use_bn_in_head: true\n  channels: $mode|" \
    "$ROOT/configs/digits.yaml" >"$OUT/$run.yaml"
  [[ $run == untrained ]] &&
    sed -i -e "s|  epochs: $EPOCHS|  epochs: 1|" -e "s|  checkpoint_every: $EPOCHS|  checkpoint_every: 1|" \
      -e "s|  lr: $lr|  lr: $lr\n  min_lr: $lr|" "$OUT/$run.yaml"
  "$TRAINER" config show "$OUT/$run.yaml" >/dev/null
  /usr/bin/time -f "$run cpu_seconds %U %S wall %e" -a -o "$OUT/cost.txt" \
    "$TRAINER" pipeline --config "$OUT/$run.yaml" --threads "$THREADS" >"$OUT/$run.log" 2>&1
done
cat "$OUT/cost.txt"
"$PY" - "$OUT" <<'PYEOF'
import glob, json, os, sys
out = sys.argv[1]
for path in sorted(glob.glob(os.path.join(out, "output", "*", "*_combinations.json"))):
    t = json.load(open(path))
    last = {}
    for r in t["rows"]:
        last[r["combination"]] = r  # rows are in epoch order: keep the last checkpoint
    print(f"\n{path} (model.channels: {t['model_channels']})")
    print("| combination | checkpoint | kNN top-1 % (k) | probe top-1 % | probe macro-F1 |")
    print("|---|---|---|---|---|")
    for c, r in last.items():
        knn = ", ".join(f"{v:.1f} ({k})" for k, v in r["knn_top1_percent"])
        print(f"| {c} | {r['tag']} | {knn} | {r['probe_top1_percent']:.1f} | {r['probe_macro_f1']:.3f} |")
PYEOF
