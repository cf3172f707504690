"""Peer of `trainer bench probe`: scikit-learn's LogisticRegression (lbfgs, multinomial) on the
same features, with C = 1/(λ·n) so both solve mean cross-entropy + λ/2·‖W‖² (bias unpenalised).

gen:  writes N clustered, L2-normalised D-d features of K classes (seeded) as a safetensors
      file with `x` (float64) and `y` (int64).
peer: fits and prints one JSON line: fit seconds, iterations, the objective at the solution
      (computed the same way as ours) and the training top-1.
"""
import argparse
import json
import time

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("mode", choices=["gen", "peer"])
p.add_argument("--data", required=True)
p.add_argument("--rows", type=int, default=90851)
p.add_argument("--dim", type=int, default=384)
p.add_argument("--classes", type=int, default=8)
p.add_argument("--seed", type=int, default=40)
p.add_argument("--l2", type=float, default=1e-4)
p.add_argument("--tol", type=float, default=1e-8)
p.add_argument("--max-iter", type=int, default=500)
p.add_argument("--threads", type=int, default=2)
a = p.parse_args()

if a.mode == "gen":
    import torch
    from safetensors.torch import save_file

    rs = np.random.RandomState(a.seed)
    centers = rs.randn(a.classes, a.dim)
    y = rs.randint(0, a.classes, a.rows)
    x = 0.02 * centers[y] + rs.randn(a.rows, a.dim) * 2.0 / np.sqrt(a.dim)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    save_file({"x": torch.from_numpy(x), "y": torch.from_numpy(y.astype(np.int64))}, a.data)
    print(json.dumps({"rows": a.rows, "dim": a.dim, "classes": a.classes}))
else:
    import os

    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    from safetensors.numpy import load_file
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    t0 = time.perf_counter()
    d = load_file(a.data)
    x, y = d["x"], d["y"]
    n = len(y)
    load_s = time.perf_counter() - t0
    with threadpool_limits(limits=a.threads):
        t1 = time.perf_counter()
        m = LogisticRegression(C=1.0 / (a.l2 * n), tol=a.tol, max_iter=a.max_iter).fit(x, y)
        fit_s = time.perf_counter() - t1
    logits = x @ m.coef_.T + m.intercept_
    mx = logits.max(1, keepdims=True)
    logp = logits - mx - np.log(np.exp(logits - mx).sum(1, keepdims=True))
    obj = -logp[np.arange(n), y].mean() + 0.5 * a.l2 * (m.coef_ ** 2).sum()
    print(json.dumps({"impl": "python-sklearn", "rows": n, "dim": x.shape[1], "l2": a.l2,
                      "threads": a.threads, "load_s": load_s, "fit_s": fit_s,
                      "iterations": int(np.max(m.n_iter_)), "objective": float(obj),
                      "train_top1_percent": float((logits.argmax(1) == y).mean() * 100)}))
