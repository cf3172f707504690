#!/usr/bin/env bash
# The GPU image, built and checked offline, for releases (docs/image.md, "The GPU image
# offline"). Builds the NCCL trainer and the launcher (release), stages them with the CUDA,
# cuDNN and NCCL libraries of the torch wheel, builds the image through `launcher image build`
# from the local Debian base (BINARIES=prebuilt, the Containerfile's documented offline build,
# with --prebuilt-dir holding the NCCL trainer), then checks inside the image, with no GPU and
# no driver:
#   - ldd of both binaries: every shared library resolves (no "not found"), and every staged
#     library too, except the driver's libcuda.so.1 (the NVIDIA runtime injects it at start);
#   - `trainer --version` names torch, CUDA, cuDNN and NCCL;
#   - `trainer selftest` exits 0 and reports each GPU check as skipped, with its reason;
# and reports the image's size uncompressed (the engine's) and compressed (the layers pushed to
# the loopback registry, read back with `launcher image inspect --registry`), and with
# --squash the Enroot squashfs's. About 6 minutes with the binaries built, but 12 GB of free
# disk at the build's peak, so not a CI step: run it before a release (docs/image.md keeps the
# last run's figures).
#
# usage: scripts/gpu-image.sh [--squash] [--keep] [--bin-dir DIR]
#   --squash  also write the squashfs (launcher image squash) and report its size and time
#   --bin-dir use the binaries in DIR instead of building them: DIR/trainer-nccl (the name
#             scripts/test.sh gives the NCCL build), else DIR/trainer, which must be the NCCL
#             build; and DIR/launcher. After scripts/test.sh: --bin-dir target/release
#   --keep    keep the image (scdino-gpu-check:REV, local and in the registry) and the engine
#             running; by default both images are removed at exit, and an engine this script
#             started is stopped again
# Environment: SCDINO_VENV (default .venv), CARGO_TARGET_DIR (default target/),
# CUDA_EXTRA_INCLUDE (default: scripts/nccl-headers.sh fetches the two header wheels the NCCL
# build needs, the only step that may use the network).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SQUASH=0 KEEP=0 BIN_DIR=
while (($#)); do
  case $1 in
  --squash) SQUASH=1 ;;
  --keep) KEEP=1 ;;
  --bin-dir) BIN_DIR=${2:?--bin-dir needs a folder}; shift ;;
  *) echo "usage: $0 [--squash] [--keep] [--bin-dir DIR]" >&2; exit 2 ;;
  esac
  shift
done
VENV=${SCDINO_VENV:-$ROOT/.venv}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export PATH="$VENV/bin:$PATH" LIBTORCH_USE_PYTORCH=1
cd "$ROOT"
say() { printf '[gpu-image] %s\n' "$*" >&2; }
secs() { date +%s.%N; }
since() { printf '%.0f' "$(echo "$(secs) - $1" | bc)"; }
fail() { say "FAILED: $*"; exit 1; }

# 1. The binaries: the NCCL trainer (ProcessGroupNCCL, libtorch_cuda linked) and the launcher.
W=$(mktemp -d "${TMPDIR:-/tmp}/scdino-gpu-image.XXXXXX")
trap 'rm -rf "$W"' EXIT
mkdir "$W/bin"
if [[ -n $BIN_DIR ]]; then
  trainer=$BIN_DIR/trainer-nccl
  [[ -x $trainer ]] || trainer=$BIN_DIR/trainer
  cp "$trainer" "$W/bin/trainer"
  cp "$BIN_DIR/launcher" "$W/bin/launcher"
else
  if [[ -z ${CUDA_EXTRA_INCLUDE:-} ]]; then
    "$ROOT/scripts/nccl-headers.sh" >/dev/null
  fi
  t0=$(secs)
  say "cargo build --release -p trainer --features nccl; cargo build --release -p launcher"
  cargo build --release --quiet -p trainer --features nccl --bin trainer
  # Copied out at once: a later plain build of the workspace overwrites target/release/trainer.
  cp "$TARGET/release/trainer" "$W/bin/trainer"
  cargo build --release --quiet -p launcher
  cp "$TARGET/release/launcher" "$W/bin/launcher"
  say "binaries built in $(since "$t0") s"
fi
L=$W/bin/launcher
readelf -d "$W/bin/trainer" | grep -q '\[libtorch_cuda.so\]' ||
  { say "FAILED: $W/bin/trainer is not the NCCL build (no libtorch_cuda)"; exit 1; }

# 2. The engine, the loopback registry and the Debian base (scripts/docker-local.sh).
STARTED=0
if ! "$ROOT/scripts/docker-local.sh" status >/dev/null 2>&1 &&
  ! curl -sf --unix-socket /var/run/docker.sock http://localhost/_ping >/dev/null 2>&1; then
  STARTED=1
fi
"$ROOT/scripts/docker-local.sh" start
eval "$("$ROOT/scripts/docker-local.sh" env)"
REV=$(git rev-parse --short HEAD 2>/dev/null || echo dev)
NAME=scdino-gpu-check
IMG=$NAME:$REV
REMOTE=$SCDINO_TEST_REGISTRY/$NAME/trainer:$REV
cleanup() {
  rm -rf "$W"
  if [[ $KEEP == 0 ]]; then
    "$ROOT/scripts/docker-local.sh" clean-tests "$NAME" || true
    if [[ $STARTED == 1 ]]; then
      "$ROOT/scripts/docker-local.sh" stop || true
    else
      # clean-tests stops the registry to collect its blobs; the engine's owner expects it up.
      "$ROOT/scripts/docker-local.sh" start >/dev/null 2>&1 || true
    fi
  fi
}
trap cleanup EXIT

# The engine holds the 3.5 GB payload three times at the peak of the build (the received
# context, the build stage's copy of it, the runtime layer) and the registry its compressed
# layers: refuse early rather than fill a shared disk half-way through.
need_gb=${SCDINO_GPU_IMAGE_MIN_FREE_GB:-12}
root_dir=$(docker info -f '{{.DockerRootDir}}')
free_gb=$(($(df --output=avail -k "$root_dir" | tail -n 1) / 1024 / 1024))
((free_gb >= need_gb)) ||
  fail "$free_gb GB free under $root_dir, the build needs about $need_gb GB (SCDINO_GPU_IMAGE_MIN_FREE_GB overrides)"

# 3. The build: the Containerfile's offline build, the NCCL trainer as the prebuilt one.
say "launcher image build $IMG (BINARIES=prebuilt, base $SCDINO_BASE_IMAGE)"
t0=$(secs)
"$L" image build --tag "$IMG" --tag "$REMOTE" --network host --prebuilt-dir "$W/bin" \
  --build-arg "CUDA_IMAGE=$SCDINO_BASE_IMAGE" --build-arg EFA_INSTALLER_VERSION=none \
  --build-arg BINARIES=prebuilt >"$W/build.out" 2>"$W/build.log" ||
  { tail -n 30 "$W/build.log" >&2; fail "launcher image build"; }
build_s=$(since "$t0")
say "built in $build_s s: $(head -n 1 "$W/build.out")"
# The build stage's image (the context's copy of the payload) is not part of the result.
docker image prune -f >/dev/null

in_image() { docker run --rm --network none --entrypoint /bin/sh "$IMG" -c "$1"; }

# 4. Checks inside the image.
ldd_bins=$(in_image 'ldd /opt/scdino/bin/trainer /opt/scdino/bin/launcher')
if grep -q 'not found' <<<"$ldd_bins"; then
  grep 'not found' <<<"$ldd_bins" >&2
  fail "a library of the binaries does not resolve"
fi
nlibs=$(grep -o '=> /opt/scdino/bin/\.\./lib/[^ ]*' <<<"$ldd_bins" | sort -u | wc -l)
libs_ldd=$(in_image 'for f in /opt/scdino/lib/*.so*; do ldd "$f" | sed "s|^|${f##*/}: |"; done')
libs_unresolved=$(grep 'not found' <<<"$libs_ldd" | grep -Ev ':[[:space:]]+libcuda\.so\.1 ' || true)
[[ -z $libs_unresolved ]] || { echo "$libs_unresolved" >&2; fail "a staged library does not resolve"; }
need_driver=$(grep 'not found' <<<"$libs_ldd" | grep -E ':[[:space:]]+libcuda\.so\.1 ' |
  cut -d: -f1 | sort -u | paste -sd' ')
staged=$(in_image 'echo "$(ls /opt/scdino/lib | wc -l) libraries, $(($(du -sb /opt/scdino | cut -f1) / 1000000)) MB"')
say "ldd: both binaries resolve every library ($nlibs from /opt/scdino/lib); /opt/scdino: $staged"

version=$(docker run --rm --network none "$IMG" --version)
say "trainer --version: $(tr '\n' ' ' <<<"$version")"
for want in 'torch [0-9]' 'CUDA [0-9]' 'cuDNN [0-9]' 'NCCL [0-9][^ ]* \(nccl feature\)'; do
  grep -Eq "$want" <<<"$version" || fail "trainer --version does not name '$want'"
done

set +e
selftest=$(docker run --rm --network none "$IMG" selftest 2>&1)
selftest_rc=$?
set -e
printf '%s\n' "$selftest" >&2
[[ $selftest_rc == 0 ]] || fail "trainer selftest exited $selftest_rc"
for check in 'cuda' 'train step gpu fp32' 'train step gpu bf16' 'train step gpu fp16' \
  'augment gpu vs cpu'; do
  grep -Eq "^$check +skip +[^ ]" <<<"$selftest" || fail "selftest: '$check' is not skipped with a reason"
done
grep -q 'FAIL' <<<"$selftest" && fail "selftest reports a failure"

# 5. Sizes: the engine's (uncompressed), the registry's (compressed layers), the squashfs's.
size=$(docker image inspect -f '{{.Size}}' "$IMG")
# The squash first: it holds the exported rootfs and the file (-noD: uncompressed data) at
# once, before the registry holds the pushed layers.
squash_line=
if [[ $SQUASH == 1 ]]; then
  t0=$(secs)
  sq=$("$L" image squash "$IMG" --out "$W/sq" 2>"$W/squash.log") ||
    { tail -n 20 "$W/squash.log" >&2; fail "launcher image squash"; }
  squash_line=$(printf 'squashfs (lzo, -noD): %.0f MB in %s s\n' \
    "$(echo "$(stat -c %s "$sq") / 1000000" | bc -l)" "$(since "$t0")")
  rm -f "$sq"
fi
t0=$(secs)
"$L" image push "$REMOTE" --plain-http >/dev/null 2>"$W/push.log" ||
  { tail -n 20 "$W/push.log" >&2; fail "launcher image push"; }
push_s=$(since "$t0")
comp=$("$L" image inspect "$REMOTE" --registry --plain-http --json |
  "$VENV/bin/python" -c 'import json,sys; print(sum(l["size"] for l in json.load(sys.stdin)["manifest"]["layers"]))')

# 6. The record (docs/image.md keeps the last one).
cat <<EOF
GPU image check passed: $(date -u +%Y-%m-%dT%H:%MZ), $(uname -n), $(nproc) CPUs, commit $REV
$(tr '\n' ' ' <<<"$version" | sed 's/ *$//')
build (launcher image build, BINARIES=prebuilt, local base cached): $build_s s; push to the loopback registry: $push_s s
/opt/scdino: 2 binaries, $staged; ldd: both binaries resolve every library ($nlibs from /opt/scdino/lib); staged libraries needing the driver's libcuda.so.1 (injected at start): ${need_driver:-none}; nothing else unresolved
selftest: exit 0, GPU checks skipped ("no CUDA device visible")
image size: $(printf '%.0f' "$(echo "$size / 1000000" | bc -l)") MB uncompressed, $(printf '%.0f' "$(echo "$comp / 1000000" | bc -l)") MB compressed (pushed layers)
$squash_line
EOF
