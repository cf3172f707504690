"""Where per-channel attention maps look on scripts/colocalisation.py's images, by region.

    .venv/bin/python bench/colocalisation_attention.py --data DATA \
        --maps tokens=TOKENS_ATTENTION_DIR --maps bag=BAG_ATTENTION_DIR [--size 64]

Each ATTENTION_DIR is one checkpoint's `attention_images/{tag}` folder of the a+b+c
combination (`trainer attention`, any `images_per_class`), DATA the colocalisation dataset the
maps were drawn from (the maps' images are read back from DATA/Training). Prints, for every run:
1. each channel's share of the CLS token's attention (the manifest's `map_shares`), mean ±
   standard deviation per class;
2. each channel's map on three regions of the image: that channel's own spots, the other
   channels' spots (where this channel is dark), and cells no channel lights. The PNGs are
   viridis, each scaled to its own range; viridis' lightness rises monotonically with the
   value, so the mean lightness (0-255) of a region orders the regions within a map, which
   is all this reads;
3. the map on the channel's own spots when they are co-lit (the channel is in the class's
   pair) and when they are not: whether the maps show the colocalisation itself.
With --montage OUT.png, also draws the first two images of every class: the image's three
channels, then each run's three maps (docs/img/colocalisation-attention.png).
"""
import argparse
import collections
import json
import statistics as st

import numpy as np
import tifffile
from PIL import Image, ImageDraw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--maps", action="append", required=True, help="NAME=ATTENTION_DIR")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--montage", help="write the first two images of every class here")
    a = ap.parse_args()
    names = "abc"
    runs = []
    for spec in a.maps:
        label, d = spec.split("=", 1)
        images = [i for i in json.load(open(f"{d}/attention_images.json")) if i["size"] == a.size]
        if not images:
            raise SystemExit(f"{d}: no maps at {a.size} px")
        runs.append((label, d, images))
        shares = collections.defaultdict(list)
        region = collections.defaultdict(list)
        paired = collections.defaultdict(list)
        for i in images:
            x = tifffile.imread(f"{a.data}/Training/{i['class']}/{i['file']}")
            scale = a.size // x.shape[0]
            lit = np.kron(x > 0, np.ones((scale, scale, 1))) > 0
            shares[i["class"]].append(i["map_shares"])
            pair = [] if i["class"] == "none" else i["class"].split("_")
            for c, png in enumerate(i["head_pngs"]):
                light = np.asarray(Image.open(f"{d}/{png}").convert("L")).astype(float)
                own = lit[..., c]
                other = lit.any(-1) & ~own
                empty = ~lit.any(-1)
                region[("own", c)].append(light[own].mean())
                region[("other", c)].append(light[other].mean())
                region[("empty", c)].append(light[empty].mean())
                paired[(names[c] in pair, c)].append(light[own].mean())
        print(f"## {label}: {len(images)} images at {a.size} px ({d})")
        print("share of the CLS attention, % (mean ± sd over the class's images):")
        for cls in sorted(shares):
            rows = shares[cls]
            cells = [
                f"{names[c]} {100 * st.mean(r[c] for r in rows):.1f} ± {100 * st.stdev(r[c] for r in rows):.1f}"
                for c in range(3)
            ]
            print(f"  {cls} (n={len(rows)}): " + ", ".join(cells))
        print("map lightness: own spots / other channels' spots / empty cells:")
        for c in range(3):
            print(
                f"  {names[c]}: "
                + " / ".join(f"{st.mean(region[(r, c)]):.0f}" for r in ("own", "other", "empty"))
            )
        print("map lightness on own spots: co-lit (channel in the class's pair) / not:")
        for c in range(3):
            print(f"  {names[c]}: {st.mean(paired[(True, c)]):.0f} / {st.mean(paired[(False, c)]):.0f}")
    if a.montage:
        montage(a.montage, runs, a.size)


def montage(out, runs, size):
    """Rows: two images per class; columns: the channels, then every run's maps."""
    first = runs[0][2]
    rows = [i for cls in sorted({i["class"] for i in first}) for i in [x for x in first if x["class"] == cls][:2]]
    pad, left, top = 4, 96, 20
    cols = 3 * (1 + len(runs))
    im = Image.new("RGB", (left + cols * (size + pad) + len(runs) * pad, top + len(rows) * (size + pad)), "white")
    draw = ImageDraw.Draw(im)
    heads = [f"image {n}" for n in "abc"] + [f"{label} {n}" for label, _, _ in runs for n in "abc"]
    x_of = [left + k * (size + pad) + (k // 3) * pad for k in range(cols)]
    for k, h in enumerate(heads):
        draw.text((x_of[k], 4), h, fill="black")
    for r, img in enumerate(rows):
        y = top + r * (size + pad)
        draw.text((2, y + size // 2 - 6), f"{img['class']} {img['file'].split('-')[1][:5]}", fill="black")
        d0 = runs[0][1]
        files = [f"{d0}/{p}" for p in img["channel_pngs"]]
        for _, d, images in runs:
            same = [i for i in images if (i["class"], i["file"]) == (img["class"], img["file"])]
            if not same:
                raise SystemExit(f"{d}: no map of {img['file']} (the runs picked other images)")
            files += [f"{d}/{p}" for p in same[0]["head_pngs"]]
        for k, f in enumerate(files):
            tile = Image.open(f).convert("RGB").resize((size, size), Image.NEAREST)
            im.paste(tile, (x_of[k], y))
    im.save(out)


if __name__ == "__main__":
    main()
