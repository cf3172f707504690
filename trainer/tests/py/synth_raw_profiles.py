"""Raw-pixel profiles of a `trainer synth` test folder: per image and channel the mean,
standard deviation and the 50/90/99th intensity percentiles, with `Metadata_Class` and
`Metadata_Donor` from the folder layout (`Test/DonorNN/Control/<class>/`), written as a
profile table. These carry the donor gain synth applies (its batch effect) untouched.

    python synth_raw_profiles.py TEST_DIR OUT.parquet
"""
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import tifffile

rows, feats = [], []
for p in sorted(Path(sys.argv[1]).rglob("*.tiff")):
    img = tifffile.imread(p).astype(np.float64)
    img = img.reshape(-1, *img.shape[-2:]) if img.ndim == 3 else img[None]
    if img.shape[0] > img.shape[-1]:
        img = np.moveaxis(img, -1, 0)
    f = []
    for ch in img:
        f += [ch.mean(), ch.std(), *np.percentile(ch, [50, 90, 99])]
    rows.append({"Metadata_Class": p.parent.name, "Metadata_Donor": p.parents[2].name})
    feats.append(f)
df = pd.DataFrame(rows)
x = np.array(feats, dtype=np.float32)
for j in range(x.shape[1]):
    df[f"raw_{j}"] = x[:, j]
df.to_parquet(sys.argv[2])
print(len(df), x.shape[1])
