"""`trainer metrics aggregate` vs pycytominer 1.7.1 `aggregate` on a single-cell table,
side by side in one run (BENCHMARKS.md, "Aggregating single cells").

    python bench/aggregate.py TRAINER WORKDIR [CELLS] [FEATURES]

Writes WORKDIR/cells.parquet (pyarrow, row groups of 100,000 cells, Snappy): CELLS cells
(default 1,000,000) x FEATURES float32 features (default 384, `Cells_F*`), 4 plates x 384
wells with about the same number of cells per well, rows shuffled so a well's cells are spread
over the whole file, and 0.1 % NaN. Then each side runs as its own process under
/usr/bin/time -v (wall time, peak RSS): the trainer's `metrics aggregate --operation median`,
and a Python process that reads the table with pandas and calls pycytominer's
`aggregate(strata=[Metadata_Plate, Metadata_Well], features=<the features>,
operation="median", compute_object_count=True)` and writes the result as Parquet (what the
field does). The script then checks the two outputs are equal (medians exactly) and prints one
JSON line per side plus the ratio.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PY = sys.executable
PEER = """
import sys, pandas as pd
from pycytominer import aggregate
df = pd.read_parquet(sys.argv[1])
feats = [c for c in df.columns if not c.startswith("Metadata_")]
out = aggregate(df, strata=["Metadata_Plate", "Metadata_Well"], features=feats,
                operation="median", compute_object_count=True,
                object_feature="Metadata_ObjectNumber")
out.to_parquet(sys.argv[2])
"""


def timed(cmd):
    out = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{out.stderr[-3000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", out.stderr).group(1)
    parts = [float(x) for x in wall.split(":")]
    secs = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1))
    return {"wall_s": round(secs, 2), "peak_rss_gib": round(rss_kb / 2**20, 3)}


def gen(path, cells, dim):
    rng = np.random.default_rng(0)
    plates, wells = 4, 384
    group = rng.permutation(np.arange(cells) % (plates * wells))
    names = [f"Cells_F{j}" for j in range(dim)]
    writer = None
    for start in range(0, cells, 100_000):
        g = group[start:start + 100_000]
        n = len(g)
        cols = {
            "Metadata_Plate": pa.array([f"P{p}" for p in g // wells]),
            "Metadata_Well": pa.array([f"{chr(65 + w // 24)}{w % 24 + 1:02d}" for w in g % wells]),
            "Metadata_ObjectNumber": pa.array(np.arange(start, start + n) + 1),
        }
        x = rng.normal(size=(n, dim)).astype(np.float32)
        x[rng.random((n, dim)) < 0.001] = np.nan
        for j, name in enumerate(names):
            cols[name] = pa.array(x[:, j], from_pandas=True)
        table = pa.table(cols)
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema, compression="snappy")
        writer.write_table(table)
    writer.close()


def main():
    trainer, work = sys.argv[1], Path(sys.argv[2])
    cells = int(sys.argv[3]) if len(sys.argv) > 3 else 1_000_000
    dim = int(sys.argv[4]) if len(sys.argv) > 4 else 384
    work.mkdir(parents=True, exist_ok=True)
    src = work / "cells.parquet"
    if not src.exists():
        gen(src, cells, dim)
    size = src.stat().st_size / 2**30
    ours = timed([trainer, "metrics", "aggregate", "--profiles", str(src),
                  "--operation", "median", "--out", str(work / "ours.parquet")])
    peer = timed([PY, "-c", PEER, str(src), str(work / "peer.parquet")])
    import pandas as pd

    a, b = pd.read_parquet(work / "ours.parquet"), pd.read_parquet(work / "peer.parquet")
    assert list(a.columns) == list(b.columns), (a.columns, b.columns)
    assert (a["Metadata_Well"].to_numpy() == b["Metadata_Well"].to_numpy()).all()
    assert (a["Metadata_Object_Count"].to_numpy() == b["Metadata_Object_Count"].to_numpy()).all()
    feats = [c for c in a.columns if not c.startswith("Metadata_")]
    err = float(np.nanmax(np.abs(a[feats].to_numpy() - b[feats].to_numpy())))
    assert err == 0.0, err
    common = {"cells": cells, "features": dim, "groups": len(a), "table_gib": round(size, 3)}
    print(json.dumps({"tool": "trainer metrics aggregate", **common, **ours}))
    print(json.dumps({"tool": "pycytominer aggregate", **common, **peer}))
    print(json.dumps({"max_abs_diff": err,
                      "wall_ratio_peer_over_ours": round(peer["wall_s"] / ours["wall_s"], 2),
                      "rss_ratio_peer_over_ours": round(peer["peak_rss_gib"] / ours["peak_rss_gib"], 2)}))


if __name__ == "__main__":
    main()
