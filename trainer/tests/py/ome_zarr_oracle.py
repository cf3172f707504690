"""OME-Zarr HCS plates written by ome-zarr-py, and the crops the Rust reader must return.

Usage: ome_zarr_oracle.py OUT

Writes small plates under OUT with `ome_zarr.writer` (write_plate_metadata,
write_well_metadata, write_image, write_labels): NGFF 0.4 (Zarr v2) and 0.5 (Zarr v3,
unsharded and sharded), chunks smaller than the image so that regions cross chunks, a float32
plate, a bool plate (no intensity type), a plate listing a well it lacks and one whose label
image has another size than its image. Then reads every array back with zarr-python (not with
what was written: the store is the oracle) and cuts each region of REGIONS from the selected
channels with NumPy, zero outside the site, into OUT/<plate>.bin (little-endian float32 crops,
then uint32 label images), described by OUT/manifest.json. Prints "ok".
"""
import json
import os
import sys

import dask
import numpy as np
import zarr
from ome_zarr.format import FormatV04, FormatV05
from ome_zarr.io import parse_url
from ome_zarr.writer import (
    write_image,
    write_labels,
    write_plate_metadata,
    write_well_metadata,
)

CHANNELS = ["DNA", "RNA", "Mito"]
H, W = 40, 48
ROWS, COLS = ["A", "B"], ["1", "3"]
WELLS = ["A/1", "B/3"]
FIELDS = ["0", "1"]
# (y0, x0, height, width): inside one 16x16 chunk, across chunks, over each border, wholly
# outside, the whole site, larger than the site.
REGIONS = [
    (1, 2, 10, 12),
    (10, 12, 20, 20),
    (-5, -7, 16, 16),
    (30, 40, 16, 16),
    (100, 100, 4, 4),
    (-20, 5, 8, 8),
    (0, 0, H, W),
    (-3, -3, H + 6, W + 6),
]

# name: (format, axes, chunks, shards, plate name, selected channels, label axes, label dtype)
PLATES = {
    "p04": (FormatV04(), "tczyx", (1, 1, 1, 16, 16), None, None, ["Mito", "DNA"], "tczyx", np.uint32),
    "p05": (FormatV05(), "czyx", (1, 1, 16, 16), None, "Plate05", ["DNA", "RNA", "Mito"], "zyx", np.uint16),
    "p05s": (FormatV05(), "cyx", (1, 8, 8), (3, 16, 16), "Sharded", ["RNA"], "yx", np.uint32),
}


def shape_of(axes, c):
    return tuple({"t": 1, "c": c, "z": 1, "y": H, "x": W}[a] for a in axes)


def storage(chunks, shards, axes):
    """Chunks (and shards) for every level, as the axes of this image have them."""
    opts = {"chunks": chunks}
    if shards is not None:
        opts["shards"] = shards
    return opts


def write_field(group, fmt, axes, chunks, shards, pixels, label_axes, labels, dtype_labels):
    write_image(
        pixels.reshape(shape_of(axes, len(CHANNELS))),
        group,
        # A second level, so that the reader has to pick the first; none for bool (whose
        # downsampling skimage refuses).
        scale_factors=() if pixels.dtype == np.bool_ else (2,),
        fmt=fmt,
        axes=list(axes),
        storage_options=storage(chunks, shards, axes),
        omero={"channels": [
            {"label": c, "color": "FFFFFF", "window": {"min": 0, "max": 65535, "start": 0, "end": 65535}}
            for c in CHANNELS
        ]},
    )
    if labels is not None:
        lchunks = tuple(chunks[axes.index(a)] if a in axes and a != "c" else 1 for a in label_axes)
        lshards = None
        if shards is not None:
            lshards = tuple(shards[axes.index(a)] if a in axes and a != "c" else 1 for a in label_axes)
        write_labels(
            labels.astype(dtype_labels).reshape(
                tuple(labels.shape["yx".index(a)] if a in "yx" else 1 for a in label_axes)),
            group,
            name="cells",
            scaler=None,
            scale_factors=(2,),
            fmt=fmt,
            axes=list(label_axes),
            storage_options=storage(lchunks, lshards, label_axes),
        )


def write_plate(path, fmt, axes, chunks, shards, name, label_axes, dtype_labels, rng,
                wells=WELLS, fields=FIELDS, lacking=(), label_shape=(H, W), dtype=np.uint16):
    root = parse_url(path, mode="w", fmt=fmt).store
    plate = zarr.group(store=root, zarr_format=fmt.zarr_format)
    write_plate_metadata(plate, ROWS, COLS, wells, fmt=fmt, name=name, field_count=len(fields))
    truth = {}
    for well in wells:
        if well in lacking:
            continue
        wg = plate.require_group(well)
        write_well_metadata(wg, [{"path": f} for f in fields], fmt=fmt)
        for f in fields:
            if dtype == np.uint16:
                px = rng.integers(0, 65536, size=(len(CHANNELS), H, W), dtype=np.uint16)
            elif dtype == np.float32:
                px = (rng.standard_normal((len(CHANNELS), H, W)) * 1000).astype(np.float32)
            else:
                px = rng.integers(0, 2, size=(len(CHANNELS), H, W)).astype(dtype)
            lab = rng.integers(0, 70000, size=label_shape).astype(np.uint32)
            write_field(wg.require_group(f), fmt, axes, chunks, shards, px, label_axes, lab, dtype_labels)
            truth[(well, f)] = (px, lab.astype(dtype_labels))
    return truth


def level0(group):
    """The path of the first (full-resolution) dataset of a multiscales group."""
    attrs = group.attrs.asdict()
    attrs = attrs.get("ome", attrs)
    return attrs["multiscales"][0]["datasets"][0]["path"]


def site_from_store(path, well, field, axes, label_axes):
    """The field's full-resolution pixels (C x H x W) and labels (H x W), as zarr reads them."""
    g = zarr.open_group(path, mode="r")
    img = np.asarray(g[f"{well}/{field}/{level0(g[f'{well}/{field}'])}"][...])
    keep = tuple(slice(None) if a in "cyx" else 0 for a in axes)
    img = img[keep]
    if "c" not in axes:
        img = img[None]
    lg = g[f"{well}/{field}/labels/cells"]
    lab = np.asarray(lg[level0(lg)][...])
    lab = lab[tuple(slice(None) if a in "yx" else 0 for a in label_axes)]
    return img, lab


def crop(img, y0, x0, h, w):
    out = np.zeros((img.shape[0], h, w), dtype=np.float32)
    ys, ye = max(y0, 0), min(y0 + h, img.shape[1])
    xs, xe = max(x0, 0), min(x0 + w, img.shape[2])
    if ye > ys and xe > xs:
        out[:, ys - y0:ye - y0, xs - x0:xe - x0] = img[:, ys:ye, xs:xe]
    return out


def oracle(out, name, spec, truth, rng):
    fmt, axes, chunks, shards, plate_name, select, label_axes, dtype_labels = spec
    path = os.path.join(out, f"{name}.zarr")
    blob = bytearray()
    regions, labels = [], []
    for si, (well, field) in enumerate((w, f) for w in WELLS for f in FIELDS):
        img, lab = site_from_store(path, well, field, axes, label_axes)
        px, lab_truth = truth[(well, field)]
        assert np.array_equal(img, px), f"{name} {well}/{field}: zarr read differs from what was written"
        assert np.array_equal(lab, lab_truth)
        sel = img[[CHANNELS.index(c) for c in select]].astype(np.float32)
        for (y0, x0, h, w) in REGIONS:
            regions.append({"site": si, "y0": y0, "x0": x0, "height": h, "width": w, "offset": len(blob)})
            blob += crop(sel, y0, x0, h, w).astype("<f4").tobytes()
        labels.append({"site": si, "offset": len(blob), "height": lab.shape[0], "width": lab.shape[1]})
        blob += lab.astype("<u4").tobytes()
    with open(os.path.join(out, f"{name}.bin"), "wb") as fh:
        fh.write(blob)
    sites = [
        {"name": f"{plate_name or name}/{w.replace('/', '')}/{f}",
         "plate": plate_name or name, "well": w.replace("/", ""), "field": f}
        for w in WELLS for f in FIELDS
    ]
    return {"plate": name, "select": select, "regions": regions, "labels": labels,
            "sites": sites, "channels": len(select), "zarr_format": fmt.zarr_format}


def main():
    out = sys.argv[1]
    # These arrays are tiny: dask's thread pool costs more than it saves.
    dask.config.set(scheduler="synchronous")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(46)
    manifest = {"plates": []}
    for name, spec in PLATES.items():
        fmt, axes, chunks, shards, plate_name, _, label_axes, dtype_labels = spec
        truth = write_plate(os.path.join(out, f"{name}.zarr"), fmt, axes, chunks, shards,
                            plate_name, label_axes, dtype_labels, rng)
        manifest["plates"].append(oracle(out, name, spec, truth, rng))

    # A float32 plate: read as f32 bit for bit (one well, one field of it checked).
    truth = write_plate(os.path.join(out, "pf32.zarr"), FormatV05(), "cyx", (1, 16, 16), None,
                        "Floats", "yx", np.uint32, rng, dtype=np.float32, fields=["0"])
    px, _ = truth[("A/1", "0")]
    with open(os.path.join(out, "pf32.bin"), "wb") as fh:
        fh.write(px.astype("<f4").tobytes())
    # A bool plate: no intensity type, refused by name.
    write_plate(os.path.join(out, "pbool.zarr"), FormatV05(), "cyx", (1, 16, 16), None,
                "Bools", "yx", np.uint32, rng, dtype=np.bool_, fields=["0"])
    # The plate lists B/3, which was never written.
    write_plate(os.path.join(out, "pmissing.zarr"), FormatV04(), "czyx", (1, 1, 16, 16), None,
                "Missing", "zyx", np.uint32, rng, lacking=("B/3",), fields=["0"])
    # Labels of 40x40 beside images of 40x48.
    write_plate(os.path.join(out, "plabels.zarr"), FormatV05(), "cyx", (1, 16, 16), None,
                "BadLabels", "yx", np.uint32, rng, label_shape=(H, H), fields=["0"])

    with open(os.path.join(out, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1)
    print("ok")


if __name__ == "__main__":
    main()
