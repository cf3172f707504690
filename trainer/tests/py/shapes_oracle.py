"""Profile tables with the shapes real data has, for `trainer metrics`' reader.

`gen DIR` writes
* pandas.parquet (pandas, 60 rows): a float `Metadata_Conc` with 20 NaN (pyarrow stores them
  as nulls), a boolean `Metadata_Flag`, a nullable Int64 `Metadata_Count` with a null, a
  categorical `Metadata_Cat`, a datetime `Metadata_Date`, an `Image_FileName` string column
  with a null, pandas 3 `str` class and donor columns, float32 features; plus
  plain.parquet, the same rows with only `Metadata_Class`, `Metadata_Donor` and the features;
* polars.parquet (polars, 60 rows): Boolean, UInt64, Int8, Categorical, Enum, Date,
  Datetime(us, UTC), Float64 with a null and a NaN, String with a null, a List column
  (nested, not read), Float64 features;
* nan_feature.parquet (pandas): a NaN in feature `Cells_F2`, row 7.

`check DIR` reads the tables `trainer metrics` wrote back and checks every metadata value
against the text the reader promises (docs/scoring.md), nulls where the input had nulls.
"""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def features(rng, n, d, classes):
    centers = rng.normal(size=(len(set(classes)), d)) * 3
    idx = {c: i for i, c in enumerate(sorted(set(classes)))}
    return np.array([centers[idx[c]] + rng.normal(size=d) for c in classes])


def gen(d):
    rng = np.random.default_rng(3)
    n = 60
    classes = [f"c{i % 4}" for i in range(n)]
    x = features(rng, n, 5, classes).astype(np.float32)
    conc = np.array([0.5 * (i % 3) for i in range(n)], dtype=np.float64)
    conc[::3] = np.nan
    df = pd.DataFrame({
        "Metadata_Class": pd.array(classes, dtype="str"),
        "Metadata_Donor": pd.array([f"D{i % 2}" for i in range(n)], dtype="str"),
        "Metadata_Conc": conc,
        "Metadata_Flag": [i % 5 == 0 for i in range(n)],
        "Metadata_Count": pd.array([None if i == 4 else i for i in range(n)], dtype="Int64"),
        "Metadata_Cat": pd.Categorical([["a", "b"][i % 2] for i in range(n)]),
        "Metadata_Date": pd.to_datetime(["2024-01-02 00:00:00"] * (n - 1) + ["2024-03-04 05:06:07"]),
        "Image_FileName": [None if i == 9 else f"img{i}.tiff" for i in range(n)],
    })
    for j in range(5):
        df[f"Cells_F{j}"] = x[:, j]
    df.to_parquet(d / "pandas.parquet")
    df[["Metadata_Class", "Metadata_Donor"] + [f"Cells_F{j}" for j in range(5)]].to_parquet(
        d / "plain.parquet")
    bad = df.copy()
    bad.loc[7, "Cells_F2"] = np.nan
    bad.to_parquet(d / "nan_feature.parquet")

    import polars as pl
    f64 = [float(i) / 4 for i in range(n)]
    f64[5] = None
    f64[6] = float("nan")
    pf = pl.DataFrame({
        "Metadata_Class": classes,
        "Metadata_Control": [i % 3 == 0 for i in range(n)],
        "Metadata_Big": pl.Series([2**63 + i for i in range(n)], dtype=pl.UInt64),
        "Metadata_Small": pl.Series([-(i % 7) for i in range(n)], dtype=pl.Int8),
        "Metadata_Cat": pl.Series([["x", "y"][i % 2] for i in range(n)], dtype=pl.Categorical),
        "Metadata_Enum": pl.Series([["lo", "hi"][i % 2] for i in range(n)],
                                   dtype=pl.Enum(["lo", "hi"])),
        "Metadata_Day": pl.Series([pd.Timestamp("2024-02-29").date()] * n, dtype=pl.Date),
        "Metadata_Time": pl.Series([pd.Timestamp("2024-02-29 12:00:00.25")] * n,
                                   dtype=pl.Datetime("us", "UTC")),
        "Metadata_Float": f64,
        "Metadata_Well": [None if i == 2 else f"A{i:02d}" for i in range(n)],
        "Metadata_Tags": [[i, i + 1] for i in range(n)],
    })
    y = features(rng, n, 4, classes)
    for j in range(4):
        pf = pf.with_columns(pl.Series(f"Cells_G{j}", y[:, j]))
    pf.write_parquet(d / "polars.parquet")


def check(d):
    got = pd.read_parquet(d / "pandas_ap.parquet")
    n = len(got)
    conc = [None if i % 3 == 0 else repr(0.5 * (i % 3)) for i in range(n)]
    want = {
        "Metadata_Class": [f"c{i % 4}" for i in range(n)],
        "Metadata_Conc": conc,
        "Metadata_Flag": ["true" if i % 5 == 0 else "false" for i in range(n)],
        "Metadata_Count": [None if i == 4 else str(i) for i in range(n)],
        "Metadata_Cat": [["a", "b"][i % 2] for i in range(n)],
        "Metadata_Date": ["2024-01-02T00:00:00"] * (n - 1) + ["2024-03-04T05:06:07"],
        "Image_FileName": [None if i == 9 else f"img{i}.tiff" for i in range(n)],
    }
    for col, values in want.items():
        have = [None if pd.isna(v) else v for v in got[col].tolist()]
        assert have == values, (col, have[:12], values[:12])

    got = pd.read_parquet(d / "polars_norm.parquet")
    f = [None if i in (5, 6) else repr(float(i) / 4) for i in range(n)]
    want = {
        "Metadata_Control": ["true" if i % 3 == 0 else "false" for i in range(n)],
        "Metadata_Big": [str(2**63 + i) for i in range(n)],
        "Metadata_Small": [str(-(i % 7)) for i in range(n)],
        "Metadata_Cat": [["x", "y"][i % 2] for i in range(n)],
        "Metadata_Enum": [["lo", "hi"][i % 2] for i in range(n)],
        "Metadata_Day": ["2024-02-29"] * n,
        "Metadata_Time": ["2024-02-29T12:00:00.25Z"] * n,
        "Metadata_Float": f,
        "Metadata_Well": [None if i == 2 else f"A{i:02d}" for i in range(n)],
    }
    for col, values in want.items():
        have = [None if pd.isna(v) else v for v in got[col].tolist()]
        assert have == values, (col, have[:12], values[:12])
    assert "Metadata_Tags" not in got.columns
    print(json.dumps({"checked": sorted(want)}))


if __name__ == "__main__":
    {"gen": gen, "check": check}[sys.argv[1]](Path(sys.argv[2]))
