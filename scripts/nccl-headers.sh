#!/usr/bin/env bash
# The two header sets the CUDA pip wheels lack but ProcessGroupNCCL.hpp needs when the trainer
# is built with `--features nccl` (platform-notes §4.7): crt/host_config.h (nvidia-cuda-crt)
# and nv/target (nvidia-cuda-cccl), at the CUDA minor version of the venv's runtime wheel.
# Downloads both wheels with pip (no install into the venv) and unpacks them into
# target/cuda-extra, where trainer/build.rs looks by default (CUDA_EXTRA_INCLUDE overrides).
# usage: scripts/nccl-headers.sh        (idempotent; prints the include folder)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SCDINO_VENV:-$ROOT/.venv}
DEST=$ROOT/target/cuda-extra
INC=$DEST/nvidia/cu13/include
if [[ -f $INC/crt/host_config.h && -e $INC/cccl/nv/target ]]; then
  echo "$INC"
  exit 0
fi
cuda=$("$VENV/bin/python" -c 'import importlib.metadata as m; v = m.version("nvidia-cuda-runtime"); print(".".join(v.split(".")[:2]))')
mkdir -p "$DEST/wheels"
"$VENV/bin/python" -m pip download -q --no-deps -d "$DEST/wheels" \
  "nvidia-cuda-crt==$cuda.*" "nvidia-cuda-cccl==$cuda.*" >&2
for w in "$DEST"/wheels/*.whl; do
  "$VENV/bin/python" -m zipfile -e "$w" "$DEST"
done
[[ -f $INC/crt/host_config.h && -e $INC/cccl/nv/target ]] || {
  echo "the wheels did not provide crt/host_config.h and cccl/nv/target under $INC" >&2
  exit 1
}
echo "$INC"
