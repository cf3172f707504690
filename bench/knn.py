"""Driver of bench/knn.sh: synthetic CLS features at scDINO scale and the Python peer.

  knn.py gen --out DIR --rows N --dim D --classes C --seed S --dtype f64|f32 --ks K,K --temperature T
      Clustered Gaussian features (C class centres on the unit sphere, isotropic noise, unequal
      class sizes), rows L2-normalised, written as the bundle `trainer knn` reads
      (`{analyses}/CLS_features/bench_features.safetensors`: tensor `features` plus labels,
      paths and indices in the metadata, with the same `meta`/`sha256` header that
      trainer/src/analysis/features.rs `write` produces) and a config whose analyses directory
      is that folder. Prints the config path.
  knn.py peer --bundle FILE --seed S --ks K,K --temperature T --threads N
      Reads the same bundle (safetensors + its metadata) and runs scDINO's algorithm as
      trainer/tests/py/knn_reference.py implements it (the project's oracle; one mm + topk per k,
      as scDINO). Prints one JSON line: load and kNN seconds and the per-k counts.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "trainer", "tests", "py"))

TAG = "bench"
FORMAT = "scdino-rs/1"  # trainer/src/checkpoint.rs FORMAT
KIND = {np.dtype(np.float64): ("F64", "Double"), np.dtype(np.float32): ("F32", "Float")}


def gen(a):
    rng = np.random.default_rng(a.seed)
    dtype = np.float64 if a.dtype == "f64" else np.float32
    # Unequal class sizes (like cell types), sum exactly `rows`.
    weights = rng.uniform(0.5, 1.5, a.classes)
    sizes = np.floor(weights / weights.sum() * a.rows).astype(int)
    sizes[: a.rows - sizes.sum()] += 1
    centres = rng.normal(size=(a.classes, a.dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels = np.repeat(np.arange(a.classes), sizes)
    rng.shuffle(labels)
    x = np.empty((a.rows, a.dim), dtype=np.float64)
    step = 16384
    for s in range(0, a.rows, step):
        lab = labels[s : s + step]
        x[s : s + step] = centres[lab] + a.noise * rng.normal(size=(len(lab), a.dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x = np.ascontiguousarray(x.astype(dtype))

    names = [f"celltype{c}" for c in range(a.classes)]
    label_str = [names[c] for c in labels]
    run_dir = os.path.join(os.path.abspath(a.out), "run")
    analyses = os.path.join(run_dir, "knnbench", "benchViT_channel_A_analyses")
    feat_dir = os.path.join(analyses, "CLS_features")
    os.makedirs(feat_dir, exist_ok=True)

    st_dtype, kind = KIND[x.dtype]
    # checkpoint.rs `checksum`: SHA-256 over name, format!("{kind:?}{shape:?}") and the bytes.
    h = hashlib.sha256()
    h.update(b"features")
    h.update(f"{kind}[{x.shape[0]}, {x.shape[1]}]".encode())
    h.update(x.tobytes())
    meta = {
        "format": FORMAT,
        "epoch": 0,
        "epoch_batch": 0,
        "iteration": 0,
        "seed": 0,
        "fingerprint": json.dumps(
            {
                "labels": label_str,
                "paths": [f"synthetic/{i}.tiff" for i in range(a.rows)],
                "indices": list(range(a.rows)),
            }
        ),
        "config_yaml": "",
        "mean": [],
        "std": [],
        "epoch_totals": {"loss": 0.0, "lr": 0.0, "wd": 0.0, "steps": 0},
        "loss_scaler": None,
    }
    from safetensors.numpy import save_file

    bundle = os.path.join(feat_dir, f"{TAG}_features.safetensors")
    save_file({"features": x}, bundle, metadata={"meta": json.dumps(meta), "sha256": h.hexdigest()})
    assert st_dtype in ("F64", "F32")

    cfg = os.path.join(os.path.abspath(a.out), "knn.yaml")
    ks = ", ".join(a.ks.split(","))
    with open(cfg, "w") as f:
        f.write(
            f"""run:
  name: knnbench
  output_dir: {run_dir}
  seed: {a.seed}
data:
  dataset_dir: {os.path.abspath(a.out)}/unused
  label_folder_depth: 0
  channel_names: [A]
  channel_combinations: ["0"]
model:
  name: benchViT
downstream:
  knn:
    k: [{ks}]
    temperature: {a.temperature}
"""
        )
    print(json.dumps({"config": cfg, "bundle": bundle, "rows": a.rows, "dim": a.dim,
                      "classes": a.classes, "class_sizes": sizes.tolist(), "dtype": a.dtype}))


def peer(a):
    import torch

    torch.set_num_threads(a.threads)
    import knn_reference
    from safetensors import safe_open

    t0 = time.perf_counter()
    with safe_open(a.bundle, framework="np") as f:
        x = f.get_tensor("features")
        meta = json.loads(f.metadata()["meta"])
    labels = json.loads(meta["fingerprint"])["labels"]
    t1 = time.perf_counter()
    ks = [int(k) for k in a.ks.split(",")]
    (out,) = knn_reference.run(x, labels, a.seed, ks, a.temperature, ["stable"])
    t2 = time.perf_counter()
    for r in out["results"]:
        r.pop("confusion")
    print(json.dumps({"impl": "python", "threads": torch.get_num_threads(), "dtype": str(x.dtype),
                      "load_s": t1 - t0, "knn_s": t2 - t1, "n_train": out["n_train"],
                      "n_test": out["n_test"], "chunk": out["chunk"], "results": out["results"]}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--out", required=True)
    g.add_argument("--rows", type=int, default=113564)
    g.add_argument("--dim", type=int, default=384)
    g.add_argument("--classes", type=int, default=8)
    g.add_argument("--noise", type=float, default=0.09)
    g.add_argument("--seed", type=int, default=40)
    g.add_argument("--dtype", choices=["f64", "f32"], default="f64")
    g.add_argument("--ks", default="5,10,50,100,200,500")
    g.add_argument("--temperature", type=float, default=0.1)
    q = sub.add_parser("peer")
    q.add_argument("--bundle", required=True)
    q.add_argument("--seed", type=int, default=40)
    q.add_argument("--ks", default="5,10,50,100,200,500")
    q.add_argument("--temperature", type=float, default=0.1)
    q.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    gen(a) if a.cmd == "gen" else peer(a)


if __name__ == "__main__":
    main()
