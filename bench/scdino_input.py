"""scDINO's input pipeline, shared by the Python peers (`loader_peer.py`, `train_step.py`):
its dataset (main_dino.py L172-194: `tifffile.imread`, float64, min–max per image and channel
with the zero-max rule of utils.py L96-119, NaN image → None dropped by the collate function)
and its multi-channel `DataAugmentationDINO` (main_dino.py L490-577) on torchvision transforms
of C×H×W tensors."""
import random

import numpy as np
import torch

GLOBAL_SCALE, LOCAL_SCALE = (0.4, 1.0), (0.05, 0.4)  # scDINO's argparse defaults


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
    def __init__(self, mean, std, global_size, local_size, local_crops,
                 global_scale=GLOBAL_SCALE, local_scale=LOCAL_SCALE):
        from torchvision import transforms as T
        from torchvision.transforms import InterpolationMode

        bicubic = InterpolationMode.BICUBIC
        flips = T.Compose([T.RandomHorizontalFlip(p=0.5), T.RandomVerticalFlip(p=0.5)])
        normalize = T.Normalize(mean, std)

        def rrc(size, scale):
            return T.RandomResizedCrop(size, scale=scale, interpolation=bicubic, antialias=False)

        self.global1 = T.Compose([rrc(global_size, global_scale), flips, AdjustBrightness(0.8),
                                  GaussianBlurMultiChan(1.0), normalize])
        self.global2 = T.Compose([rrc(global_size, global_scale), flips, AdjustBrightness(0.8),
                                  GaussianBlurMultiChan(0.1), SolarizationMultiChan(0.2),
                                  normalize])
        self.local_crops = local_crops
        self.local = T.Compose([rrc(local_size, local_scale), flips, AdjustBrightness(0.8),
                                GaussianBlurMultiChan(0.5), normalize])

    def __call__(self, image):
        crops = [self.global1(image), self.global2(image)]
        crops += [self.local(image) for _ in range(self.local_crops)]
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
