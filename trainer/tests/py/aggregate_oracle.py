"""Oracle of `trainer metrics aggregate`: pycytominer 1.7.1's `aggregate`.

`gen DIR` writes the single-cell tables:
* cells_pandas.parquet (pandas, one row group): string plates and wells, groups of 1 to 6
  cells (single-member groups included), float32 features rounded so medians land on ties
  and on the mean of two equal middles, a float64 feature, NaN on some rows and on every row
  of one group, null `Metadata_Well` and null `Metadata_Plate` rows (pandas' `dropna=False`
  keeps each null combination as a group of its own, sorted last within its level), an
  integer feature `Cells_Count` (only aggregated when named), `Metadata_ObjectNumber`, and
  an extra metadata column aggregate drops;
* cells_polars.parquet (polars, row groups of 7 rows, so groups span row groups): integer
  plates 10, 2, 1 and a null (pandas sorts them numerically: 1, 2, 10, null), NaN written as
  NaN and missing values written as nulls;
* cells_big.parquet (pandas): 150,000 cells in one row group, more than the trainer reads
  at a time (65,536 rows), 60 wells, 2 features with NaN;
* one_row.parquet (one cell) and empty.parquet (no rows).

`check DIR` runs pycytominer's `aggregate(strata=[Metadata_Plate, Metadata_Well],
features=<the trainer's inferred features>, operation=op, compute_object_count=True,
object_feature="Metadata_ObjectNumber")` for median and mean on each table, and
`features=[Cells_Count, Cells_A]` for the named case, and compares the trainer's
`<table>_<op>.parquet`: same columns in the same order, the same groups in the same order,
medians exactly equal and means to 1e-12, NaN where pycytominer has NaN. The object count
equals pycytominer's where it has one; pycytominer's count is NaN exactly for the groups
with a null stratum (its count uses `groupby(dropna=True)`), where the trainer's is the
group's size (`groupby(dropna=False).size()`).
"""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

STRATA = ["Metadata_Plate", "Metadata_Well"]


def cells(rng, plates, wells_sizes):
    rows = []
    for p in plates:
        for w, k in wells_sizes:
            rows += [{"Metadata_Plate": p, "Metadata_Well": w}] * k
    return rows


def gen(d):
    rng = np.random.default_rng(11)
    rows = cells(rng, ["P2", "P1"], [("B02", 3), ("A01", 1), ("A10", 4), ("A02", 6), ("C01", 2)])
    rows += [{"Metadata_Plate": "P1", "Metadata_Well": None}] * 3
    rows += [{"Metadata_Plate": None, "Metadata_Well": "A01"}] * 2
    rows += [{"Metadata_Plate": None, "Metadata_Well": None}]
    df = pd.DataFrame(rows)
    n = len(df)
    df = df.iloc[rng.permutation(n)].reset_index(drop=True)  # groups interleaved
    df["Metadata_ObjectNumber"] = np.arange(n) + 1
    df["Metadata_Site"] = [f"s{i % 3}" for i in range(n)]
    x = rng.normal(size=(n, 4)).round(1).astype(np.float32)  # rounding makes ties
    x[5, 1] = np.nan
    x[7, 0] = np.nan
    a02 = np.where((df.Metadata_Plate == "P2") & (df.Metadata_Well == "A02"))[0]
    x[a02, 2] = np.nan  # every row of one group
    for j in range(4):
        df[f"Cells_F{j}"] = x[:, j]
    df["Nuclei_Wide"] = rng.normal(size=n) * 1e3  # float64
    df["Cells_Count"] = rng.integers(0, 5, size=n)  # integer: metadata unless named
    df.to_parquet(d / "cells_pandas.parquet")

    import polars as pl

    rows = cells(rng, [10, 2, 1], [("A01", 2), ("B01", 5), ("A02", 1)])
    rows += [{"Metadata_Plate": None, "Metadata_Well": "B01"}] * 3
    m = len(rows)
    perm = rng.permutation(m)
    rows = [rows[i] for i in perm]
    y = rng.normal(size=(m, 3)).round(1)
    cols = {
        "Metadata_Plate": pl.Series([r["Metadata_Plate"] for r in rows], dtype=pl.Int64),
        "Metadata_Well": pl.Series([r["Metadata_Well"] for r in rows], dtype=pl.Utf8),
        "Metadata_ObjectNumber": pl.Series(list(range(1, m + 1)), dtype=pl.Int64),
    }
    for j in range(3):
        v = y[:, j].astype(np.float32).tolist()
        if j == 0:
            v[2] = float("nan")  # NaN as NaN
        if j == 1:
            v[4] = None  # a null
        cols[f"Cells_P{j}"] = pl.Series(v, dtype=pl.Float32)
    pl.DataFrame(cols).write_parquet(d / "cells_polars.parquet", row_group_size=7)

    m = 150_000
    big = pd.DataFrame({"Metadata_Plate": [f"P{i % 3}" for i in range(m)],
                        "Metadata_Well": [f"W{i % 20:02d}" for i in rng.permutation(m)],
                        "Metadata_ObjectNumber": np.arange(m)})
    z = rng.normal(size=(m, 2)).astype(np.float32)
    z[rng.random((m, 2)) < 0.01] = np.nan
    big["Cells_B0"], big["Cells_B1"] = z[:, 0], z[:, 1]
    big.to_parquet(d / "cells_big.parquet", row_group_size=m)

    df.iloc[:1].to_parquet(d / "one_row.parquet")
    df.iloc[:0].to_parquet(d / "empty.parquet")


def text(v):
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
        return None
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def compare(got, want, feats, name):
    cols = STRATA + ["Metadata_Object_Count"] + feats
    assert list(got.columns) == cols, (name, list(got.columns))
    assert list(want.columns) == cols, (name, list(want.columns))
    assert len(got) == len(want), (name, len(got), len(want))
    for c in STRATA:
        g = [text(v) for v in got[c]]
        w = [text(v) for v in want[c]]
        assert g == w, (name, c, g, w)
    null_key = got[STRATA].isna().any(axis=1).to_numpy()
    wc = want["Metadata_Object_Count"].to_numpy(np.float64)
    gc = got["Metadata_Object_Count"].to_numpy(np.float64)
    assert (np.isnan(wc) == null_key).all(), (name, wc, null_key)
    assert (gc[~null_key] == wc[~null_key]).all(), (name, gc, wc)
    return gc


def check(d):
    from pycytominer import aggregate

    report = {}
    for table in ["cells_pandas", "cells_polars", "cells_big", "one_row"]:
        df = pd.read_parquet(d / f"{table}.parquet")
        feats = [c for c in df.columns
                 if not c.startswith("Metadata_") and pd.api.types.is_float_dtype(df[c])]
        size = df.groupby(STRATA, dropna=False).size().to_numpy(np.float64)
        for op in ["median", "mean"]:
            want = aggregate(df, strata=STRATA, features=feats, operation=op,
                             compute_object_count=True, object_feature="Metadata_ObjectNumber")
            got = pd.read_parquet(d / f"{table}_{op}.parquet")
            name = f"{table}_{op}"
            counts = compare(got, want, feats, name)
            assert (counts == size).all(), (name, counts, size)
            a, b = got[feats].to_numpy(np.float64), want[feats].to_numpy(np.float64)
            assert (np.isnan(a) == np.isnan(b)).all(), (name, a, b)
            err = float(np.nanmax(np.abs(a - b)))
            assert err <= (0.0 if op == "median" else 1e-12), (name, err)
            report[name] = {"groups": len(got), "max_abs_err": err,
                            "nan": int(np.isnan(a).sum())}
    df = pd.read_parquet(d / "cells_pandas.parquet")
    named = ["Cells_Count", "Cells_F0"]
    want = aggregate(df, strata=STRATA, features=named, operation="median",
                     compute_object_count=True, object_feature="Metadata_ObjectNumber")
    got = pd.read_parquet(d / "named_median.parquet")
    compare(got, want, named, "named")
    a, b = got[named].to_numpy(np.float64), want[named].to_numpy(np.float64)
    assert (np.isnan(a) == np.isnan(b)).all() and np.nanmax(np.abs(a - b)) == 0, (a, b)
    report["named_median"] = {"groups": len(got)}
    print(json.dumps(report))


if __name__ == "__main__":
    {"gen": gen, "check": check}[sys.argv[1]](Path(sys.argv[2]))
