#!/usr/bin/env bash
# The main job on embedded demo data: setup, synthesise the PBMC-like dataset, validate the
# config, then `trainer pipeline`: mean/std, ViT-DINO pretraining (CPU), CLS features, kNN,
# UMAP, attention maps and an HTML report for every kept checkpoint. Rerunning skips what is
# up to date and resumes an interrupted run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh"
cd "$ROOT"
T=target/release/trainer
$T synth --out demo/data --seed 0 --per-class 40
$T config check configs/demo.yaml
$T pipeline --config configs/demo.yaml
A=demo/output/demo/demoViT_channel_APC_BF_DAPI_GREEN_PE_analyses
tail -n 5 "$A/kNN/global_kNN.txt"
echo "report: $A/report.html"
