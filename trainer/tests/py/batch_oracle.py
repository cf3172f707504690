"""Oracle of `trainer metrics batch` (`trainer metrics chammi`: chammi_oracle.py).

scib 1.1.7's own `silhouette_batch` and `graph_connectivity` (their module files, loaded
without `scib/__init__`, which imports scanpy: scib is installed without its requirements
because anndata/scanpy want pandas < 3), on a minimal AnnData stand-in holding what those two
functions read (obs, obsm, obsp, uns, subsetting). graph_connectivity calls `pd.value_counts`,
which pandas 3 removed; it is given back as `Series.value_counts`. The kNN graph is scanpy's
`pp.neighbors` pattern with exact neighbours (scikit-learn brute force, n_neighbors counting
the row itself, made symmetric); the leave-one-group-out 1-NN is scikit-learn's
`KNeighborsClassifier(1, metric="cosine")` and `f1_score(average="macro")`.

`gen DIR` writes batch.parquet; `check DIR` compares batch_k5.json and batch_k15.json
(`--n-neighbors` 5 and 15, written by the trainer) to 1e-6.
"""
import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd


def gen(d):
    rng = np.random.default_rng(5)
    rows, feats = [], []
    donor_shift = {f"D{i}": rng.normal(size=8) * 3.0 for i in range(3)}
    centers = {c: rng.normal(size=8) * 3 for c in ["a", "b", "c", "solo"]}
    for c in ["a", "b", "c"]:
        for i in range(30):
            dn = f"D{i % 3}"
            rows.append({"Metadata_Class": c, "Metadata_Donor": dn})
            # Class `a` in two far-apart halves: its kNN subgraph falls in two pieces.
            far = 25.0 * (c == "a" and i >= 15)
            feats.append(centers[c] + donor_shift[dn] + rng.normal(size=8) + far)
    # A label seen in one donor only (scib skips it) and two rows of their own donors.
    for i in range(5):
        rows.append({"Metadata_Class": "solo", "Metadata_Donor": "D0"})
        feats.append(centers["solo"] + rng.normal(size=8))
    df = pd.DataFrame(rows)
    feats = np.array(feats, dtype=np.float32)
    for j in range(8):
        df[f"DINO_CLS_{j}"] = feats[:, j]
    df.to_parquet(d / "batch.parquet")


def load_scib(module):
    if "scib" not in sys.modules:
        spec = importlib.util.find_spec("scib")
        load_scib.root = spec.submodule_search_locations[0]
    root = load_scib.root
    for name, path in [("scib", root), ("scib.metrics", root + "/metrics")]:
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [path]
            sys.modules[name] = pkg
    return importlib.import_module(f"scib.metrics.{module}")


class MiniAnnData:
    """What scib's silhouette_batch and graph_connectivity read of an AnnData."""

    def __init__(self, obs, obsm, obsp, uns):
        self.obs, self.obsm, self.obsp, self.uns = obs, obsm, obsp, uns
        self.shape = (len(obs), 0)

    def __getitem__(self, mask):
        m = np.asarray(mask)
        return MiniAnnData(self.obs[m], {k: v[m] for k, v in self.obsm.items()},
                           {k: v[m][:, m] for k, v in self.obsp.items()}, self.uns)


def knn_graph(x, k):
    from scipy.sparse import csr_matrix
    from sklearn.neighbors import NearestNeighbors
    _, idx = NearestNeighbors(n_neighbors=k, algorithm="brute").fit(x).kneighbors(x)
    n = len(x)
    a = np.zeros((n, n))
    for i in range(n):
        for j in [j for j in idx[i] if j != i][: k - 1]:
            a[i, j] = a[j, i] = 1.0
    return csr_matrix(a)


def one_nn_f1(xtr, ytr, xte, yte):
    from sklearn.metrics import f1_score
    from sklearn.neighbors import KNeighborsClassifier
    pred = KNeighborsClassifier(n_neighbors=1, metric="cosine").fit(xtr, ytr).predict(xte)
    return pred, f1_score(yte, pred, average="macro")


def check(d):
    from sklearn.metrics import f1_score
    from sklearn.neighbors import NearestNeighbors
    sil = load_scib("silhouette")
    gc = load_scib("graph_connectivity")
    pd.value_counts = lambda values: pd.Series(values).value_counts()

    df = pd.read_parquet(d / "batch.parquet")
    x = df[[c for c in df.columns if not c.startswith("Metadata_")]].to_numpy().astype(np.float64)
    obs = pd.DataFrame({"batch": pd.Categorical(df["Metadata_Donor"].to_numpy()),
                        "label": pd.Categorical(df["Metadata_Class"].to_numpy())})
    got = json.loads((d / "batch_k15.json").read_text())
    errs = {}
    asw = sil.silhouette_batch(MiniAnnData(obs, {"X_emb": x}, {}, {}), "batch", "label", "X_emb", verbose=False)
    errs["silhouette_batch"] = abs(asw - got["silhouette_batch"])
    for k in [5, 15]:
        g = json.loads((d / f"batch_k{k}.json").read_text())["graph_connectivity"]
        adata = MiniAnnData(obs, {}, {"connectivities": knn_graph(x, k)}, {"neighbors": {}})
        errs[f"graph_connectivity_{k}"] = abs(gc.graph_connectivity(adata, "label") - g)
    y, b = df["Metadata_Class"].to_numpy(), df["Metadata_Donor"].to_numpy()
    pred = np.empty_like(y)
    for g in np.unique(b):
        m = b == g
        pred[m], _ = one_nn_f1(x[~m], y[~m], x[m], y[m])
    errs["logo"] = abs(f1_score(y, pred, average="macro") - got["f1_leave_one_batch_out"])
    _, idx = NearestNeighbors(n_neighbors=2, metric="cosine", algorithm="brute").fit(x).kneighbors(x)
    loo = np.where(idx[:, 0] == np.arange(len(x)), idx[:, 1], idx[:, 0])
    errs["in_distribution"] = abs(f1_score(y, y[loo], average="macro") - got["f1_in_distribution"])

    bad = {k: v for k, v in errs.items() if not v <= 1e-6}
    assert not bad, bad
    print(json.dumps({"max_err": max(errs.values()), "checked": sorted(errs)}))


if __name__ == "__main__":
    {"gen": gen, "check": check}[sys.argv[1]](Path(sys.argv[2]))
