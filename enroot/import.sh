#!/usr/bin/env bash
# Import the trainer image into an Enroot squashfs on a shared filesystem once, so that every
# Slurm step reuses it instead of pulling again (Pyxis --container-image=/path/scdino.sqsh).
# Enroot 3.x needs the `registry#image:tag` form (a '/' after the registry only from 4.0).
# Without Enroot on the build host, `launcher image squash IMAGE --out DIR` writes the same
# layout from the local Docker Engine, named by the image ID.
# usage: enroot/import.sh REGISTRY#IMAGE:TAG /fsx/images/scdino.sqsh
set -euo pipefail
image=${1:?usage: $0 REGISTRY#IMAGE:TAG OUT.sqsh}
out=${2:?usage: $0 REGISTRY#IMAGE:TAG OUT.sqsh}
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
enroot import --output "$tmp" "docker://$image"
mv -f "$tmp" "$out"
echo "imported $image -> $out"
