#!/usr/bin/env bash
# Builds a stripped `trainer` with the NCCL shim against another PyTorch than the venv's, for a
# GPU machine with an older PyTorch and no Rust (the lent GPU machines have PyTorch 2.11 +
# CUDA 13; the workspace pins tch 0.26, which needs 2.13). tch's generated ops differ between
# its releases only by ops this project does not call, so the same source builds against the
# tch release of that PyTorch; the copy in target/device/src gets that tch pinned.
# The binary carries no usable rpath there: run it with LD_LIBRARY_PATH=<torch>/lib
# (scripts/device-check.sh does).
# usage: scripts/device-binary.sh [TORCH_VERSION]        (default 2.11.0) -> target/device/trainer
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TORCH=${1:-2.11.0}
case $TORCH in
  2.11.*) TCH=0.24.0 ;;
  2.12.*) TCH=0.25.0 ;;
  2.13.*) TCH=0.26.0 ;;
  *) echo "no tch release known for torch $TORCH (2.11, 2.12, 2.13 are)" >&2; exit 2 ;;
esac
OUT=$ROOT/target/device
VENV=$OUT/venv-$TORCH
if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "torch==$TORCH" numpy
fi
SRC=$OUT/src
rm -rf "$SRC"
mkdir -p "$SRC"
# The working tree as git sees it (tracked and not-ignored files), edits included.
git -C "$ROOT" ls-files -co --exclude-standard -z | tar -C "$ROOT" --null -T - -cf - | tar -C "$SRC" -xf -
sed -i "s/^tch = \"[^\"]*\"/tch = \"=$TCH\"/" "$SRC/Cargo.toml"
INC=$(SCDINO_VENV=$VENV "$ROOT/scripts/nccl-headers.sh")
export PATH=$VENV/bin:$PATH LIBTORCH_USE_PYTORCH=1 PYTHON=$VENV/bin/python
export CUDA_EXTRA_INCLUDE=$INC:$INC/cccl CARGO_TARGET_DIR=$OUT/target
cd "$SRC"
cargo update -q -p tch --precise "$TCH"
cargo build -q --release -p trainer --features nccl --bin trainer
cp "$OUT/target/release/trainer" "$OUT/trainer"
strip "$OUT/trainer"
ls -l "$OUT/trainer"
