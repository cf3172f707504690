"""Oracle of `trainer metrics chammi`: CHAMMI's own evaluation (MorphEm `evaluation.py`
`evaluate` and `benchmark.py` `run_benchmark`), its logic re-implemented with scikit-learn in
place of FAISS (1-NN by `NearestNeighbors(n_neighbors=1, algorithm="brute")`, cosine = rows
scaled to unit length, as `FaissKNeighbors(metric="cosine")`; l2 = `IndexFlatL2`):

* every task but the leave-one-out one of its dataset: reference = the dataset's `Train` rows;
* HPA `Task_three` by `cell_type`, CP `Task_four` by `Plate`: for each group
  (`unique()` order) the queries are the group's rows of the task and the reference is
  `Train` plus the task's rows of the other groups; predictions concatenated;
* score = `f1_score(truth, pred, labels=np.unique(truth), average="macro")`;
* CHAMMI score = WTC2/3 + (HPA2+HPA3)/6 + (CP2+CP3+CP4)/9.

`gen DIR` writes chammi.parquet (noisy features; novel classes in HPA task 3 and CP task 4,
spread over 3 cell types / 3 plates; CHAMMI's own spellings `Allen`, `Train`, `Task_one`…
for WTC; `Metadata_cell_type` null outside HPA, `Metadata_Plate` null outside CP) and
separable.parquet (each class its own direction: every task is classified perfectly);
`check DIR` compares chammi_cosine.json and chammi_l2.json (written by the trainer) to 1e-9.
"""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

TASKS = {"WTC": ["task1", "task2"], "HPA": ["task1", "task2", "task3"],
         "CP": ["task1", "task2", "task3", "task4"]}
LEAVE_OUT = {"HPA": ("task3", "Metadata_cell_type"), "CP": ("task4", "Metadata_Plate")}
SPELL = {"train": "Train", "task1": "Task_one", "task2": "Task_two"}


def table(rng, noise):
    rows, feats = [], []
    dim = 24
    for ds, tasks in TASKS.items():
        base = rng.normal(size=(8, dim)) * 3
        for t in ["train"] + tasks:
            novel = (ds, t) in [("HPA", "task3"), ("CP", "task4")]
            classes = [4, 5, 6] if novel else [0, 1, 2, 3]
            shift = rng.normal(size=dim) * (0.0 if t in ("train", "task1") else 0.8) * noise
            for i in range(18):
                k = classes[i % len(classes)]
                group = f"g{(i // len(classes)) % 3}"
                row = {"Metadata_Dataset": "Allen" if ds == "WTC" else ds,
                       "Metadata_Task": SPELL.get(t, t) if ds == "WTC" else t,
                       "Metadata_Class": f"{ds}{k}",
                       "Metadata_cell_type": group if ds == "HPA" else None,
                       "Metadata_Plate": group if ds == "CP" else None}
                rows.append(row)
                if noise:
                    feats.append(base[k] + shift + rng.normal(size=dim) * 1.5 * noise)
                else:
                    # One direction per (dataset, class): perfectly separable.
                    v = np.zeros(dim)
                    v[list(TASKS).index(ds) * 8 + k] = 1.0 + 0.01 * i
                    feats.append(v)
    df = pd.DataFrame(rows)
    feats = np.array(feats, dtype=np.float32)
    for j in range(feats.shape[1]):
        df[f"emb{j}"] = feats[:, j]
    return df


def gen(d):
    rng = np.random.default_rng(8)
    table(rng, 1.0).to_parquet(d / "chammi.parquet")
    table(rng, 0.0).to_parquet(d / "separable.parquet")


def one_nn(ref_x, ref_y, q_x, metric):
    from sklearn.neighbors import NearestNeighbors
    if metric == "cosine":
        ref_x = ref_x / np.linalg.norm(ref_x, axis=1, keepdims=True)
        q_x = q_x / np.linalg.norm(q_x, axis=1, keepdims=True)
    _, idx = NearestNeighbors(n_neighbors=1, algorithm="brute").fit(ref_x).kneighbors(q_x)
    return ref_y[idx[:, 0]]


def evaluate(df, metric):
    from sklearn.metrics import f1_score
    x = df[[c for c in df.columns if c.startswith("emb")]].to_numpy(np.float64)
    ds_col = df["Metadata_Dataset"].replace({"Allen": "WTC"})
    task_col = df["Metadata_Task"].replace({v: k for k, v in SPELL.items()})
    y = df["Metadata_Class"].to_numpy()
    scores = {}
    for ds, tasks in TASKS.items():
        train = np.where((ds_col == ds) & (task_col == "train"))[0]
        for t in tasks:
            test = np.where((ds_col == ds) & (task_col == t))[0]
            if LEAVE_OUT.get(ds, (None,))[0] != t:
                pred, truth = one_nn(x[train], y[train], x[test], metric), y[test]
            else:
                col = df[LEAVE_OUT[ds][1]].to_numpy()
                pred, truth = [], []
                for g in pd.unique(col[test]):
                    held = test[col[test] == g]
                    rest = np.concatenate((train, test[col[test] != g]))
                    pred.append(one_nn(x[rest], y[rest], x[held], metric))
                    truth.append(y[held])
                pred, truth = np.concatenate(pred), np.concatenate(truth)
            scores[(ds, t)] = f1_score(truth, pred, labels=np.unique(truth), average="macro")
    final = scores[("WTC", "task2")] / 3 + (scores[("HPA", "task2")] + scores[("HPA", "task3")]) / 6 \
        + (scores[("CP", "task2")] + scores[("CP", "task3")] + scores[("CP", "task4")]) / 9
    return scores, final


def check(d):
    df = pd.read_parquet(d / "chammi.parquet")
    errs = {}
    for metric in ["cosine", "l2"]:
        got = json.loads((d / f"chammi_{metric}.json").read_text())
        scores, final = evaluate(df, metric)
        for (ds, t), f in scores.items():
            errs[f"{metric}_{ds}_{t}"] = abs(f - got["tasks"][ds][t])
        errs[f"{metric}_final"] = abs(final - got["final_score"])
        # The leave-one-out tasks are not what fitting on the training rows alone gives.
        assert scores[("HPA", "task3")] > 0.0 and scores[("CP", "task4")] > 0.0, scores
    sep, final = evaluate(pd.read_parquet(d / "separable.parquet"), "cosine")
    assert final == 1.0, (final, sep)
    bad = {k: v for k, v in errs.items() if not v <= 1e-9}
    assert not bad, bad
    print(json.dumps({"max_err": max(errs.values()), "checked": sorted(errs)}))


if __name__ == "__main__":
    {"gen": gen, "check": check}[sys.argv[1]](Path(sys.argv[2]))
