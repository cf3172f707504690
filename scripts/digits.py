"""Write scikit-learn's bundled 8×8 handwritten digits as a small, real, labelled scDINO dataset.

    .venv/bin/python scripts/digits.py --out DIR [--size 32] [--channels 3]
        [--test-fraction 0.2] [--seed 0] [--constant-channel]

`sklearn.datasets.load_digits` (1,797 images, 10 classes, bundled with scikit-learn, no
download) is split stratified and seeded into a training part and a held-out test part, laid out
as scDINO's PBMC image set (and `trainer synth`):

    DIR/Training/digit<d>/digit<d>-<NNNNN>.tiff
    DIR/Test/Donor01/Control/digit<d>/digit<d>-<NNNNN>-Test-Ctrl-E01-D01.tiff

<NNNNN> is the image's index in `load_digits()`, so every file can be traced back.

Each file is one uncompressed TIFF page of shape (H, W, C), uint16, MinIsBlack, contiguous
samples (SamplesPerPixel = C), exactly like the files `trainer synth` writes: `tifffile.imread`
returns (size, size, C) and scDINO selects channels on the last axis. With C = 1 the page holds
one sample per pixel and tifffile reads it back as a 2-D (H, W) array.

Channels (each computed on the size×size image, then scaled to uint16):
  0  the digit: the 8×8 grey levels 0..16, upscaled bilinearly (half-pixel centres,
     align_corners=False, like torch's `interpolate`) to size×size, times 4000 (max 64000);
  1  a Gaussian-blurred copy of channel 0 (σ = size/16 px, reflect border): a "diffuse stain";
  2  the Sobel gradient magnitude of channel 0: an "edge/membrane stain", highest on strokes'
     borders and zero inside flat regions;
  3+ more blurred copies with growing σ (size/8, size/4, …), if --channels asks for more.
  Channels 1.. are rescaled so that their maximum over the whole dataset is 64000 (one factor per
  channel, so relative intensities between images are kept; scDINO min–max scales each image
  and channel anyway).
--constant-channel appends one more channel that is all zero (a padded, absent stain). scDINO's
per-image min–max maps it to 0 (its x_max == 0 rule), and its dataset std is 0.

Bilinear rather than nearest upscaling: the digit then has smooth strokes instead of 8×8 blocks
aligned with the grid, so crops and patch sizes that do not divide size/8 still see the same
kind of image.
"""
import argparse
import os

import numpy as np
import tifffile

SCALE = 4000  # 16 grey levels × 4000 = 64000 ≤ 65535
MAXVAL = 16 * SCALE


def upscale_bilinear(img, size):
    """(N, h, w) float → (N, size, size), bilinear with half-pixel centres (align_corners=False)."""
    n, h, w = img.shape

    def axis(n_in):
        c = (np.arange(size) + 0.5) * n_in / size - 0.5
        c = np.clip(c, 0, n_in - 1)
        i0 = np.floor(c).astype(int)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, c - i0

    y0, y1, fy = axis(h)
    x0, x1, fx = axis(w)
    top = img[:, y0][:, :, x0] * (1 - fx) + img[:, y0][:, :, x1] * fx
    bot = img[:, y1][:, :, x0] * (1 - fx) + img[:, y1][:, :, x1] * fx
    return top * (1 - fy[:, None]) + bot * fy[:, None]


def main():
    from scipy import ndimage
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="dataset root to create (Training/, Test/)")
    p.add_argument("--size", type=int, default=32, help="output side in pixels (default 32)")
    p.add_argument("--channels", type=int, default=3, help="informative channels (default 3)")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0, help="seed of the stratified split")
    p.add_argument("--constant-channel", action="store_true",
                   help="append one all-zero channel (a padded stain)")
    a = p.parse_args()
    if a.channels < 1:
        p.error("--channels must be >= 1")

    digits = load_digits()
    images = upscale_bilinear(digits.images.astype(np.float64), a.size) * SCALE  # 0..64000
    labels = digits.target

    chans = [images]
    for c in range(1, a.channels):
        if c == 2:
            gx = ndimage.sobel(images, axis=2, mode="nearest")
            gy = ndimage.sobel(images, axis=1, mode="nearest")
            x = np.hypot(gx, gy)
        else:
            sigma = a.size / 16 * 2 ** max(0, c - 2)
            x = ndimage.gaussian_filter(images, sigma=(0, sigma, sigma), mode="reflect")
        chans.append(x * (MAXVAL / x.max()))
    if a.constant_channel:
        chans.append(np.zeros_like(images))
    data = np.clip(np.rint(np.stack(chans, axis=-1)), 0, 65535).astype(np.uint16)  # N,H,W,C

    idx = np.arange(len(labels))
    train_idx, test_idx = train_test_split(idx, test_size=a.test_fraction, random_state=a.seed,
                                           stratify=labels)
    for split, ids in (("Training", train_idx), ("Test", test_idx)):
        for i in sorted(ids):
            cls = f"digit{labels[i]}"
            if split == "Training":
                d, name = os.path.join(a.out, "Training", cls), f"{cls}-{i:05d}.tiff"
            else:
                d = os.path.join(a.out, "Test", "Donor01", "Control", cls)
                name = f"{cls}-{i:05d}-Test-Ctrl-E01-D01.tiff"
            os.makedirs(d, exist_ok=True)
            img = data[i] if data.shape[-1] > 1 else data[i, :, :, 0]
            tifffile.imwrite(os.path.join(d, name), img, photometric="minisblack",
                             planarconfig="contig" if img.ndim == 3 else None,
                             rowsperstrip=a.size, metadata=None, software=False)
    print(f"wrote {len(train_idx)} training images to {a.out}/Training and {len(test_idx)} test "
          f"images to {a.out}/Test (10 classes digit0..digit9; {data.shape[1]}×{data.shape[2]}, "
          f"{data.shape[3]} channels uint16"
          f"{', last one constant 0' if a.constant_channel else ''})")


if __name__ == "__main__":
    main()
