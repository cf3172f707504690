#!/usr/bin/env bash
# The main job on embedded demo data: setup, synthesise the PBMC-like dataset, validate the
# config, pretrain a ViT-DINO on it (CPU, a few minutes), extract the held-out CLS features
# and run scDINO's weighted kNN on them. Rerunning resumes/finishes.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh"
cd "$ROOT"
T=target/release/trainer
$T synth --out demo/data --seed 0 --per-class 40
$T config check configs/demo.yaml
$T train --config configs/demo.yaml
$T features --config configs/demo.yaml
$T knn --config configs/demo.yaml
echo "per-epoch log: demo/output/demo/scDINO_ViTs/demoViT_channel_APC_BF_DAPI_GREEN_PE/log.txt"
