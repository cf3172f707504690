"""Python peer of `trainer bench loader`: scDINO's input pipeline, no model.

scDINO's dataset (main_dino.py L172-194): `tifffile.imread`, float64, min–max per image and
channel with the zero-max rule (utils.py L96-119), NaN image → None dropped by the collate
function; its multi-channel `DataAugmentationDINO` (main_dino.py L490-577) on torchvision
transforms applied to C×H×W tensors (bicubic RandomResizedCrop without antialias — torchvision
0.9.1's tensor behaviour —, flips, per-channel AdjustBrightness, 5×5 GaussianBlur with
p 1.0/0.1/0.5, solarisation of global crop 2, Normalize); `torch.utils.data.DataLoader` with
`--workers` processes (scDINO: num_workers = cores), prefetch_factor 2, default collation.

Times `--batches` batches after `--warmup` ones: wall clock and the CPU seconds of the main
process plus every worker process (/proc/<pid>/stat), so images per CPU-second is comparable
with the Rust side's (which reads /proc/self/stat for all its threads). Prints one JSON line.
"""
import argparse
import json
import os
import random
import time

import numpy as np
import torch

from cpu_time import cpu_seconds
from scdino_input import DataAugmentationDINO, TiffImageFolder, collate_fn

p = argparse.ArgumentParser()
p.add_argument("--data", required=True, help="ImageFolder root of TIFFs")
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


def main():
    ds = TiffImageFolder(a.data, None)
    need = (a.warmup + a.batches) * a.batch
    if len(ds) < need:
        raise SystemExit(f"{a.data} holds {len(ds)} images; {need} needed")
    # Dataset statistics (untimed; the values do not change the cost).
    xs = [x for x in (ds.load(i) for i in range(min(64, len(ds)))) if x is not None]
    pix = torch.stack(xs).transpose(0, 1).reshape(len(xs[0]), -1).double()
    ds.transform = DataAugmentationDINO(pix.mean(1).tolist(), pix.std(1).tolist(), a.global_size,
                                        a.local_size, a.local_crops)
    order = list(range(len(ds)))
    random.Random(a.seed).shuffle(order)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(ds, order[:need]), batch_size=a.batch, shuffle=False,
        num_workers=a.workers, collate_fn=collate_fn, prefetch_factor=2 if a.workers else None)
    it = iter(loader)
    pids = [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]
    images, checksum = 0, 0.0
    t0 = c0 = None
    for n in range(a.warmup + a.batches):
        crops, idx = next(it)
        checksum += float(crops[-1][0, 0, 0, 0])
        if n + 1 == a.warmup:
            t0, c0 = time.perf_counter(), cpu_seconds(pids)
        elif n >= a.warmup:
            images += len(idx)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pids) - c0
    del it
    print(json.dumps({
        "impl": "python", "bench": "loader", "path": "scdino", "threads": a.workers,
        "batch": a.batch, "batches": a.batches, "images": images,
        "crops": [a.global_size, a.local_size, a.local_crops], "wall_s": wall, "cpu_s": cpu,
        "imgs_per_s": images / wall, "imgs_per_cpu_s": images / max(cpu, 1e-9),
        "checksum": checksum,
    }))


if __name__ == "__main__":
    main()
