"""`trainer metrics profile` vs the same recipe in pycytominer 1.7.1 + copairs 0.5.1, from single
cells to replicate and activity mAP, side by side in one run (issue 47, the 7.7M-cell row).

    python bench/profile_scale.py TRAINER WORKDIR PEER_PLATES [OURS_ONLY_PLATES ...]

A synthetic screen of P plates x 384 wells x 200 cells x 384 float32 features (`Cells_F*`):
the same plate map on every plate (32 DMSO wells, `negcon`; 352 perturbations, one well each,
so each perturbation has P replicate wells, one a plate), plate effects (shift and scale),
perturbation effects (a third of them none), 0.01 % NaN cells. Recipe (recipe.yaml, the JUMP
steps without sphering): aggregate (median by plate + well) -> mad_robustize per plate on the
negcons -> feature_select [frequency_threshold, correlation_threshold, drop_na_columns] ->
mAP of replicate retrieval across plates and of phenotypic activity against the negcons
(null 1,000, threshold 0.05).

For PEER_PLATES both sides run, each a process of its own under /usr/bin/time -v at nice 10
(wall time, peak RSS): ours (`trainer metrics profile`) and a Python process doing the recipe
with pycytominer (aggregate, normalize per plate, feature_select) and copairs
(average_precision + mean_average_precision; assign_reference_index for activity), reading
the same Parquet file. The script checks the two sides agree (the same features kept in the
same order; mean mAP of both questions to 1e-3) before printing. For each OURS_ONLY_PLATES
count only ours runs (the peer needs the whole cell table in pandas: about 7.5 GiB a million
cells, so 100 plates, 7.7M cells, do not fit this 23 GiB host).
"""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
from map_scale import timed  # noqa: E402

WELLS, CELLS, D, NEGCON_WELLS = 384, 200, 384, 32
PY = sys.executable

RECIPE = """\
perturbation: Metadata_perturbation
negcon: Metadata_control_type == negcon
aggregate:
  strata: [Metadata_Plate, Metadata_Well]
  operation: median
normalize:
  method: mad_robustize
  by: [Metadata_Plate]
  samples: negcon
feature_select:
  operations: [frequency_threshold, correlation_threshold, drop_na_columns]
map:
  null_size: 1000
  threshold: 0.05
"""

PEER = r"""
import json, sys, tempfile, pandas as pd
from pycytominer import aggregate, feature_select, normalize
import copairs.map as cmap
from copairs.matching import assign_reference_index
cells = pd.read_parquet(sys.argv[1])
META = ["Metadata_Plate", "Metadata_Well", "Metadata_perturbation", "Metadata_control_type"]
NEGCON = "Metadata_control_type == 'negcon'"
feats = [c for c in cells.columns if not c.startswith("Metadata_")]
agg = aggregate(cells, strata=META[:2], features=feats, operation="median",
                compute_object_count=True, object_feature="Metadata_ObjectNumber")
agg = agg.merge(cells[META].drop_duplicates(), on=META[:2], how="left")
del cells
meta = META + ["Metadata_Object_Count"]
norm = pd.concat([normalize(g, features=feats, meta_features=meta, samples=NEGCON,
                            method="mad_robustize")
                  for _, g in agg.groupby("Metadata_Plate", sort=False)]).loc[agg.index]
sel = feature_select(norm, features=feats,
                     operation=["frequency_threshold", "correlation_threshold", "drop_na_columns"])
kept = [c for c in sel.columns if c not in meta]
out = {"kept": kept}
pert = "Metadata_perturbation"
def run(df, pos_sameby, pos_diffby, neg_sameby, neg_diffby):
    m = df[[c for c in df.columns if c.startswith("Metadata_")]].astype(object)
    ap = cmap.average_precision(m, df[kept].to_numpy(), pos_sameby, pos_diffby, neg_sameby,
                                neg_diffby)
    mp = cmap.mean_average_precision(ap, [pert], 1000, 0.05, 0, cache_dir=tempfile.mkdtemp())
    return float(mp["mean_average_precision"].mean())
out["replicate"] = run(sel, [pert], ["Metadata_Plate"], [], [pert])
ref = "Metadata_Reference_Index"
act = assign_reference_index(sel.reset_index(drop=True), NEGCON)
out["activity"] = run(act, [pert, ref], [], [], [pert, ref])
json.dump(out, open(sys.argv[2], "w"))
"""


def screen(path, plates, rng):
    """Writes the cell table plate by plate (row groups of one plate: bounded memory)."""
    effects = rng.normal(size=(WELLS - NEGCON_WELLS, D)).astype(np.float32) * 0.5
    effects[::3] = 0
    wells = [f"{'ABCDEFGHIJKLMNOP'[w // 24]}{w % 24 + 1:02d}" for w in range(WELLS)]
    pert = ["DMSO"] * NEGCON_WELLS + [f"p{k}" for k in range(WELLS - NEGCON_WELLS)]
    ctl = ["negcon"] * NEGCON_WELLS + ["trt"] * (WELLS - NEGCON_WELLS)
    writer = None
    for p in range(plates):
        shift = rng.normal(size=D).astype(np.float32) * 0.5
        scale = (1 + 0.3 * rng.random(D)).astype(np.float32)
        w = np.repeat(np.arange(WELLS), CELLS)
        x = rng.standard_normal((WELLS * CELLS, D), dtype=np.float32)
        treated = w >= NEGCON_WELLS
        x[treated] += effects[w[treated] - NEGCON_WELLS]
        x = x * scale + shift
        x[rng.random(x.shape[0]) < 1e-4, 0] = np.nan
        cols = {
            "Metadata_Plate": pa.array([f"P{p + 1}"] * len(w)),
            "Metadata_Well": pa.array([wells[i] for i in w]),
            "Metadata_perturbation": pa.array([pert[i] for i in w]),
            "Metadata_control_type": pa.array([ctl[i] for i in w]),
            "Metadata_ObjectNumber": pa.array(np.tile(np.arange(1, CELLS + 1), WELLS)),
        }
        for j in range(D):
            cols[f"Cells_F{j}"] = pa.array(x[:, j])
        t = pa.table(cols)
        if writer is None:
            writer = pq.ParquetWriter(path, t.schema)
        writer.write_table(t)
    writer.close()


def ours(trainer, work, name):
    out = work / f"ours_{name}"
    t, m = timed([trainer, "metrics", "profile", "--profiles", str(work / f"{name}.parquet"),
                  "--recipe", str(work / "recipe.yaml"), "--out-dir", str(out)])
    s = json.loads((out / "summary.json").read_text())
    kept = pd.read_parquet(out / "feature_selected.parquet").columns
    kept = [c for c in kept if not c.startswith("Metadata_")]
    return t, m, {"kept": kept, "replicate": s["replicate"]["map"]["mean_map"],
                  "activity": s["activity"]["map"]["mean_map"]}


def main(trainer, work, peer_plates, ours_plates):
    work.mkdir(parents=True, exist_ok=True)
    (work / "recipe.yaml").write_text(RECIPE)
    (work / "peer.py").write_text(PEER)
    rng = np.random.default_rng(0)
    rows = []
    name = f"screen{peer_plates}"
    screen(work / f"{name}.parquet", peer_plates, rng)
    cells = peer_plates * WELLS * CELLS
    t, m, got = ours(trainer, work, name)
    pt, pm = timed([PY, str(work / "peer.py"), str(work / f"{name}.parquet"),
                    str(work / "peer.json")])
    want = json.loads((work / "peer.json").read_text())
    assert got["kept"] == want["kept"], (len(got["kept"]), len(want["kept"]))
    for q in ["replicate", "activity"]:
        assert abs(got[q] - want[q]) <= 1e-3, (q, got[q], want[q])
    task = f"{peer_plates} plates, {cells:,} cells x {D}"
    rows.append((task, "trainer metrics profile", t, m))
    rows.append((task, "pycytominer + copairs", pt, pm))
    rows.append((f"{task}: ratio peer / ours (mAP replicate {got['replicate']:.4f} vs "
                 f"{want['replicate']:.4f}, activity {got['activity']:.4f} vs "
                 f"{want['activity']:.4f}; {len(got['kept'])} features kept by both)", "",
                 pt / t, pm / m))
    for plates in ours_plates:
        name = f"screen{plates}"
        screen(work / f"{name}.parquet", plates, rng)
        t, m, _ = ours(trainer, work, name)
        rows.append((f"{plates} plates, {plates * WELLS * CELLS:,} cells x {D}",
                     "trainer metrics profile", t, m))
        (work / f"{name}.parquet").unlink()
    print("| task | tool | wall (s) | peak RSS (GiB) |")
    print("|---|---|---:|---:|")
    for task, tool, t, m in rows:
        print(f"| {task} | {tool} | {t:.1f} | {m:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), [int(a) for a in sys.argv[4:]])
