"""`trainer metrics map` vs copairs 0.5.1 on 90,000 profiles, and `trainer metrics normalize
--method spherize` vs pycytominer 1.7.1, side by side in one run (BENCHMARKS.md).

    python bench/metrics.py TRAINER WORKDIR

Each side runs as its own process under /usr/bin/time -v (wall time, peak RSS); the script
also checks that the two agree (AP to 1e-6, spherized features to 1e-5) so the timed runs are
the same computation. The map table: 100 plates x 900 wells, 22,500 compounds in 4 replicates
on 4 different plates, 384 float32 features; positives = same compound, negatives = other
compounds on the same plate (40 M pairs). The spherize table: 10,000 x 384 (pycytominer's full
SVD allocates an n x n U, so 90,000 rows do not fit).
"""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

PY = sys.executable


def timed(cmd):
    out = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{out.stderr[-3000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", out.stderr).group(1)
    parts = [float(x) for x in wall.split(":")]
    secs = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1))
    return secs, rss / 1024 / 1024


COPAIRS = """
import sys, pandas as pd, copairs.map as m
df = pd.read_parquet(sys.argv[1])
meta = df[[c for c in df.columns if c.startswith("Metadata_")]].astype(object)
feats = df[[c for c in df.columns if not c.startswith("Metadata_")]].to_numpy()
ap = m.average_precision(meta, feats, ["Metadata_Compound"], [], ["Metadata_Plate"], ["Metadata_Compound"])
ap.to_parquet(sys.argv[2])
"""

PYCYTO = """
import sys, numpy as np, pandas as pd
from pycytominer import normalize
df = pd.read_parquet(sys.argv[1])
feats = [c for c in df.columns if not c.startswith("Metadata_")]
df[feats] = df[feats].astype(np.float64)
normalize(df, features=feats, meta_features=["Metadata_Plate"], method="spherize").to_parquet(sys.argv[2])
"""


def main(trainer, work):
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    n_plates, per_plate, reps, d = 100, 900, 4, 384
    n = n_plates * per_plate
    compounds = n // reps
    # Replicate r of compound c sits on plate (c + 25 r) % 100: four different plates.
    comp = np.repeat(np.arange(compounds), reps)
    rep = np.tile(np.arange(reps), compounds)
    plate = (comp % n_plates + 25 * rep) % n_plates
    centers = rng.normal(size=(compounds, d)).astype(np.float32)
    x = centers[comp] * 0.5 + rng.normal(size=(n, d)).astype(np.float32)
    df = pd.DataFrame({"Metadata_Plate": [f"P{p}" for p in plate],
                       "Metadata_Compound": [f"c{c}" for c in comp]})
    df = pd.concat([df, pd.DataFrame(x, columns=[f"DINO_CLS_{j}" for j in range(d)])], axis=1)
    df.to_parquet(work / "map.parquet")
    spher = df.iloc[:10_000][["Metadata_Plate"] + [f"DINO_CLS_{j}" for j in range(d)]]
    spher.to_parquet(work / "spherize.parquet")

    rows = []
    t, m = timed([trainer, "metrics", "map", "--profiles", str(work / "map.parquet"),
                  "--pos-sameby", "Metadata_Compound", "--neg-sameby", "Metadata_Plate",
                  "--neg-diffby", "Metadata_Compound", "--out", str(work / "ours_ap.parquet"),
                  "--null-size", "1000"])
    rows.append(("map AP + mAP (90,000 x 384)", "trainer metrics map", t, m))
    t, m = timed([PY, "-c", COPAIRS, str(work / "map.parquet"), str(work / "copairs_ap.parquet")])
    rows.append(("map AP (90,000 x 384)", "copairs average_precision", t, m))
    a = pd.read_parquet(work / "ours_ap.parquet")["average_precision"].to_numpy()
    b = pd.read_parquet(work / "copairs_ap.parquet")["average_precision"].to_numpy()
    assert np.nanmax(np.abs(a - b)) <= 1e-6

    t, m = timed([trainer, "metrics", "normalize", "--profiles", str(work / "spherize.parquet"),
                  "--method", "spherize", "--out", str(work / "ours_sph.parquet")])
    rows.append(("spherize ZCA-cor (10,000 x 384)", "trainer metrics normalize", t, m))
    t, m = timed([PY, "-c", PYCYTO, str(work / "spherize.parquet"), str(work / "pyc_sph.parquet")])
    rows.append(("spherize ZCA-cor (10,000 x 384)", "pycytominer normalize", t, m))
    a = pd.read_parquet(work / "ours_sph.parquet").iloc[:, 1:].to_numpy(np.float64)
    b = pd.read_parquet(work / "pyc_sph.parquet").iloc[:, 1:].to_numpy(np.float64)
    assert np.max(np.abs(a - b)) <= 1e-5, np.max(np.abs(a - b))

    print("| task | tool | wall (s) | peak RSS (GiB) |")
    print("|---|---|---:|---:|")
    for task, tool, t, m in rows:
        print(f"| {task} | {tool} | {t:.1f} | {m:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
