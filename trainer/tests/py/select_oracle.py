"""Oracle of `trainer metrics select`: pycytominer 1.7.1's `feature_select`.

`gen DIR` writes features.parquet (pandas, 300 rows, float32 features built to meet each
rule: a near-constant feature, one with a dominant value, one of two values only, correlated
pairs and a triple, NaN in 10 % and in 2 % of the rows, rounded values with ties, a
blocklisted name) and blocklist.csv (pycytominer's `blocklist` column); `check DIR` runs
`feature_select` for each case in cases.json and requires the trainer's table to have the
same columns in the same order and the same values.
"""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ALL = ["variance_threshold", "frequency_threshold", "correlation_threshold",
       "drop_na_columns", "blocklist"]
CASES = {
    "default": ["variance_threshold"],
    "frequency": ["frequency_threshold"],
    "correlation": ["correlation_threshold"],
    "na": ["drop_na_columns"],
    "blocklist": ["blocklist"],
    "all": ALL,
    "corr_then_na": ["correlation_threshold", "drop_na_columns"],
}


def gen(d):
    rng = np.random.default_rng(21)
    n = 300
    df = pd.DataFrame({"Metadata_Plate": [f"P{i % 3}" for i in range(n)],
                       "Metadata_Well": [f"W{i % 40:02d}" for i in range(n)]})
    a, b = rng.normal(size=n), rng.normal(size=n)
    f = {
        "Cells_A": a,
        "Cells_NearConst": 1.0 + rng.normal(size=n) * 1e-4,
        "Cells_Dominant": np.where(np.arange(n) < 290, 0.0, rng.normal(size=n)),
        "Cells_TwoValues": (np.arange(n) % 2).astype(float),
        "Cells_A2": 2 * a + rng.normal(size=n) * 0.1,
        "Cells_A3": -a + b * 0.2 + rng.normal(size=n) * 0.1,
        "Nuclei_B": b,
        "Nuclei_B2": b + a * 0.3 + rng.normal(size=n) * 0.05,
        "Nuclei_Na10": rng.normal(size=n),
        "Nuclei_Na2": a * 0.95 + rng.normal(size=n) * 0.2,
        "Nuclei_Ties": np.round(rng.normal(size=n), 1),
        "Cytoplasm_Blocked": rng.normal(size=n),
    }
    f["Nuclei_Na10"][rng.choice(n, 30, replace=False)] = np.nan
    f["Nuclei_Na2"][rng.choice(n, 6, replace=False)] = np.nan
    for k, v in f.items():
        df[k] = v.astype(np.float32)
    df.to_parquet(d / "features.parquet")
    (d / "blocklist.csv").write_text("blocklist\nCytoplasm_Blocked\nCells_Absent\n")
    (d / "cases.json").write_text(json.dumps(CASES))


def check(d):
    from pycytominer import feature_select

    df = pd.read_parquet(d / "features.parquet")
    feats = [c for c in df.columns if not c.startswith("Metadata_")]
    df[feats] = df[feats].astype(np.float64)
    kept = {}
    for name, ops in json.loads((d / "cases.json").read_text()).items():
        want = feature_select(df, features=feats, operation=ops,
                              blocklist_file=str(d / "blocklist.csv"))
        got = pd.read_parquet(d / f"select_{name}.parquet")
        assert list(got.columns) == list(want.columns), (name, list(got.columns), list(want.columns))
        g, w = got[feats_of(got)].to_numpy(np.float64), want[feats_of(want)].to_numpy(np.float64)
        assert np.array_equal(g, w, equal_nan=True), name
        kept[name] = feats_of(got)
    assert len(kept["all"]) < len(feats) - 4, kept
    print(json.dumps(kept))


def feats_of(df):
    return [c for c in df.columns if not c.startswith("Metadata_")]


if __name__ == "__main__":
    {"gen": gen, "check": check}[sys.argv[1]](Path(sys.argv[2]))
