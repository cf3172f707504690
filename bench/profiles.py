"""Peer of `trainer bench profiles`: the same CSV and Parquet files read by the tools users
read them with (numpy.loadtxt as scDINO's kNN reads its CSV, pandas.read_csv, pandas and
polars read_parquet, and polars' feature matrix as the trainer's read returns it: row-major
float32), and the same matrix written as scDINO writes it (np.savetxt, %.18e) and as pandas
writes Parquet (pyarrow, snappy). One JSON line.
usage: profiles.py DIR   (DIR holds bench_features.csv and bench_profiles.parquet)"""
import json
import sys
import time

import numpy as np
import pandas as pd
import polars as pl


def timed(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


d = sys.argv[1]
csv, table = f"{d}/bench_features.csv", f"{d}/bench_profiles.parquet"
x, pandas_csv = timed(lambda: pd.read_csv(csv, header=None).to_numpy(np.float32))
_, numpy_csv = timed(lambda: np.loadtxt(csv, delimiter=","))
df, pandas_parquet = timed(lambda: pd.read_parquet(table))
_, polars_parquet = timed(lambda: pl.read_parquet(table))
feats = [c for c in df.columns if c.startswith("DINO_CLS_")]
# The feature matrix, as the trainer's read gives it (row-major float32).
m, polars_matrix = timed(lambda: pl.read_parquet(table).select(feats).to_numpy(order="c"))
assert m.dtype == np.float32 and m.flags["C_CONTIGUOUS"] and m.shape == x.shape
assert np.array_equal(df[feats].to_numpy(), x), "CSV and Parquet disagree"
_, savetxt = timed(lambda: np.savetxt(f"{d}/peer_features.csv", x.astype(np.float64), delimiter=","))
_, to_parquet = timed(lambda: df.to_parquet(f"{d}/peer_profiles.parquet"))
print(json.dumps({
    "numpy_loadtxt_s": numpy_csv, "pandas_read_csv_s": pandas_csv,
    "pandas_read_parquet_s": pandas_parquet, "polars_read_parquet_s": polars_parquet,
    "polars_matrix_s": polars_matrix,
    "numpy_savetxt_s": savetxt, "pandas_to_parquet_s": to_parquet,
}))
