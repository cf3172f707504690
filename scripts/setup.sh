#!/usr/bin/env bash
# One idempotent setup step for a fresh Debian machine: system packages, the project venv
# (torch 2.13.0 for tch, plus the Python oracles the tests use) and a release build.
# A second run only verifies and returns within seconds.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SCDINO_VENV:-$ROOT/.venv}
REQ=$ROOT/scripts/requirements.txt
log() { printf '[setup] %s\n' "$*" >&2; }

# System packages: a C++ compiler for torch-sys, the venv module, patchelf. Installed only if missing.
missing=()
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
# patchelf: scripts/stage-runtime.sh rewrites the staged binaries' rpath for the image.
command -v patchelf >/dev/null 2>&1 || missing+=(patchelf)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    log "missing system packages: ${missing[*]}; install them (apt-get install ${missing[*]}) and rerun"
    exit 1
  fi
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  log "cargo not found: install a Rust toolchain (1.89 or newer, e.g. with rustup) and rerun"
  exit 1
fi

# The venv, reinstalled only when requirements.txt changes.
stamp=$VENV/.requirements.sha256
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ ! -x $VENV/bin/python || ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  log "creating venv $VENV (torch is ~4.7 GB, about 2 minutes)"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r "$REQ"
  # Oracles whose declared requirements would move pinned versions: without them.
  nodeps=$(sed -n 's/^# nodeps: //p' "$REQ")
  [[ -z $nodeps ]] || "$VENV/bin/python" -m pip install -q --no-deps $nodeps
  echo "$want" >"$stamp"
fi

# Build with tch pointed at the venv's libtorch; build.rs embeds the rpath.
log "building (first build ~5 minutes)"
cd "$ROOT"
PATH=$VENV/bin:$PATH LIBTORCH_USE_PYTORCH=1 cargo build --release --workspace --bins --quiet
log "ready: $ROOT/target/release/trainer"
