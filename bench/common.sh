# Sourced by the bench scripts (not run): the repository root, the trainer and the Python a
# benchmark runs, and the one way a peer's wall time joins its JSON record, so that every
# script resolves the binaries and times peers the same way.
# TRAINER set: that binary as it is (no setup, no build: e.g. one built against another
# libtorch, or a GPU machine without Rust). Unset: scripts/setup.sh (venv, release build; quiet
# unless it fails) and the release binary.
# PYTHON set: that interpreter; else the venv's (SCDINO_VENV overrides where), else python3.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${TRAINER:-} ]]; then
  "$ROOT/scripts/setup.sh" >/dev/null 2>&1 || "$ROOT/scripts/setup.sh"
  TRAINER=${CARGO_TARGET_DIR:-$ROOT/target}/release/trainer
fi
PY=${PYTHON:-${SCDINO_VENV:-$ROOT/.venv}/bin/python}
[[ -x $PY ]] || PY=python3

# Prints the JSON object of file $1 with "wall_s" = $3 - $2 (seconds since the epoch, as
# `date +%s.%N` gives them) added: a peer process's wall time beside what it reports itself.
with_wall() {
  "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); d["wall_s"]=float(sys.argv[3])-float(sys.argv[2]); print(json.dumps(d))' \
    "$1" "$2" "$3"
}
