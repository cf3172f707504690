#!/usr/bin/env bash
# Stages what the runtime image needs of a build: the binaries into OUT/bin and every shared
# library they load that is not part of the base system (libtorch, c10, the CUDA/NCCL wheels'
# libraries, the wheel's libgomp) into OUT/lib, flat. The built binaries carry two rpaths
# (trainer/build.rs): $ORIGIN/../lib and the build machine's venv torch/lib, so they run from
# target/ too; the staged copies are rewritten (patchelf) to $ORIGIN/../lib alone, and checked.
# The torch wheel's libraries carry $ORIGIN, so OUT runs from any prefix with no
# LD_LIBRARY_PATH and no library path of the build machine.
#
# usage: scripts/stage-runtime.sh OUT BINARY...
# Used by the Containerfile's source build and by `launcher image build` for BINARIES=prebuilt
# (on the host), so both images hold the same set of files. System libraries (/lib, /usr/lib,
# /lib64) are left to the base image; a library ldd cannot resolve is an error.
#
# ldd only sees DT_NEEDED. Libraries that libtorch's CUDA stack opens with dlopen at run time
# are staged as companions of the library that opens them, with their own closure:
#   libcudnn.so.9     -> libcudnn_*.so.9 (the engines, ops, cnn, adv, graph, heuristic parts)
#   libnvrtc.so.*     -> libnvrtc-builtins*.so* (NVRTC's builtins)
#   libtorch_cuda.so  -> libcaffe2_nvrtc.so (lazy NVRTC), libtorch_cuda_linalg.so (lazy cuSOLVER)
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 OUT BINARY..." >&2; exit 2; }
OUT=$1
shift
mkdir -p "$OUT/bin" "$OUT/lib"

# Copies the non-system libraries ELF file $1 needs (and, for the families above, the
# companions next to them) into OUT/lib, recursively through the companions.
stage_deps() {
  local file=$1 lib dir base companion
  # The driver's libcuda.so.1 is not ours to ship: the NVIDIA container runtime (or Enroot's
  # 98-nvidia hook) injects the host's at start.
  if ldd "$file" | grep 'not found' | grep -qv '^[[:space:]]*libcuda\.so\.1 '; then
    echo "stage-runtime: $file has unresolved libraries:" >&2
    ldd "$file" | grep 'not found' >&2
    exit 1
  fi
  # Lines look like `libc10.so => /path/libc10.so (0x...)`; keep resolved paths off the system.
  while read -r lib; do
    case $lib in
    /lib/* | /lib64/* | /usr/lib/* | /usr/lib64/*) continue ;;
    esac
    base=${lib##*/}
    [[ -e $OUT/lib/$base ]] && continue
    place "$lib"
    dir=$(dirname "$(readlink -f "$lib")")
    case $base in
    libcudnn.so.*) companions=("$dir"/libcudnn_*.so*) ;;
    libnvrtc.so.*) companions=("$dir"/libnvrtc-builtins*.so*) ;;
    libtorch_cuda.so) companions=("$dir"/libcaffe2_nvrtc.so "$dir"/libtorch_cuda_linalg.so) ;;
    *) companions=() ;;
    esac
    for companion in "${companions[@]}"; do
      [[ -e $companion && ! -e $OUT/lib/${companion##*/} ]] || continue
      place "$companion"
      stage_deps "$companion"
    done
  done < <(ldd "$file" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
}

# A library is hard-linked where OUT shares the venv's filesystem, else copied: the CUDA stack
# of the NCCL build is 3.5 GB, and only the binaries are ever modified (patchelf, on copies).
place() { cp -lL "$1" "$OUT/lib/" 2>/dev/null || cp -L "$1" "$OUT/lib/"; }

command -v patchelf >/dev/null || { echo "stage-runtime: patchelf is missing (apt-get install patchelf)" >&2; exit 1; }
for bin in "$@"; do
  [[ -x $bin ]] || { echo "stage-runtime: $bin is not an executable" >&2; exit 1; }
  staged=$OUT/bin/${bin##*/}
  cp -L "$bin" "$staged"
  stage_deps "$bin"
  # shellcheck disable=SC2016 # $ORIGIN is for the dynamic loader, not the shell
  patchelf --set-rpath '$ORIGIN/../lib' "$staged"
  # shellcheck disable=SC2016
  [[ $(patchelf --print-rpath "$staged") == '$ORIGIN/../lib' ]] ||
    { echo "stage-runtime: $staged kept rpath $(patchelf --print-rpath "$staged")" >&2; exit 1; }
done
echo "stage-runtime: $(ls "$OUT/bin" | wc -l) binaries, $(ls "$OUT/lib" | wc -l) libraries, $(du -sh "$OUT" | cut -f1) in $OUT" >&2
