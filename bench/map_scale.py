"""`trainer metrics map` vs copairs 0.5.1 at scale (issue 47, "Scale"), side by side in one run.

    python bench/map_scale.py TRAINER WORKDIR [replicate] [activity] [threads] [cells]

Sections (all when none is named):
  replicate  90,000 x 192 well profiles (100 plates x 900 wells, 22,500 compounds in 4
             replicates on 4 plates); positives: same compound; negatives: other compounds on
             the same plate. Ours (AP + mAP, 1,000-draw null) and copairs `average_precision`.
  activity   90,000 x 192 (16 DMSO wells a plate: 1,600 controls; 22,100 compounds in 4
             replicates); copairs' phenotypic-activity recipe (`assign_reference_index`,
             pos_sameby = neg_diffby = [compound, reference index]): every treated well is
             ranked against all 1,600 controls (141 M pairs).
  threads    ours on the replicate table pinned to one core (`taskset -c 0`) and on both.
  cells      1,000,000 x 192 cell-level profiles (250 plates x 200 wells x 20 cells, 12,500
             compounds in 4 wells on 4 plates); positives: same compound on other plates (60
             a cell); negatives: other compounds on the same plate (3,980 a cell): 4.0e9
             pairs. Ours only: copairs holds every pair (two int64 indices and a similarity,
             at least 20 bytes each: 80 GB), which the 23 GB host cannot hold.

Each run is its own process under /usr/bin/time -v (wall time, peak RSS) at nice 10; the
script checks that ours and copairs agree (pair counts exactly; AP to 1e-9 on all but at most
1 row in 1,000, whose near-tied pairs copairs' float32 sums may order the other way; 1e-2 on
those; observed: 2 and 10 rows of 90,000) before printing.
"""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

PY = sys.executable
D = 192

COPAIRS = """
import sys, json, pandas as pd, copairs.map as m
from copairs.matching import assign_reference_index
df = pd.read_parquet(sys.argv[1])
rules = json.loads(sys.argv[3])
if rules.get("reference"):
    df = assign_reference_index(df, rules["reference"])
meta = df[[c for c in df.columns if c.startswith("Metadata_")]].astype(object)
feats = df[[c for c in df.columns if not c.startswith("Metadata_")]].to_numpy()
ap = m.average_precision(meta, feats, rules["pos_sameby"], rules["pos_diffby"],
                         rules["neg_sameby"], rules["neg_diffby"])
ap.to_parquet(sys.argv[2])
"""


def timed(cmd, pin=None):
    pre = ["taskset", "-c", pin] if pin else []
    out = subprocess.run(["nice", "-n", "10", "/usr/bin/time", "-v", *pre, *cmd],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{out.stderr[-3000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", out.stderr).group(1)
    parts = [float(x) for x in wall.split(":")]
    secs = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1))
    return secs, rss / 1024 / 1024


def table(path, plate, compound, x, extra=None):
    cols = {"Metadata_Plate": [f"P{p}" for p in plate],
            "Metadata_Compound": [f"c{c}" if c >= 0 else "DMSO" for c in compound]}
    cols.update(extra or {})
    df = pd.DataFrame(cols)
    df = pd.concat([df, pd.DataFrame(x, columns=[f"DINO_CLS_{j}" for j in range(x.shape[1])])],
                   axis=1)
    df.to_parquet(path)


def replicate_table(path, rng):
    n_plates, per_plate, reps = 100, 900, 4
    comp = np.repeat(np.arange(n_plates * per_plate // reps), reps)
    rep = np.tile(np.arange(reps), len(comp) // reps)
    plate = (comp % n_plates + 25 * rep) % n_plates
    centers = rng.normal(size=(comp.max() + 1, D)).astype(np.float32)
    x = centers[comp] * 0.5 + rng.normal(size=(len(comp), D)).astype(np.float32)
    table(path, plate, comp, x)


def activity_table(path, rng):
    n_plates, per_plate, controls = 100, 900, 16
    treated = n_plates * (per_plate - controls)
    comp = np.repeat(np.arange(treated // 4), 4)
    rep = np.tile(np.arange(4), treated // 4)
    plate = (comp % n_plates + 25 * rep) % n_plates
    centers = rng.normal(size=(comp.max() + 1, D)).astype(np.float32)
    x = centers[comp] * rng.uniform(0, 0.6, size=(comp.max() + 1, 1)).astype(np.float32)[comp]
    x = x + rng.normal(size=(treated, D)).astype(np.float32)
    cplate = np.repeat(np.arange(n_plates), controls)
    cx = rng.normal(size=(len(cplate), D)).astype(np.float32)
    cond = ["Treated"] * treated + ["Control"] * len(cplate)
    table(path, np.concatenate([plate, cplate]), np.concatenate([comp, -np.ones(len(cplate), int)]),
          np.concatenate([x, cx]), {"Metadata_Condition": cond})


def cells_table(path, rng):
    plates, wells, cells = 250, 200, 20
    n_wells = plates * wells
    # Well w of compound c (4 wells a compound) sits on plate (c + 62 r) % 250, r = 0..3.
    comp = np.repeat(np.arange(n_wells // 4), 4)
    rep = np.tile(np.arange(4), n_wells // 4)
    plate = (comp % plates + 62 * rep) % plates
    centers = rng.normal(size=(comp.max() + 1, D)).astype(np.float32) * 0.4
    cc, cp = np.repeat(comp, cells), np.repeat(plate, cells)
    chunks = [centers[cc[i:i + 100_000]] + rng.normal(size=(min(100_000, len(cc) - i), D)).astype(np.float32)
              for i in range(0, len(cc), 100_000)]
    table(path, cp, cc, np.concatenate(chunks))


REPLICATE = {"pos_sameby": ["Metadata_Compound"], "pos_diffby": [],
             "neg_sameby": ["Metadata_Plate"], "neg_diffby": ["Metadata_Compound"]}
REFCOLS = ["Metadata_Compound", "Metadata_Reference_Index"]
ACTIVITY = {"pos_sameby": REFCOLS, "pos_diffby": [], "neg_sameby": [], "neg_diffby": REFCOLS,
            "reference": "Metadata_Condition == 'Control'"}
CELLS = {"pos_sameby": ["Metadata_Compound"], "pos_diffby": ["Metadata_Plate"],
         "neg_sameby": ["Metadata_Plate"], "neg_diffby": ["Metadata_Compound"]}


def ours(trainer, work, name, rules, pin=None, tag=""):
    args = [trainer, "metrics", "map", "--profiles", str(work / f"{name}.parquet"),
            "--out", str(work / f"ours_{name}{tag}.parquet"), "--null-size", "1000"]
    for flag in ["pos_sameby", "pos_diffby", "neg_sameby", "neg_diffby"]:
        if rules[flag]:
            args += ["--" + flag.replace("_", "-"), ",".join(rules[flag])]
    if rules.get("reference"):
        args += ["--reference", "Metadata_Condition=Control", "--map-by", "Metadata_Compound"]
    return timed(args, pin)


def copairs(work, name, rules):
    import json
    t = timed([PY, "-c", COPAIRS, str(work / f"{name}.parquet"),
               str(work / f"copairs_{name}.parquet"), json.dumps(rules)])
    a = pd.read_parquet(work / f"ours_{name}.parquet")
    b = pd.read_parquet(work / f"copairs_{name}.parquet")
    for c in ["n_pos_pairs", "n_total_pairs"]:
        assert (a[c].to_numpy() == b[c].to_numpy()).all(), c
    x, y = a["average_precision"].to_numpy(), b["average_precision"].to_numpy()
    assert (np.isnan(x) == np.isnan(y)).all()
    diff = np.abs(x - y)
    err, off = float(np.nanmax(diff)), int((diff > 1e-9).sum())
    # copairs sums each cosine in float32 (numpy), ours in float64: a positive and a negative
    # within a float32 rounding of each other may swap, moving that row's AP by ~1/rank^2.
    assert err <= 1e-2 and off <= len(x) // 1_000, (err, off)
    return t, f"{err:.1e} on {off} rows"


def main(trainer, work, sections):
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for name, gen, rules in [("replicate", replicate_table, REPLICATE),
                             ("activity", activity_table, ACTIVITY)]:
        if name not in sections and not (name == "replicate" and "threads" in sections):
            continue
        gen(work / f"{name}.parquet", rng)
        if name not in sections:
            continue
        (t1, m1) = ours(trainer, work, name, rules)
        (t2, m2), err = copairs(work, name, rules)
        rows.append((f"{name} 90,000 x {D}", "trainer metrics map (AP + mAP)", t1, m1))
        rows.append((f"{name} 90,000 x {D}", "copairs average_precision (AP)", t2, m2))
        rows.append((f"{name} ratio copairs / ours (max AP diff {err})", "", t2 / t1, m2 / m1))
    if "threads" in sections:
        for pin, label in [("0", "1 thread (taskset -c 0)"), (None, "2 threads")]:
            t, m = ours(trainer, work, "replicate", REPLICATE, pin, tag="_pin")
            rows.append((f"replicate 90,000 x {D}, {label}", "trainer metrics map", t, m))
    if "cells" in sections:
        cells_table(work / "cells.parquet", rng)
        t, m = ours(trainer, work, "cells", CELLS)
        rows.append((f"cells 1,000,000 x {D} (4.0e9 pairs)", "trainer metrics map", t, m))
    print("| task | tool | wall (s) | peak RSS (GiB) |")
    print("|---|---|---:|---:|")
    for task, tool, t, m in rows:
        print(f"| {task} | {tool} | {t:.1f} | {m:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]),
         set(sys.argv[3:]) or {"replicate", "activity", "threads", "cells"})
