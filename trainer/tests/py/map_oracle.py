"""Oracle of `trainer metrics map`: copairs 0.5.1 on the same tables.

`gen DIR` writes the case tables (float32 features as pandas writes them: ties from
duplicated rows, single-member groups whose AP is NaN, a phenotypic-activity table with
controls); `check DIR` runs copairs on each and compares the trainer's AP.parquet and
MAP.parquet: AP to 1e-6 on every row, mAP to 1e-6 per group, and p-values within the
Monte-Carlo error of two independent nulls of `null_size` draws (copairs draws its nulls
with numpy's PCG64, the trainer with its own generator, so they cannot be equal bit for
bit), the trainer's BH correction exactly as statsmodels' on the trainer's own p-values.
"""
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

NULL_SIZE = 2000


def replicate_table(rng):
    rows = []
    feats = []
    centers = rng.normal(size=(6, 16))
    for c in range(6):
        for i in range(8):
            donor = f"D{i % 3}"
            rows.append({"Metadata_Class": f"c{c}", "Metadata_Donor": donor,
                         "Metadata_Well": f"w{c}{i}"})
            feats.append(centers[c] + rng.normal(scale=1.5, size=16))
    # Ties: two exact copies of a row (in another class) and of a same-class row.
    rows.append({"Metadata_Class": "c1", "Metadata_Donor": "D2", "Metadata_Well": "dup1"})
    feats.append(feats[3].copy())
    rows.append({"Metadata_Class": "c0", "Metadata_Donor": "D1", "Metadata_Well": "dup2"})
    feats.append(feats[0].copy())
    # A single-member class: no positive pair, AP NaN, left out of the mAP.
    rows.append({"Metadata_Class": "lonely", "Metadata_Donor": "D0", "Metadata_Well": "x"})
    feats.append(rng.normal(size=16))
    return rows, np.array(feats)


def activity_table(rng):
    rows, feats = [], []
    for i in range(12):
        rows.append({"Metadata_Compound": "DMSO", "Metadata_Condition": "Control",
                     "Metadata_Plate": f"P{i % 2}"})
        feats.append(rng.normal(size=10))
    for k in range(5):
        shift = rng.normal(size=10) * (0.2 * k)
        for i in range(4):
            rows.append({"Metadata_Compound": f"cpd{k}", "Metadata_Condition": "Treated",
                         "Metadata_Plate": f"P{i % 2}"})
            feats.append(shift + rng.normal(size=10))
    return rows, np.array(feats)


def tiles_table(rng):
    """700 rows on 2 plates: each plate's 350 rows span two of the engine's 256-row tiles;
    compounds in 4 replicates over both plates, every 9th row a copy of another (ties
    between positives and negatives)."""
    rows, feats = [], []
    centers = rng.normal(size=(175, 24))
    for r in range(700):
        c = r // 4
        rows.append({"Metadata_Compound": f"c{c}", "Metadata_Plate": f"P{r % 2}"})
        feats.append(centers[c] * 0.7 + rng.normal(size=24))
    for r in range(0, 700, 9):
        feats[r] = feats[(r * 31 + 3) % 700].copy()
    return rows, np.array(feats)


def write(path, rows, feats, prefix="f"):
    df = pd.DataFrame(rows)
    for j in range(feats.shape[1]):
        df[f"{prefix}{j}"] = feats[:, j].astype(np.float32)
    df.to_parquet(path)


CASES = {
    # name: (table, pos_sameby, pos_diffby, neg_sameby, neg_diffby, reference)
    "replicate": ("replicate", ["Metadata_Class"], [], [], ["Metadata_Class"], None),
    "across_donors": ("replicate", ["Metadata_Class"], ["Metadata_Donor"], [], ["Metadata_Class"], None),
    "within_donor_negs": ("replicate", ["Metadata_Class"], [], ["Metadata_Donor"], ["Metadata_Class"], None),
    "tiles": ("tiles", ["Metadata_Compound"], [], ["Metadata_Plate"], ["Metadata_Compound"], None),
    "activity": ("activity", ["Metadata_Compound", "Metadata_Reference_Index"], [], [],
                 ["Metadata_Compound", "Metadata_Reference_Index"], "Metadata_Condition == 'Control'"),
}


def gen(d):
    rng = np.random.default_rng(3)
    write(d / "replicate.parquet", *replicate_table(rng))
    write(d / "tiles.parquet", *tiles_table(rng))
    write(d / "activity.parquet", *activity_table(rng), prefix="Cells_AreaShape_")
    json.dump({k: {"table": v[0], "pos_sameby": v[1], "pos_diffby": v[2], "neg_sameby": v[3],
                   "neg_diffby": v[4], "reference": v[5], "null_size": NULL_SIZE}
               for k, v in CASES.items()}, open(d / "cases.json", "w"))


def check(d):
    import copairs.map as cmap
    from copairs.matching import assign_reference_index
    from statsmodels.stats.multitest import multipletests

    cases = json.load(open(d / "cases.json"))
    out = {}
    cache = tempfile.mkdtemp()
    for name, c in cases.items():
        df = pd.read_parquet(d / f"{c['table']}.parquet")
        if c["reference"]:
            df = assign_reference_index(df, c["reference"])
        # duckdb 1.3 (the last with the `duckdb.duckdb` module copairs 0.5.1 names) does not
        # know pandas 3's `str` dtype: the same values as Python objects.
        meta = df[[x for x in df.columns if x.startswith("Metadata_")]].astype(object)
        feats = df[[x for x in df.columns if not x.startswith("Metadata_")]].to_numpy()
        want = cmap.average_precision(meta, feats, c["pos_sameby"], c["pos_diffby"],
                                      c["neg_sameby"], c["neg_diffby"])
        got = pd.read_parquet(d / f"{name}_ap.parquet")
        assert list(got.columns[-3:]) == ["n_pos_pairs", "n_total_pairs", "average_precision"], got.columns
        assert len(got) == len(want), (name, len(got), len(want))
        for col in ["n_pos_pairs", "n_total_pairs"]:
            assert (got[col].to_numpy() == want[col].to_numpy()).all(), (name, col)
        a, b = got["average_precision"].to_numpy(), want["average_precision"].to_numpy()
        assert (np.isnan(a) == np.isnan(b)).all(), (name, a, b)
        ap_err = float(np.nanmax(np.abs(a - b)))
        assert ap_err <= 1e-6, (name, ap_err)
        sameby = c["pos_sameby"][:1]
        wmap = cmap.mean_average_precision(want, sameby, NULL_SIZE, 0.05, 0, cache_dir=cache)
        gmap = pd.read_parquet(d / f"{name}_map.parquet")
        assert list(gmap[sameby[0]]) == list(wmap[sameby[0]]), (name, gmap, wmap)
        map_err = float(np.max(np.abs(gmap["mean_average_precision"] - wmap["mean_average_precision"])))
        assert map_err <= 1e-6, (name, map_err)
        p, q = gmap["p_value"].to_numpy(), wmap["p_value"].to_numpy()
        # Two independent Monte-Carlo estimates of the same p: 5 standard errors apart at most.
        pm = (p + q) / 2
        tol = 5 * np.sqrt(2 * pm * (1 - pm) / NULL_SIZE) + 2 / (NULL_SIZE + 1)
        assert (np.abs(p - q) <= tol).all(), (name, p, q, tol)
        bh = multipletests(p, method="fdr_bh")[1]
        assert np.allclose(gmap["corrected_p_value"], bh, rtol=0, atol=1e-12), (name, bh)
        assert (gmap["below_p"] == (p < 0.05)).all() and (gmap["below_corrected_p"] == (bh < 0.05)).all()
        out[name] = {"rows": len(got), "nan_ap": int(np.isnan(a).sum()), "ap_err": ap_err,
                     "map_err": map_err, "max_p_diff": float(np.max(np.abs(p - q)))}
    print(json.dumps(out))


if __name__ == "__main__":
    {"gen": gen, "check": check}[sys.argv[1]](Path(sys.argv[2]))
