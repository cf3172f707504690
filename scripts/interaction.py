"""Write a synthetic scDINO dataset whose class is an interaction between channels.

    .venv/bin/python scripts/interaction.py --out DIR [--size 16] [--radius SIZE/4] [--dot 2]
        [--per-class 200] [--test-per-class 50] [--seed 0]

Three channels (a, b, c). Each channel holds one disk (its "region", half intensity) and one
small bright dot (its "signal"), each placed at random. In every image exactly one channel's
dot lies inside exactly one other channel's region; the class says which: `a_in_b`, `a_in_c`,
`b_in_a`, `b_in_c`, `c_in_a`, `c_in_b` (6 classes, chance 16.7 %). Every other dot lies
outside every other channel's region (it lies in a phantom region, placed as a real one, so
that every dot is placed the same way), and no dot lies in its own channel's region.

Why no single channel decides the class: one channel alone shows a disk and a dot outside it,
placed the same way in every class (the disk uniformly, the dot somewhere outside it); whether
that dot is inside another channel's disk, and whose, is only visible with that other channel.
A model that embeds each channel on its own (`model.channels: bag`) cannot see it: its
features of a combination are its channels' features side by side, each blind to where the
other channels' disks are, so a nearest-neighbour vote on them stays near chance (up to the
little that border effects leak). A model whose tokens of different channels attend to each
other (`tokens`) can learn it. A pair of channels shows two of the six classes (its own two
relations) apart from the other four: at most 50 % top-1 there.

Learnable from labels (`bench/interaction_supervised.py`; BENCHMARKS.md, issue 48 run 8): at
the defaults a small CNN over all channels reaches 100 % test top-1, while a supervised bag
(linear readout) stays at chance as argued above, and so did a supervised ChannelViT-style
ViT (patch 4 or 2, up to 6000 training images): its training loss stayed at ln 6. Run 9: it
learns the task (97 %, three seeds) once its first block attends within a position across the
channels and its channel embedding starts at std 1.0 (with DINO's block init: at dim 192); the same
ViT with one token per patch over all channels learns it at once (96 %). --radius and --dot
change the drawing for other variants (defaults: size / 4 and 2 px).

Layout as `scripts/digits.py` and `trainer synth` (one uncompressed (H, W, 3) uint16 TIFF per
image, MinIsBlack):

    DIR/Training/<class>/<class>-<NNNNN>.tiff
    DIR/Test/Donor01/Control/<class>/<class>-<NNNNN>-Test-Ctrl-E01-D01.tiff
"""
import argparse
import itertools
import os

import numpy as np
import tifffile

NAMES = ["a", "b", "c"]
MAXVAL = 64000


def inside(p, centre, r):
    return np.hypot(p[0] - centre[0], p[1] - centre[1]) < r


def draw(rng, size, source, target, radius=None, dot=2):
    """One image (size, size, 3) float of class source→target, by rejection.

    `radius`: the disks' radius in pixels (default size / 4); `dot`: the dots' side in pixels
    (default 2). A dot "in" a disk has its centre within radius − 0.75·dot of the disk's
    centre (the whole dot inside); a dot "outside" one has it beyond radius + dot / 2."""
    r = size / 4.0 if radius is None else float(radius)
    margin = r * 0.9
    while True:
        centres = rng.uniform(margin, size - margin, size=(3, 2))
        dots = []
        for c in range(3):
            # The source's dot lies in the target's region; every other dot in a phantom
            # region placed as a real one, so that each dot alone is placed the same way.
            home = centres[target] if c == source else rng.uniform(margin, size - margin, 2)
            avoid = [o for o in range(3) if o != c and not (c == source and o == target)]
            for _ in range(200):
                p = home + rng.uniform(-r, r, size=2)
                if (
                    inside(p, home, r - 0.75 * dot)
                    and dot / 2 <= p.min() and p.max() <= size - dot / 2
                    and not inside(p, centres[c], r + dot / 2)
                    and not any(inside(p, centres[o], r + dot / 2) for o in avoid)
                ):
                    break
            else:
                break
            dots.append(p)
        if len(dots) == 3:
            break
    yy, xx = np.mgrid[0:size, 0:size] + 0.5
    img = np.zeros((size, size, 3))
    for c in range(3):
        img[..., c] = 0.5 * (np.hypot(yy - centres[c][0], xx - centres[c][1]) < r)
        # A dot×dot-pixel dot around its point.
        y0, x0 = (int(np.clip(np.floor(dots[c][i] - dot / 2 + 0.5), 0, size - dot)) for i in (0, 1))
        img[y0 : y0 + dot, x0 : x0 + dot, c] = 1.0
    return img


def write_image(root, split, cls, n, img):
    """Writes image number `n` (float (H, W, C) in [0, 1]) of class `cls` into `split`
    (Training or Test) as the layout above says (also scripts/colocalisation.py's writer)."""
    if split == "Training":
        d, name = os.path.join(root, "Training", cls), f"{cls}-{n:05d}.tiff"
    else:
        d = os.path.join(root, "Test", "Donor01", "Control", cls)
        name = f"{cls}-{n:05d}-Test-Ctrl-E01-D01.tiff"
    os.makedirs(d, exist_ok=True)
    tifffile.imwrite(os.path.join(d, name), np.rint(img * MAXVAL).astype(np.uint16),
                     photometric="minisblack", planarconfig="contig", rowsperstrip=img.shape[0],
                     metadata=None, software=False)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="dataset root to create (Training/, Test/)")
    p.add_argument("--size", type=int, default=16, help="image side in pixels (default 16)")
    p.add_argument("--radius", type=float, default=None,
                   help="disk radius in pixels (default size / 4)")
    p.add_argument("--dot", type=int, default=2, help="dot side in pixels (default 2)")
    p.add_argument("--per-class", type=int, default=200, help="training images per class")
    p.add_argument("--test-per-class", type=int, default=50, help="test images per class")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    classes = list(itertools.permutations(range(3), 2))
    n = 0
    for split, per in (("Training", a.per_class), ("Test", a.test_per_class)):
        for s, t in classes:
            cls = f"{NAMES[s]}_in_{NAMES[t]}"
            for _ in range(per):
                write_image(a.out, split, cls, n, draw(rng, a.size, s, t, a.radius, a.dot))
                n += 1
    print(f"wrote {a.per_class * 6} training and {a.test_per_class * 6} test images to {a.out} "
          f"(6 classes, {a.size}×{a.size}, 3 channels uint16)")


if __name__ == "__main__":
    main()
