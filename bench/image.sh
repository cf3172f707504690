#!/usr/bin/env bash
# The image, measured: build time cold (--no-cache) and warm (unchanged tree), image size
# uncompressed (engine) and compressed (the pushed layers, read back from the registry), squash
# time and size, and the demo pipeline through `launcher run` against the same trainer binary on
# the host (container overhead), alternating host and container ROUNDS times with fresh outputs.
# Offline build path (local Debian base, prebuilt binaries), as CI builds it.
# usage: bench/image.sh [ROUNDS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh" >/dev/null 2>&1 || "$ROOT/scripts/setup.sh"
"$ROOT/scripts/docker-local.sh" start
eval "$("$ROOT/scripts/docker-local.sh" env)"
ROUNDS=${1:-2}
L=$ROOT/target/release/launcher T=$ROOT/target/release/trainer
REMOTE=$SCDINO_TEST_REGISTRY/scdino-bench/trainer:bench
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$ROOT"
args=(--tag scdino-bench:bench --tag "$REMOTE" --network host --config configs/demo.yaml
  --build-arg "CUDA_IMAGE=$SCDINO_BASE_IMAGE" --build-arg "BUILD_IMAGE=$SCDINO_BASE_IMAGE"
  --build-arg EFA_INSTALLER_VERSION=none --build-arg BINARIES=prebuilt)
secs() { date +%s.%N; }
t0=$(secs); "$L" image build "${args[@]}" --no-cache >/dev/null 2>"$W/cold.log"; t1=$(secs)
"$L" image build "${args[@]}" >/dev/null 2>"$W/warm.log"; t2=$(secs)
printf 'build cold (--no-cache): %.1f s\nbuild warm (unchanged tree): %.1f s\n' \
  "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)"
size=$(docker image inspect -f '{{.Size}}' scdino-bench:bench)
"$L" image push "$REMOTE" --plain-http >/dev/null 2>&1
comp=$("$L" image inspect "$REMOTE" --registry --plain-http --json |
  "$ROOT/.venv/bin/python" -c 'import json,sys; print(sum(l["size"] for l in json.load(sys.stdin)["manifest"]["layers"]))')
printf 'image size: %.0f MB uncompressed, %.0f MB compressed (pushed layers)\n' \
  "$(echo "$size / 1000000" | bc -l)" "$(echo "$comp / 1000000" | bc -l)"
t0=$(secs); sq=$("$L" image squash scdino-bench:bench --out "$W/sq" 2>/dev/null); t1=$(secs)
printf 'squash: %.1f s, %.0f MB (%s)\n' "$(echo "$t1 - $t0" | bc)" \
  "$(echo "$(stat -c %s "$sq") / 1000000" | bc -l)" "$(basename "$sq")"

# Demo pipeline: host vs container, same binary, same config, same data, fresh outputs.
"$T" synth --out "$W/demo/data" --seed 0 --per-class 40 >/dev/null
run_host() {
  rm -rf "$W/demo/output"
  (cd "$W" && "$T" pipeline --config "$ROOT/configs/demo.yaml" >/dev/null 2>&1)
}
run_container() {
  rm -rf "$W/demo/output"
  "$L" run scdino-bench:bench --mount "$W/demo:/workspace/demo" -- pipeline >/dev/null 2>&1
}
for r in $(seq 1 "$ROUNDS"); do
  t0=$(secs); run_host; t1=$(secs); run_container; t2=$(secs)
  printf 'round %d: host %.1f s, container %.1f s, container/host %.3f\n' "$r" \
    "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$(echo "($t2 - $t1) / ($t1 - $t0)" | bc -l)"
done
