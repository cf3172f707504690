"""Reads the plates `trainer synth --layout ome-zarr` wrote with ome-zarr-py and checks them.

Usage: ome_zarr_synth_check.py OUT

For every OUT/*.zarr: validates the plate against the NGFF 0.5 HCS model of ome-zarr-models
(warnings are errors), then walks plate -> wells -> fields with `ome_zarr.reader.Reader` (not
with the writer's knowledge: the reader is the oracle) and, per field, reads its pixels and its
`labels/nuclei` image. Every cell of OUT/cells.csv must be found in its field: the box of its
object number in the label image holds, channel for channel, the per-cell TIFF it came from
(tifffile), and every pixel outside the boxes is 0. Prints one JSON line: per plate its name,
rows, columns, wells with their fields, each field's shape and channel labels, and the cells
compared.
"""
import csv
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import tifffile
import zarr
from ome_zarr.io import parse_url
from ome_zarr.reader import Label, Multiscales, Plate, Reader, Well
from ome_zarr_models.v05.hcs import HCS

out = Path(sys.argv[1])
cells = {}
with open(out / "cells.csv") as f:
    for r in csv.DictReader(f):
        key = (r["Metadata_Plate"], r["Metadata_Well"], r["Metadata_Site"])
        cells.setdefault(key, []).append((int(r["ObjectNumber"]), r["path"]))


def node_with(path, spec):
    for node in Reader(parse_url(str(path)))():
        if any(isinstance(s, spec) for s in node.specs):
            return node, next(s for s in node.specs if isinstance(s, spec))
    raise SystemExit(f"{path}: no {spec.__name__} node")


report = {"plates": [], "cells": 0}
for plate_path in sorted(out.glob("*.zarr")):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HCS.from_zarr(zarr.open_group(str(plate_path), mode="r"))
    _, plate = node_with(plate_path, Plate)
    name = plate.plate_data["name"]
    entry = {"name": name, "rows": plate.row_names, "columns": plate.col_names, "wells": {}}
    for well_path in plate.well_paths:
        _, well = node_with(plate_path / well_path, Well)
        row, col = well_path.split("/")
        fields = []
        for field in well.well_data["images"]:
            fpath = plate_path / well_path / field["path"]
            image, _ = node_with(fpath, Multiscales)
            pixels = np.asarray(image.data[0])
            labels_node, _ = node_with(fpath / "labels" / "nuclei", Label)
            labels = np.asarray(labels_node.data[0])
            inside = np.zeros(labels.shape, bool)
            for obj, tiff in cells.get((name, row + col, field["path"]), []):
                ys, xs = np.nonzero(labels == obj)
                box = (slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1))
                want = tifffile.imread(tiff)
                want = want.transpose(2, 0, 1) if want.ndim == 3 else want[None]
                got = pixels[(slice(None),) + box]
                if got.shape != want.shape or not np.array_equal(got, want.astype(got.dtype)):
                    raise SystemExit(f"{fpath}: object {obj} differs from {tiff}")
                inside[box] = True
                report["cells"] += 1
            if pixels[:, ~inside].any():
                raise SystemExit(f"{fpath}: pixels outside the cells' boxes are not 0")
            fields.append({
                "path": field["path"],
                "shape": list(pixels.shape),
                "dtype": str(pixels.dtype),
                "channels": image.metadata["channel_names"],
                "labels_shape": list(labels.shape),
            })
        entry["wells"][well_path] = fields
    report["plates"].append(entry)
print(json.dumps(report))
