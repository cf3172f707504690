#!/usr/bin/env bash
# Stages what the runtime image needs of a build: the binaries into OUT/bin and every shared
# library they load that is not part of the base system (libtorch, c10, the CUDA/NCCL wheels'
# libraries, the wheel's libgomp) into OUT/lib, flat. The binaries carry the rpath
# $ORIGIN/../lib (trainer/build.rs), and the torch wheel's libraries carry $ORIGIN, so OUT runs
# from any prefix with no LD_LIBRARY_PATH and no path of the build machine.
#
# usage: scripts/stage-runtime.sh OUT BINARY...
# Used by the Containerfile's source build and by `launcher image build` for BINARIES=prebuilt
# (on the host), so both images hold the same set of files. System libraries (/lib, /usr/lib,
# /lib64) are left to the base image; a library ldd cannot resolve is an error.
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 OUT BINARY..." >&2; exit 2; }
OUT=$1
shift
mkdir -p "$OUT/bin" "$OUT/lib"
for bin in "$@"; do
  [[ -x $bin ]] || { echo "stage-runtime: $bin is not an executable" >&2; exit 1; }
  cp -L "$bin" "$OUT/bin/"
  if ldd "$bin" | grep -q 'not found'; then
    echo "stage-runtime: $bin has unresolved libraries:" >&2
    ldd "$bin" | grep 'not found' >&2
    exit 1
  fi
  # Lines look like `libc10.so => /path/libc10.so (0x...)`; keep resolved paths off the system.
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    case $lib in
    /lib/* | /lib64/* | /usr/lib/* | /usr/lib64/*) ;;
    *) cp -L -n "$lib" "$OUT/lib/" ;;
    esac
  done
done
echo "stage-runtime: $(ls "$OUT/bin" | wc -l) binaries, $(ls "$OUT/lib" | wc -l) libraries, $(du -sh "$OUT" | cut -f1) in $OUT" >&2
