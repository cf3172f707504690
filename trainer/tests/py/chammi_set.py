"""A small CHAMMI-like set and its oracle, for the `chammi` screen layout's tests.

`python chammi_set.py DIR [PER]` writes, as CHAMMI stores its crops (Zenodo 10.5281/zenodo.7988357):
one image per cell with its channels tiled side by side, `channel_width` pixels each, and
`DIR/enriched_meta.csv` (`file_path` relative to DIR, `ID`, `channel_width`, `Label`,
`train_test_split`, boolean `Task_one`…`Task_four`, `cell_type` (HPA), `Plate` (CP),
`Structure` (Allen)):

* `Allen/`: 3 channels, 8-bit grayscale PNG (PIL), 10×12 tiles, and some 13×7 (taller than wide);
* `HPA/`: 4 channels, 16-bit grayscale PNG (PIL `I;16`), 9×14 tiles, some 16×8;
* `CP/`: 5 channels, alternately 16-bit TIFF (tifffile) and 8-bit PNG, 8×8 tiles, some 11×6.

PER cells per (dataset, split), two classes per dataset whose nucleus channel differs, tasks
as CHAMMI's (WTC tasks 1–2, HPA 1–3 with task 3 left out by `cell_type`, CP 1–4 with task 4
left out by `Plate`, the leave-one-out tasks with novel classes over two groups).

The oracle, `DIR/fold.json`: for every `file_path`, the image read by `skimage.io.imread` (as
CHAMMI's loaders read it) and folded as they fold it,
`np.reshape(image, (h, channel_width, -1), order="F")`, then moved to C×H×W, as integers.
"""
import json
import os
import sys

import numpy as np
import pandas as pd
import skimage.io
import tifffile
from PIL import Image

DATASETS = {
    "Allen": dict(channels=3, kind="png8", sizes=[(10, 12), (13, 7)], tasks=["Task_one", "Task_two"]),
    "HPA": dict(channels=4, kind="png16", sizes=[(9, 14), (16, 8)],
                tasks=["Task_one", "Task_two", "Task_three"]),
    "CP": dict(channels=5, kind="mixed", sizes=[(8, 8), (11, 6)],
               tasks=["Task_one", "Task_two", "Task_three", "Task_four"]),
}
LEAVE_OUT = {"HPA": "Task_three", "CP": "Task_four"}


def tiled(rng, channels, h, w, top, label):
    """C tiles of h×w side by side; the first (nucleus in every CHAMMI dataset but HPA's)
    brighter in the middle for label 1."""
    tiles = rng.integers(0, top // 2, (channels, h, w))
    if label:
        tiles[:, h // 4: h - h // 4, w // 4: w - w // 4] += top // 3
    return np.concatenate(list(tiles), axis=1)


def write(path, image, kind):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if kind == "png8":
        Image.fromarray(image.astype(np.uint8)).save(path)
    elif kind == "png16":
        Image.fromarray(image.astype(np.uint16)).save(path)
    else:
        tifffile.imwrite(path, image.astype(np.uint16))


def main(out, per):
    rng = np.random.default_rng(11)
    rows = []
    for ds, spec in DATASETS.items():
        n = 0
        for split in ["Train"] + spec["tasks"]:
            novel = LEAVE_OUT.get(ds) == split
            for i in range(per):
                label = i % 2
                h, w = spec["sizes"][(i // 2) % 2]
                kind = spec["kind"]
                if kind == "mixed":
                    kind = "tiff16" if n % 2 == 0 else "png8"
                top = 256 if kind == "png8" else 65536
                ext = "tif" if kind == "tiff16" else "png"
                rel = f"{ds}/{split}/{n:03d}.{ext}"
                write(f"{out}/{rel}", tiled(rng, spec["channels"], h, w, top, label), kind)
                row = {"file_path": rel, "ID": f"{ds}_{n}", "channel_width": w,
                       "Label": f"{ds}_{'novel' if novel else 'c'}{label}",
                       "train_test_split": split}
                for t in ["Task_one", "Task_two", "Task_three", "Task_four"]:
                    row[t] = split == t
                row["cell_type"] = f"type{(i // 2) % 2}" if ds == "HPA" else None
                row["Plate"] = f"plate{(i // 2) % 2}" if ds == "CP" else None
                row["Structure"] = f"s{label}" if ds == "Allen" else None
                rows.append(row)
                n += 1
    table = pd.DataFrame(rows)
    table.to_csv(f"{out}/enriched_meta.csv", index=False)
    fold = {}
    for r in table.itertuples():
        image = skimage.io.imread(f"{out}/{r.file_path}")
        folded = np.reshape(image, (image.shape[0], r.channel_width, -1), order="F")
        fold[r.file_path] = {
            "dtype": str(image.dtype),
            "shape": list(folded.transpose(2, 0, 1).shape),
            "data": folded.transpose(2, 0, 1).astype(np.int64).ravel().tolist(),
        }
    json.dump(fold, open(f"{out}/fold.json", "w"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4)
