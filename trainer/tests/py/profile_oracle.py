"""Oracle of `trainer metrics profile`: the same recipe run by hand, pycytominer 1.7.1 then
copairs 0.5.1, step by step, each step fed by the previous Python step (not by the
trainer's tables), and every intermediate table of the trainer compared with it.

`gen DIR` writes cells.parquet, a small synthetic screen (pandas, float32): 3 plates of 16
wells (4 negative-control wells `DMSO`, 6 perturbations on 2 wells each), 5 to 11 cells a
well, plate effects (shift and scale), perturbation effects of increasing size (pert0 none),
features correlated with others (correlation_threshold drops them), one constant feature
(frequency_threshold drops it), a blocklisted feature and a few NaN cells; recipe.yaml (the
JUMP recipe's steps with spherize added and a smaller null) and blocklist.csv.

`check DIR` runs:
  aggregate(strata=[Metadata_Plate, Metadata_Well], median, compute_object_count) and the
    plate map merged back (perturbation, control type);
  normalize(mad_robustize, samples="Metadata_control_type == 'negcon'") per plate;
  feature_select([frequency_threshold, correlation_threshold, drop_na_columns, blocklist]);
  normalize(spherize, ZCA-cor, samples negcon);
  copairs average_precision + mean_average_precision for replicate retrieval across plates
  and for phenotypic activity (assign_reference_index on the negcons);
and requires: aggregated.parquet equal (median exactly; count and metadata equal),
normalized.parquet and spherized.parquet to 1e-4 (the trainer's steps run on float32 tables,
pycytominer's on float64), the same features kept in the same order, AP and mAP to 1e-4,
p-values within the Monte-Carlo error of two independent nulls, the trainer's BH correction
exact on its own p-values, summary.json's numbers equal to its tables, and the PNG and HTML
files present (a PNG signature, the page linking every table and figure).
"""
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

NULL_SIZE = 2000
META = ["Metadata_Plate", "Metadata_Well", "Metadata_perturbation", "Metadata_control_type"]
NEGCON = "Metadata_control_type == 'negcon'"


def gen(d):
    rng = np.random.default_rng(7)
    n_base = 8
    rows, feats = [], []
    effects = {f"pert{k}": rng.normal(size=n_base) * 0.6 * k for k in range(6)}
    for p in range(3):
        shift, scale = rng.normal(size=n_base) * 0.5, 1 + 0.3 * rng.random(n_base)
        wells = [("DMSO", "negcon")] * 4 + [(f"pert{k}", "trt") for k in range(6)] * 2
        for w, (pert, ctl) in enumerate(wells):
            well = f"{'ABCD'[w // 4]}{w % 4 + 1:02d}"
            effect = effects.get(pert, np.zeros(n_base))
            for _ in range(rng.integers(5, 12)):
                x = (rng.normal(size=n_base) + effect) * scale + shift
                rows.append({"Metadata_Plate": f"P{p + 1}", "Metadata_Well": well,
                             "Metadata_perturbation": pert, "Metadata_control_type": ctl,
                             "Metadata_Site": int(rng.integers(1, 4))})
                feats.append(x)
    x = np.array(feats)
    n = len(rows)
    df = pd.DataFrame(rows)
    df["Metadata_ObjectNumber"] = np.arange(1, n + 1)
    for j in range(n_base):
        df[f"Cells_F{j}"] = x[:, j].astype(np.float32)
    # Correlated copies (correlation_threshold drops one of each pair).
    df["Nuclei_G0"] = (x[:, 0] * 2 + rng.normal(size=n) * 0.05).astype(np.float32)
    df["Nuclei_G1"] = (-x[:, 1] + rng.normal(size=n) * 0.05).astype(np.float32)
    df["Cytoplasm_Constant"] = np.float32(1.5)
    df["Cytoplasm_Blocked"] = rng.normal(size=n).astype(np.float32)
    df.loc[[3, 40, 41], "Cells_F2"] = np.nan
    df = df.iloc[rng.permutation(n)].reset_index(drop=True)
    df.to_parquet(d / "cells.parquet")
    (d / "blocklist.csv").write_text("blocklist\nCytoplasm_Blocked\n")
    (d / "recipe.yaml").write_text(f"""\
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
  operations: [frequency_threshold, correlation_threshold, drop_na_columns, blocklist]
  blocklist: blocklist.csv
spherize:
  method: ZCA-cor
  samples: negcon
map:
  null_size: {NULL_SIZE}
  threshold: 0.05
""")


def close(name, got, want, tol):
    a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert a.shape == b.shape, (name, a.shape, b.shape)
    assert (np.isnan(a) == np.isnan(b)).all(), (name, "NaN pattern")
    err = float(np.nanmax(np.abs(a - b))) if a.size else 0.0
    assert err <= tol, (name, err, tol)
    return err


def check_map(d, name, df, feats, pos_sameby, pos_diffby, neg_sameby, neg_diffby, summary):
    import copairs.map as cmap
    from statsmodels.stats.multitest import multipletests

    meta = df[[c for c in df.columns if c.startswith("Metadata_")]].astype(object)
    want = cmap.average_precision(meta, df[feats].to_numpy(), pos_sameby, pos_diffby,
                                  neg_sameby, neg_diffby)
    got = pd.read_parquet(d / f"{name}_ap.parquet")
    assert len(got) == len(want), (name, len(got), len(want))
    for c in ["n_pos_pairs", "n_total_pairs"]:
        assert (got[c].to_numpy() == want[c].to_numpy()).all(), (name, c)
    err = {"ap": close(f"{name} AP", got["average_precision"], want["average_precision"], 1e-4)}
    wmap = cmap.mean_average_precision(want, ["Metadata_perturbation"], NULL_SIZE, 0.05, 0,
                                       cache_dir=tempfile.mkdtemp())
    gmap = pd.read_parquet(d / f"{name}_map.parquet")
    assert list(gmap["Metadata_perturbation"]) == list(wmap["Metadata_perturbation"]), name
    err["map"] = close(f"{name} mAP", gmap["mean_average_precision"],
                       wmap["mean_average_precision"], 1e-4)
    p, q = gmap["p_value"].to_numpy(), wmap["p_value"].to_numpy()
    pm = (p + q) / 2
    tol = 5 * np.sqrt(2 * pm * (1 - pm) / NULL_SIZE) + 2 / (NULL_SIZE + 1)
    assert (np.abs(p - q) <= tol).all(), (name, p, q, tol)
    bh = multipletests(p, method="fdr_bh")[1]
    assert np.allclose(gmap["corrected_p_value"], bh, rtol=0, atol=1e-12), name
    s = summary[name]["map"]
    assert s["groups"] == len(gmap), name
    assert abs(s["mean_map"] - gmap["mean_average_precision"].mean()) < 1e-12, name
    assert abs(s["fraction_retrieved"] - (bh < 0.05).mean()) < 1e-12, name
    err["max_p_diff"] = float(np.max(np.abs(p - q)))
    err["fraction_retrieved"] = s["fraction_retrieved"]
    return err


def check(d):
    from copairs.matching import assign_reference_index
    from pycytominer import aggregate, feature_select, normalize

    cells = pd.read_parquet(d / "cells.parquet")
    feats = [c for c in cells.columns if not c.startswith("Metadata_")]
    report = {}

    # 1. aggregate, plate map merged back.
    agg = aggregate(cells, strata=META[:2], features=feats, operation="median",
                    compute_object_count=True, object_feature="Metadata_ObjectNumber")
    plate_map = cells[META].drop_duplicates()
    agg = agg.merge(plate_map, on=META[:2], how="left")
    got = pd.read_parquet(d / "aggregated.parquet")
    assert list(got.columns) == META + ["Metadata_Object_Count"] + feats, list(got.columns)
    for c in META:
        assert list(got[c]) == list(agg[c]), c
    assert (got["Metadata_Object_Count"].to_numpy() == agg["Metadata_Object_Count"].to_numpy()).all()
    report["aggregate"] = close("aggregate", got[feats], agg[feats], 0.0)

    # 2. mad_robustize per plate on the negative controls.
    meta = META + ["Metadata_Object_Count"]
    parts = [normalize(g, features=feats, meta_features=meta, samples=NEGCON,
                       method="mad_robustize") for _, g in agg.groupby("Metadata_Plate", sort=False)]
    norm = pd.concat(parts).loc[agg.index]
    got = pd.read_parquet(d / "normalized.parquet")
    assert list(got.columns) == meta + feats, list(got.columns)
    report["normalize"] = close("normalize", got[feats], norm[feats], 1e-4)

    # 3. feature_select.
    ops = ["frequency_threshold", "correlation_threshold", "drop_na_columns", "blocklist"]
    sel = feature_select(norm, features=feats, operation=ops,
                         blocklist_file=str(d / "blocklist.csv"))
    kept = [c for c in sel.columns if c not in meta]
    got = pd.read_parquet(d / "feature_selected.parquet")
    assert list(got.columns) == meta + kept, (list(got.columns), kept)
    assert "Cytoplasm_Constant" not in kept and "Cytoplasm_Blocked" not in kept, kept
    assert len(kept) < len(feats) - 2, ("correlation_threshold dropped nothing", kept)
    report["feature_select"] = close("feature_select", got[kept], sel[kept], 1e-4)
    report["kept"] = kept

    # 4. spherize (ZCA-cor, fitted on the negative controls of the whole screen).
    sph = normalize(sel, features=kept, meta_features=meta, samples=NEGCON, method="spherize",
                    spherize_method="ZCA-cor", spherize_epsilon=1e-6)
    got = pd.read_parquet(d / "spherized.parquet")
    assert list(got.columns) == meta + kept, list(got.columns)
    report["spherize"] = close("spherize", got[kept], sph[kept], 1e-4)

    # 5. mAP: replicate retrieval across plates, phenotypic activity against negcons.
    summary = json.loads((d / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == \
        ["aggregate", "normalize", "feature_select", "spherize"], summary["steps"]
    pert = "Metadata_perturbation"
    report["replicate"] = check_map(d, "replicate", sph, kept, [pert], ["Metadata_Plate"], [],
                                    [pert], summary)
    act = assign_reference_index(sph.reset_index(drop=True), NEGCON)
    ref = "Metadata_Reference_Index"
    report["activity"] = check_map(d, "activity", act, kept, [pert, ref], [], [], [pert, ref],
                                   summary)
    assert report["activity"]["fraction_retrieved"] > 0, "no active perturbation found"

    # 6. figures and page.
    html = (d / "index.html").read_text()
    for f in ["replicate_map_vs_p.png", "activity_map_vs_p.png", "map_per_plate.png"]:
        assert (d / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f
        assert f'src="{f}"' in html, f
    for f in ["aggregated.parquet", "normalized.parquet", "feature_selected.parquet",
              "spherized.parquet", "replicate_ap.parquet", "activity_map.parquet",
              "summary.json"]:
        assert f'href="{f}"' in html, f
    plates = [p for p, _ in summary["replicate"]["map_per_plate"]]
    assert plates == ["P1", "P2", "P3"], plates
    print(json.dumps(report))


if __name__ == "__main__":
    {"gen": gen, "check": check}[sys.argv[1]](Path(sys.argv[2]))
