"""Write a synthetic scDINO dataset whose class is which two channels colocalise.

    .venv/bin/python scripts/colocalisation.py --out DIR [--size 16] [--cell 2] [--spots 6]
        [--per-class 300] [--test-per-class 75] [--seed 0]

Three channels (a, b, c), each a few bright spots on a dark field. The image is a grid of
cells (--cell px square; 8 × 8 cells at the defaults) and every channel lights --spots of
them, each at its own intensity drawn uniformly from [0.5, 1.0]. The class says which two
channels' spots lie on the same cells: `a_b`, `a_c`, `b_c`, or `none` (4 classes, chance
25 %). In `a_b` channel b lights exactly a's cells and c lights as many others; in `none`
the three channels light disjoint cells. This is colocalisation, the interaction that
microscopy asks about most (two proteins in the same compartment), and it holds at every
spot of the image: any crop, flip or rescale that moves all channels together keeps it, so a
self-supervised view of the image keeps it too (unlike scripts/interaction.py's task, where
one dot inside one disk decides the class and a crop may cut it away).

Why no single channel decides the class: in every class each channel alone lights a
uniformly random set of --spots cells (the partner's set is uniform, and the third channel's
is uniform among the cells left, which is uniform again by symmetry) at independent
intensities, so one channel is drawn exactly the same way in every class, not only
approximately. A model that embeds each channel on its own (`model.channels: bag`) sees the
channels' spot sets one at a time, each blind to the others; a nearest-neighbour vote or a
linear probe on such features side by side stays at chance in expectation. A model whose
tokens of different channels attend to each other (`tokens`) can compare the channels' spots
at each position. A pair of channels shows its own relation only (`a_b` against the three
others): at most 50 % top-1 there.

Layout as `scripts/interaction.py` and `trainer synth` (one uncompressed (H, W, 3) uint16
TIFF per image, MinIsBlack):

    DIR/Training/<class>/<class>-<NNNNN>.tiff
    DIR/Test/Donor01/Control/<class>/<class>-<NNNNN>-Test-Ctrl-E01-D01.tiff
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interaction import write_image  # noqa: E402

# Class name → the two colocalising channels (None: every channel on its own cells).
CLASSES = {"none": None, "a_b": (0, 1), "a_c": (0, 2), "b_c": (1, 2)}


def draw(rng, size, pair, cell=2, spots=6):
    """One image (size, size, 3) float in [0, 1]; `pair` = the colocalising channels or None."""
    grid = size // cell
    if grid * grid < 3 * spots:
        raise ValueError(f"{grid}x{grid} cells cannot hold 3 x {spots} disjoint spots")
    # Three disjoint uniform sets of cells; a colocalising pair shares the first one.
    order = rng.permutation(grid * grid)
    sets = [order[i * spots:(i + 1) * spots] for i in range(3)]
    if pair is not None:
        first, second = pair
        third = 3 - first - second
        sets = [None, None, None]
        sets[first], sets[second], sets[third] = (
            order[:spots], order[:spots], order[spots:2 * spots])
    img = np.zeros((size, size, 3))
    for c in range(3):
        for k, v in zip(sets[c], rng.uniform(0.5, 1.0, size=spots)):
            y, x = divmod(int(k), grid)
            img[y * cell:(y + 1) * cell, x * cell:(x + 1) * cell, c] = v
    return img


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="dataset root to create (Training/, Test/)")
    p.add_argument("--size", type=int, default=16, help="image side in pixels (default 16)")
    p.add_argument("--cell", type=int, default=2, help="a spot's side in pixels (default 2)")
    p.add_argument("--spots", type=int, default=6, help="spots per channel (default 6)")
    p.add_argument("--per-class", type=int, default=300, help="training images per class")
    p.add_argument("--test-per-class", type=int, default=75, help="test images per class")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    n = 0
    for split, per in (("Training", a.per_class), ("Test", a.test_per_class)):
        for cls, pair in CLASSES.items():
            for _ in range(per):
                write_image(a.out, split, cls, n, draw(rng, a.size, pair, a.cell, a.spots))
                n += 1
    print(f"wrote {a.per_class * len(CLASSES)} training and {a.test_per_class * len(CLASSES)} "
          f"test images to {a.out} ({len(CLASSES)} classes, {a.size}x{a.size}, 3 channels uint16)")


if __name__ == "__main__":
    main()
