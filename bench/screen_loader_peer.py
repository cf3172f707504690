"""Python peer of `trainer bench loader` on a screen stored as fields of view: DeepProfiler's
way of feeding single cells (a PyTorch Dataset over sites: each item reads one site's
channel TIFFs with tifffile, cuts every cell of the site out of it around its object-table
centre with NumPy, min-max per cell and channel as scDINO, then scDINO's
`DataAugmentationDINO` on each cell), a `DataLoader` over the sites in a seeded shuffled
order with `--workers` processes (prefetch_factor 2), the cells of the sites collated into
batches of `--batch`.

With `--plate P.zarr` (and the plate's object table as `--objects`, joined by
`Metadata_Well`/`Metadata_Site`) the sites are the fields of an OME-Zarr HCS plate instead,
found from its NGFF metadata and read with zarr-python: each item reads the selected channels
of one whole field (`omero` labels) at full resolution, then cuts its cells as above. An
`s3://BUCKET/KEY` plate is read through zarr's `ObjectStore` on obstore's `S3Store` (the Rust
object_store crate's client), at `--s3-endpoint` if given (path-style, http allowed: a moto
server), with the credentials of the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).

Times the cells of `--batches` batches after `--warmup` ones: wall clock and CPU seconds of the
main process plus its workers (/proc/<pid>/stat), so cells per CPU-second compares with the
Rust side's images per CPU-second. Prints one JSON line.
"""
import argparse
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import pandas as pd
import tifffile
import torch

from cpu_time import cpu_seconds
from scdino_input import DataAugmentationDINO, normalize_numpy_0_to_1

p = argparse.ArgumentParser()
p.add_argument("--load-data", help="a LoadData CSV (or --plate)")
p.add_argument("--plate", help="an OME-Zarr HCS plate, a folder or s3://BUCKET/KEY (or --load-data)")
p.add_argument("--s3-endpoint", help="with an s3:// --plate: the endpoint URL, e.g. http://127.0.0.1:PORT")
p.add_argument("--objects", required=True)
p.add_argument("--channels", required=True, help="comma-separated channel names")
p.add_argument("--box", type=int, default=50)
p.add_argument("--workers", type=int, default=1)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--batches", type=int, default=8)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--local-crops", type=int, default=8)
p.add_argument("--global-size", type=int, default=224)
p.add_argument("--local-size", type=int, default=96)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()
torch.set_num_threads(1)


def centres_of(rows):
    return rows[["Nuclei_Location_Center_X", "Nuclei_Location_Center_Y"]].to_numpy()


class Sites(torch.utils.data.Dataset):
    """The sites of a LoadData table: one tifffile read per channel."""

    def __init__(self, load_data, objects, channels, box):
        root = Path(load_data).parent
        self.sites = pd.read_csv(load_data)
        self.paths = [[root / r[f"PathName_{c}"] / r[f"FileName_{c}"] for c in channels]
                      for _, r in self.sites.iterrows()]
        by = pd.read_csv(objects).groupby("ImageNumber")
        self.centres = [centres_of(by.get_group(n)) for n in self.sites["ImageNumber"]]
        self.box = box
        self.transform = None

    def read(self, i):
        return np.stack([tifffile.imread(p) for p in self.paths[i]], axis=-1)  # (H, W, C)

    def __len__(self):
        return len(self.sites)

    def cells(self, i):
        site = self.read(i)
        h = self.box // 2
        out = []
        for x, y in self.centres[i]:
            cx, cy = int(np.floor(x + 0.5)), int(np.floor(y + 0.5))
            crop = site[cy - h:cy - h + self.box, cx - h:cx - h + self.box].astype(np.float64)
            crop = normalize_numpy_0_to_1(crop)
            out.append(torch.from_numpy(crop.astype(np.float32)).permute(2, 0, 1))
        return out

    def __getitem__(self, i):
        return [self.transform(c) for c in self.cells(i)]


def plate_store(plate):
    """What zarr opens: a folder as it is, an s3:// URL as an obstore-backed ObjectStore."""
    if not plate.startswith("s3://"):
        return plate
    from obstore.store import S3Store
    from zarr.storage import ObjectStore

    config, client = {"region": os.environ.get("AWS_REGION", "us-east-1")}, {}
    if a.s3_endpoint:
        config |= {"endpoint": a.s3_endpoint, "virtual_hosted_style_request": False}
        client["allow_http"] = a.s3_endpoint.startswith("http://")
    store = S3Store.from_url(plate, config=config, client_options=client)
    return ObjectStore(store, read_only=True)


class PlateFields(Sites):
    """The fields of an OME-Zarr HCS plate (NGFF 0.4 or 0.5): one zarr read of the selected
    channels of a whole field (t = 0, z = 0 where the axes have them)."""

    def __init__(self, plate, objects, channels, box):
        import zarr

        def ngff(group):
            attrs = group.attrs.asdict()
            return attrs.get("ome", attrs)

        root = zarr.open_group(plate_store(plate), mode="r")
        by = pd.read_csv(objects, dtype={"Metadata_Well": str, "Metadata_Site": str})
        by = by.groupby(["Metadata_Well", "Metadata_Site"])
        self.fields, self.centres = [], []
        for well in ngff(root)["plate"]["wells"]:
            for image in ngff(root[well["path"]])["well"]["images"]:
                group = root[f"{well['path']}/{image['path']}"]
                meta = ngff(group)
                labels = [c["label"] for c in meta["omero"]["channels"]]
                axes = [x["name"] for x in meta["multiscales"][0]["axes"]]
                array = group[meta["multiscales"][0]["datasets"][0]["path"]]
                sel = tuple([labels.index(c) for c in channels] if ax == "c" else
                            slice(None) if ax in "yx" else 0 for ax in axes)
                self.fields.append((array, sel))
                self.centres.append(centres_of(by.get_group((well["path"].replace("/", ""),
                                                             image["path"]))))
        self.box = box
        self.transform = None

    def __len__(self):
        return len(self.fields)

    def read(self, i):
        array, sel = self.fields[i]
        return np.moveaxis(array.get_orthogonal_selection(sel), 0, -1)  # (H, W, C)


def main():
    channels = a.channels.split(",")
    if a.plate:
        ds = PlateFields(a.plate, a.objects, channels, a.box)
    else:
        ds = Sites(a.load_data, a.objects, channels, a.box)
    # Dataset statistics from the first sites' cells (untimed; the values do not change the cost).
    xs = [c for i in range(min(4, len(ds))) for c in ds.cells(i)]
    pix = torch.stack(xs).transpose(0, 1).reshape(len(xs[0]), -1).double()
    ds.transform = DataAugmentationDINO(pix.mean(1).tolist(), pix.std(1).tolist(), a.global_size,
                                        a.local_size, a.local_crops)
    order = list(range(len(ds)))
    random.Random(a.seed).shuffle(order)
    # obstore's tokio runtime does not survive a fork (its threads stay in the parent; a forked
    # worker hangs on its first read): the workers of an s3:// plate come from a forkserver,
    # which never touched obstore, and get the dataset (zarr arrays on obstore stores) pickled
    # before the timed batches. (Spawned workers read as fast, 20 vs 19 cells/CPU-s on a small
    # plate, but abort when they exit: "terminate called without an active exception".)
    s3 = bool(a.plate) and a.plate.startswith("s3://")
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(ds, order), batch_size=None, shuffle=False,
        num_workers=a.workers, prefetch_factor=2 if a.workers else None,
        multiprocessing_context="forkserver" if s3 and a.workers else None)
    it = iter(loader)
    pids = [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]
    pending, batches, cells, checksum = [], 0, 0, 0.0
    t0 = c0 = None
    need = a.warmup + a.batches
    while batches < need:
        pending += next(it)
        while len(pending) >= a.batch and batches < need:
            batch, pending = pending[:a.batch], pending[a.batch:]
            crops = [torch.stack([b[k] for b in batch]) for k in range(len(batch[0]))]
            checksum += float(crops[-1][0, 0, 0, 0])
            batches += 1
            if batches == a.warmup:
                t0, c0 = time.perf_counter(), cpu_seconds(pids)
            elif batches > a.warmup:
                cells += len(batch)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pids) - c0
    del it
    path = "zarr-fields-s3" if s3 else "zarr-fields" if a.plate else "deepprofiler-sites"
    print(json.dumps({
        "impl": "python", "bench": "loader",
        "path": path, "threads": a.workers, "batch": a.batch, "batches": a.batches, "images": cells,
        "crops": [a.global_size, a.local_size, a.local_crops], "wall_s": wall, "cpu_s": cpu,
        "imgs_per_s": cells / wall, "imgs_per_cpu_s": cells / max(cpu, 1e-9),
        "checksum": checksum,
    }))


if __name__ == "__main__":
    main()
