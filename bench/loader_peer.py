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

GLOBAL_SCALE, LOCAL_SCALE = (0.4, 1.0), (0.05, 0.4)  # scDINO's argparse defaults
torch.set_num_threads(1)


def normalize_numpy_0_to_1(x):
    x_min = x.min(axis=(0, 1), keepdims=True)
    x_max = x.max(axis=(0, 1), keepdims=True)
    if np.any(x_max - x_min == 0):
        x_max = np.where(x_max == 0, 1, x_max)
    return (x - x_min) / (x_max - x_min)


class AdjustBrightness:
    """utils.py L191-200: one factor per channel, torchvision adjust_brightness (clamps)."""

    def __init__(self, p):
        self.p = p

    def __call__(self, x):
        from torchvision.transforms import functional as TF

        if random.random() < self.p:
            return torch.cat([TF.adjust_brightness(x[c:c + 1], random.uniform(0.5, 1.25))
                              for c in range(x.shape[0])])
        return x


class GaussianBlurMultiChan:
    """utils.py L142-159: torchvision GaussianBlur 5×5, σ ~ U(0.1, 1.5), if rand <= p."""

    def __init__(self, p):
        from torchvision import transforms

        self.p = p
        self.blur = transforms.GaussianBlur(kernel_size=(5, 5), sigma=(0.1, 1.5))

    def __call__(self, x):
        return self.blur(x) if random.random() <= self.p else x


class SolarizationMultiChan:
    """utils.py L175-188: values > 0.5 become 1 − v in every channel, if rand < p."""

    def __init__(self, p):
        self.p = p

    def __call__(self, x):
        return torch.where(x > 0.5, 1.0 - x, x) if random.random() < self.p else x


class DataAugmentationDINO:
    def __init__(self, mean, std):
        from torchvision import transforms as T
        from torchvision.transforms import InterpolationMode

        bicubic = InterpolationMode.BICUBIC
        flips = T.Compose([T.RandomHorizontalFlip(p=0.5), T.RandomVerticalFlip(p=0.5)])
        normalize = T.Normalize(mean, std)

        def rrc(size, scale):
            return T.RandomResizedCrop(size, scale=scale, interpolation=bicubic, antialias=False)

        self.global1 = T.Compose([rrc(a.global_size, GLOBAL_SCALE), flips, AdjustBrightness(0.8),
                                  GaussianBlurMultiChan(1.0), normalize])
        self.global2 = T.Compose([rrc(a.global_size, GLOBAL_SCALE), flips, AdjustBrightness(0.8),
                                  GaussianBlurMultiChan(0.1), SolarizationMultiChan(0.2),
                                  normalize])
        self.local = T.Compose([rrc(a.local_size, LOCAL_SCALE), flips, AdjustBrightness(0.8),
                                GaussianBlurMultiChan(0.5), normalize])

    def __call__(self, image):
        crops = [self.global1(image), self.global2(image)]
        crops += [self.local(image) for _ in range(a.local_crops)]
        return crops


class TiffImageFolder(torch.utils.data.Dataset):
    def __init__(self, root, transform):
        from torchvision.datasets import ImageFolder

        self.samples = ImageFolder(root, loader=lambda p: p).samples
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def load(self, i):
        import tifffile

        x = tifffile.imread(self.samples[i][0]).astype(np.float64)  # (H, W, C)
        x = normalize_numpy_0_to_1(x)
        if np.isnan(x).any():
            return None
        return torch.from_numpy(x.astype(np.float32)).permute(2, 0, 1)

    def __getitem__(self, i):
        x = self.load(i)
        if x is None:
            return None
        return self.transform(x), i


def collate_fn(batch):
    batch = [b for b in batch if b is not None]
    return torch.utils.data.dataloader.default_collate(batch)


def cpu_seconds(pids):
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        total += (int(rest[11]) + int(rest[12])) / tick
    return total


def main():
    ds = TiffImageFolder(a.data, None)
    need = (a.warmup + a.batches) * a.batch
    if len(ds) < need:
        raise SystemExit(f"{a.data} holds {len(ds)} images; {need} needed")
    # Dataset statistics (untimed; the values do not change the cost).
    xs = [x for x in (ds.load(i) for i in range(min(64, len(ds)))) if x is not None]
    pix = torch.stack(xs).transpose(0, 1).reshape(len(xs[0]), -1).double()
    ds.transform = DataAugmentationDINO(pix.mean(1).tolist(), pix.std(1).tolist())
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
