"""Oracle of `trainer metrics consensus`: pycytominer 1.7.1's `consensus`.

`gen DIR` writes replicates.parquet (pandas): wells of 1 to 5 replicate rows over two plates
(single-member groups included), float32 features with ties (repeated values, so medians land
on them and on the mean of two equal middles), NaNs (pyarrow stores them as nulls: a feature
NaN on some rows of a group and on every row of one group), a null `Metadata_Well` on two rows
(pandas' `dropna=False` keeps them as a group of their own, sorted last) and an extra metadata
column consensus drops. `check DIR` runs pycytominer's `consensus` (features listed: the
non-`Metadata_` columns, as the trainer infers them) for median and mean and compares the
trainer's tables (consensus_median.parquet, consensus_mean.parquet): same columns in the same
order, same groups in the same order, features to 1e-6 (NaN where pycytominer has NaN).
"""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def gen(d):
    rng = np.random.default_rng(4)
    rows = []
    for p in ["P1", "P2"]:
        for w, k in zip(["A01", "A02", "B01", "B10", "C03"], [1, 3, 4, 5, 2]):
            for _ in range(k):
                rows.append({"Metadata_Plate": p, "Metadata_Well": w, "Metadata_Site": "s1"})
    rows += [{"Metadata_Plate": "P1", "Metadata_Well": None, "Metadata_Site": "s2"}] * 2
    df = pd.DataFrame(rows)
    x = rng.normal(size=(len(df), 5)).round(1).astype(np.float32)  # rounding makes ties
    x[3, 1] = np.nan
    x[1:4, 2] = np.nan  # every row of P1/A02
    for j in range(5):
        df[f"Cells_F{j}"] = x[:, j]
    df.to_parquet(d / "replicates.parquet")


def check(d):
    from pycytominer import consensus

    df = pd.read_parquet(d / "replicates.parquet")
    feats = [c for c in df.columns if not c.startswith("Metadata_")]
    df[feats] = df[feats].astype(np.float64)
    errs = {}
    for op in ["median", "mean"]:
        want = consensus(df, replicate_columns=["Metadata_Plate", "Metadata_Well"],
                         operation=op, features=feats)
        got = pd.read_parquet(d / f"consensus_{op}.parquet")
        assert list(got.columns) == list(want.columns), (list(got.columns), list(want.columns))
        for c in ["Metadata_Plate", "Metadata_Well"]:
            g = [None if pd.isna(v) else v for v in got[c]]
            w = [None if pd.isna(v) else v for v in want[c]]
            assert g == w, (op, c, g, w)
        a, b = got[feats].to_numpy(np.float64), want[feats].to_numpy(np.float64)
        assert (np.isnan(a) == np.isnan(b)).all(), (op, a, b)
        errs[op] = float(np.nanmax(np.abs(a - b)))
    assert all(v <= 1e-6 for v in errs.values()), errs
    print(json.dumps(errs))


if __name__ == "__main__":
    {"gen": gen, "check": check}[sys.argv[1]](Path(sys.argv[2]))
