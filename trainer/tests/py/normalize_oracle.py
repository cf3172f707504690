"""Oracle of `trainer metrics normalize`: pycytominer 1.7.1's `normalize`.

`gen DIR` writes plates.parquet (two plates, controls and treated rows, float32 features
with a constant-free spread), wide.parquet (fewer rows than features, where spherize pads
the singular values) and wide_plates.parquet (two plates, each with fewer rows than
features); `check DIR` runs pycytominer on the same values (upcast to float64: on float32
input numpy's SVD would itself run in float32) for every case in cases.json, once per plate
group where the case has `by`, and compares the trainer's output tables to 1e-5.

PCA outputs are compared up to each component's sign: pycytominer leaves the sign to its SVD
routine, the trainer fixes scikit-learn's `svd_flip` convention (each component's
largest-magnitude loading positive). The convention itself is checked where the loadings
can be recovered from the output (more fit rows than features, fitted on every row): the
loadings are the least-squares solution W of Z W = output, Z the centred (PCA) or
standardised (PCA-cor) features.
"""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

CASES = {
    # name: (table, method, controls, by, spherize_method)
    "standardize_all": ("plates", "standardize", False, False, None),
    "standardize_controls_per_plate": ("plates", "standardize", True, True, None),
    "robustize_controls": ("plates", "robustize", True, False, None),
    "mad_robustize_per_plate": ("plates", "mad_robustize", False, True, None),
    "spherize_zca_cor_controls": ("plates", "spherize", True, False, "ZCA-cor"),
    "spherize_zca_cor_per_plate": ("plates", "spherize", False, True, "ZCA-cor"),
    "spherize_zca": ("plates", "spherize", False, False, "ZCA"),
    "spherize_pca_cor": ("plates", "spherize", False, False, "PCA-cor"),
    "spherize_wide": ("wide", "spherize", False, False, "ZCA-cor"),
    "spherize_pca": ("plates", "spherize", False, False, "PCA"),
    "spherize_pca_wide": ("wide", "spherize", False, False, "PCA"),
    "spherize_pca_wide_per_plate": ("wide_plates", "spherize", False, True, "PCA"),
    "spherize_pca_cor_wide_per_plate": ("wide_plates", "spherize", False, True, "PCA-cor"),
}


def gen(d):
    rng = np.random.default_rng(11)
    rows, feats = [], []
    mix = rng.normal(size=(6, 6))
    for p in range(2):
        for i in range(40):
            cond = "Control" if i % 2 == 0 else "Treated"
            rows.append({"Metadata_Plate": f"P{p}", "Metadata_Condition": cond})
            feats.append(rng.standard_t(4, size=6) @ mix + p * 2.0 + (cond == "Treated"))
    df = pd.DataFrame(rows)
    feats = np.array(feats, dtype=np.float32)
    # Ties in a feature (robustize's medians and quartiles land on repeated values).
    feats[::4, 2] = 0.5
    for j in range(6):
        df[f"Cells_F{j}"] = feats[:, j]
    df.to_parquet(d / "plates.parquet")
    wide = pd.DataFrame({"Metadata_Plate": ["P0"] * 9})
    w = rng.normal(size=(9, 14)).astype(np.float32)
    for j in range(14):
        wide[f"DINO_CLS_{j}"] = w[:, j]
    wide.to_parquet(d / "wide.parquet")
    wp = pd.DataFrame({"Metadata_Plate": ["P0"] * 12 + ["P1"] * 11})
    w = rng.normal(size=(23, 20)) @ rng.normal(size=(20, 20))
    w[12:] += 1.5
    for j in range(20):
        wp[f"DINO_CLS_{j}"] = w[:, j].astype(np.float32)
    wp.to_parquet(d / "wide_plates.parquet")
    (d / "cases.json").write_text(json.dumps(CASES))


def check(d):
    from pycytominer import normalize

    errs = {}
    for name, (table, method, controls, by, sph) in json.loads((d / "cases.json").read_text()).items():
        df = pd.read_parquet(d / f"{table}.parquet")
        feats = [c for c in df.columns if not c.startswith("Metadata_")]
        meta = [c for c in df.columns if c.startswith("Metadata_")]
        df[feats] = df[feats].astype(np.float64)
        kw = dict(features=feats, meta_features=meta, method=method,
                  samples="Metadata_Condition == 'Control'" if controls else "all")
        if sph:
            kw["spherize_method"] = sph
        parts = [normalize(g, **kw) for _, g in df.groupby("Metadata_Plate", sort=False)] if by \
            else [normalize(df, **kw)]
        want = pd.concat(parts).loc[df.index]
        got = pd.read_parquet(d / f"{name}.parquet")
        cols = [c for c in want.columns if c not in meta]
        assert list(got.columns) == meta + cols, (name, list(got.columns), cols)
        assert (got[meta].to_numpy() == want[meta].to_numpy()).all(), name
        g, w = got[cols].to_numpy(np.float64).copy(), want[cols].to_numpy(np.float64).copy()
        if sph in ("PCA", "PCA-cor"):
            # Equal up to each component's sign (per plate where fitted per plate).
            groups = [df["Metadata_Plate"] == p for p in df["Metadata_Plate"].unique()] if by \
                else [np.ones(len(df), bool)]
            for m in groups:
                m = np.asarray(m)
                signs = np.where(np.sum(g[m] * w[m], axis=0) < 0, -1.0, 1.0)
                w[m] = w[m] * signs
            if not by and len(df) > len(feats) and not controls:
                x = df[feats].to_numpy(np.float64)
                z = x - x.mean(0)
                if sph == "PCA-cor":
                    z = z / x.std(0)
                loadings = np.linalg.lstsq(z, g, rcond=None)[0]
                top = loadings[np.argmax(np.abs(loadings), axis=0), np.arange(loadings.shape[1])]
                assert (top > 0).all(), (name, "svd_flip convention", top)
                errs[name + "_convention"] = 0.0
        errs[name] = float(np.max(np.abs(g - w)))
    bad = {k: v for k, v in errs.items() if not v <= 1e-5}
    assert not bad, bad
    print(json.dumps(errs))


if __name__ == "__main__":
    {"gen": gen, "check": check}[sys.argv[1]](Path(sys.argv[2]))
