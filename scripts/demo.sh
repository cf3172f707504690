#!/usr/bin/env bash
# The main job on embedded demo data: setup, synthesise the PBMC-like dataset, validate the
# config, and run the ViT-DINO student on a multi-crop batch of it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh"
cd "$ROOT"
T=target/release/trainer
$T synth --out demo/data --seed 0 --per-class 40
$T config check configs/demo.yaml
$T forward --config configs/demo.yaml
