//! Parquet profiles read where profiling happens: pandas (pyarrow) and polars read our table
//! with the documented columns and types, its values equal the safetensors bundle, and
//! pycytominer's `normalize` and `feature_select` run on it; a table pandas writes (double
//! features, extra metadata) reads back here; broken tables are refused naming file and
//! column.
use super::util::run_python;
use tch::{Kind, Tensor};
use trainer::analysis::features::{self, FeatureSet};
use trainer::analysis::profiles::{self, ProfileRows, ProfilesError};
use trainer::config::DatasetLocation;

fn feature_set(rows: usize, dim: usize) -> FeatureSet {
    // Deterministic values without the process-wide generator (other tests draw from it).
    let values: Vec<f32> = (0..rows * dim)
        .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 1.7)
        .collect();
    FeatureSet {
        features: Tensor::from_slice(&values).reshape([rows as i64, dim as i64]),
        labels: (0..rows)
            .map(|i| ["B", "CD4T", "NK"][i % 3].to_string())
            .collect(),
        paths: (0..rows)
            .map(|i| {
                format!(
                    "/data/Test/Donor0{}/Control/{}/cell{i}.tiff",
                    1 + i % 2,
                    ["B", "CD4T", "NK"][i % 3]
                )
            })
            .collect(),
        indices: (0..rows).collect(),
        tag: "epoch4".into(),
        checkpoint: "/runs/checkpoint0004.safetensors".into(),
        checkpoint_epoch: Some(5),
    }
}

#[test]
fn pandas_polars_and_pycytominer_read_our_table() {
    let dir = tempfile::tempdir().unwrap();
    let set = feature_set(60, 8);
    let table = dir.path().join("epoch4_profiles.parquet");
    let bundle = dir.path().join("epoch4_features.safetensors");
    profiles::write(
        &table,
        &[ProfileRows {
            set: &set,
            split: "test",
            root: &DatasetLocation::Local("/data/Test".into()),
        }],
        &["DAPI".into(), "CD3".into()],
    )
    .unwrap();
    features::write_bundle(&bundle, &set).unwrap();
    let out = run_python(
        r#"
import sys, json, numpy as np, pandas as pd, polars as pl
from safetensors.numpy import load_file
from pycytominer import normalize, feature_select
table, bundle = sys.argv[1], sys.argv[2]
df = pd.read_parquet(table)
pf = pl.read_parquet(table)
feats = [c for c in df.columns if c.startswith("DINO_CLS_")]
ref = load_file(bundle)["features"]
meta = [c for c in df.columns if c.startswith("Metadata_")]
norm = normalize(df, features=feats, meta_features=meta, method="standardize")
sel = feature_select(norm, features=feats, operation=["variance_threshold", "correlation_threshold"])
print(json.dumps({
    "columns": list(df.columns),
    "dtypes": sorted({str(df[c].dtype) for c in feats}),
    "polars_dtypes": sorted({str(pf[c].dtype) for c in feats}),
    "rows": len(df), "polars_rows": pf.height,
    "equal_bundle": bool(np.array_equal(df[feats].to_numpy(), ref)),
    "polars_equal": bool(np.array_equal(pf.select(feats).to_numpy(), ref)),
    "class": df["Metadata_Class"].tolist()[:3],
    "donor": sorted(set(df["Metadata_Donor"])),
    "condition": sorted(set(df["Metadata_Condition"])),
    "split": sorted(set(df["Metadata_Split"])),
    "epoch": int(df["Metadata_Epoch"].iloc[0]),
    "channels": df["Metadata_Channels"].iloc[0],
    "checkpoint": df["Metadata_Checkpoint"].iloc[0],
    "path": df["Metadata_ImagePath"].iloc[1],
    "normalized_mean": float(np.abs(norm[feats].to_numpy().mean(axis=0)).max()),
    "selected_rows": len(sel), "selected_meta": all(m in sel.columns for m in meta),
}))
"#,
        &[table.to_str().unwrap(), bundle.to_str().unwrap()],
    );
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let columns: Vec<String> = serde_json::from_value(got["columns"].clone()).unwrap();
    let expected_meta = [
        "Metadata_ImagePath",
        "Metadata_Class",
        "Metadata_Split",
        "Metadata_Donor",
        "Metadata_Condition",
        "Metadata_Checkpoint",
        "Metadata_Epoch",
        "Metadata_Channels",
    ];
    assert_eq!(columns[..8], expected_meta);
    assert_eq!(columns.len(), 8 + 8);
    assert_eq!(columns[8], "DINO_CLS_0");
    assert_eq!(got["dtypes"], serde_json::json!(["float32"]));
    assert_eq!(got["polars_dtypes"], serde_json::json!(["Float32"]));
    assert_eq!(
        (got["rows"].as_u64(), got["polars_rows"].as_u64()),
        (Some(60), Some(60))
    );
    assert_eq!(got["equal_bundle"], true, "{got}");
    assert_eq!(got["polars_equal"], true, "{got}");
    assert_eq!(got["class"], serde_json::json!(["B", "CD4T", "NK"]));
    assert_eq!(got["donor"], serde_json::json!(["Donor01", "Donor02"]));
    assert_eq!(got["condition"], serde_json::json!(["Control"]));
    assert_eq!(got["split"], serde_json::json!(["test"]));
    assert_eq!(got["epoch"], 5);
    assert_eq!(got["channels"], "DAPI+CD3");
    assert_eq!(got["checkpoint"], "/runs/checkpoint0004.safetensors");
    assert_eq!(got["path"], set.paths[1].as_str());
    assert!(got["normalized_mean"].as_f64().unwrap() < 1e-5, "{got}");
    assert_eq!(got["selected_rows"], 60);
    assert_eq!(got["selected_meta"], true);

    // Training rows (no donor folder) beside the test rows: null donor and condition there.
    let mut train = feature_set(4, 8);
    train.paths = (0..4)
        .map(|i| format!("/data/Training/{}/t{i}.tiff", train.labels[i]))
        .collect();
    let mixed = dir.path().join("mixed_profiles.parquet");
    profiles::write(
        &mixed,
        &[
            ProfileRows {
                set: &train,
                split: "train",
                root: &DatasetLocation::Local("/data/Training".into()),
            },
            ProfileRows {
                set: &set,
                split: "test",
                root: &DatasetLocation::Local("/data/Test".into()),
            },
        ],
        &["DAPI".into()],
    )
    .unwrap();
    let out = run_python(
        r#"
import sys, json, pandas as pd
df = pd.read_parquet(sys.argv[1])
print(json.dumps({"null_donors": int(df["Metadata_Donor"].isna().sum()),
                  "first_test_donor": df["Metadata_Donor"].iloc[4],
                  "null_conditions": int(df["Metadata_Condition"].isna().sum())}))
"#,
        &[mixed.to_str().unwrap()],
    );
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        got,
        serde_json::json!({"null_donors": 4, "first_test_donor": "Donor01", "null_conditions": 4})
    );
    let back = profiles::read(&mixed).unwrap();
    assert_eq!(back.labels.len(), 64);
    assert_eq!(back.rows_where_split("train", true), [0, 1, 2, 3]);
}

#[test]
fn tables_written_by_pandas_read_back_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_python(
        r#"
import sys, numpy as np, pandas as pd
d = sys.argv[1]
rng = np.random.default_rng(3)
x = rng.normal(size=(25, 4))
df = pd.DataFrame(x, columns=["Cells_AreaShape_Area", "Cells_Intensity_Mean", "Nuclei_Texture", "Cytoplasm_X"])
df.insert(0, "Metadata_Well", ["A01"] * 25)
df.insert(0, "Metadata_Class", [f"c{i % 4}" for i in range(25)])
df.insert(0, "Metadata_Split", ["train"] * 20 + ["test"] * 5)
df.to_parquet(f"{d}/cp_profiles.parquet")
np.save(f"{d}/cp.npy", x)
df.drop(columns=["Metadata_Class"]).to_parquet(f"{d}/noclass.parquet")
bad = df.copy(); bad["Cells_AreaShape_Area"] = bad["Cells_AreaShape_Area"].astype(object); bad.loc[3, "Cells_AreaShape_Area"] = None
bad["Cells_AreaShape_Area"] = bad["Cells_AreaShape_Area"].astype("float64")
bad.to_parquet(f"{d}/null.parquet")
df.assign(Cells_Label=["x"] * 25).to_parquet(f"{d}/stringfeature.parquet")
"#,
        &[d.to_str().unwrap()],
    );
    let table = profiles::read(&d.join("cp_profiles.parquet")).unwrap();
    assert_eq!(
        table.feature_names,
        [
            "Cells_AreaShape_Area",
            "Cells_Intensity_Mean",
            "Nuclei_Texture",
            "Cytoplasm_X"
        ]
    );
    assert_eq!(table.labels[..5], ["c0", "c1", "c2", "c3", "c0"]);
    assert_eq!(table.rows_where_split("train", true).len(), 20);
    assert_eq!(table.checkpoint_epoch, None);
    assert_eq!(profiles::tag_of(&d.join("cp_profiles.parquet")), "cp");
    let expect = run_python(
        "import sys, numpy as np; print(' '.join(repr(float(v)) for v in np.load(sys.argv[1]).astype(np.float32).ravel()))",
        &[d.join("cp.npy").to_str().unwrap()],
    );
    let expect: Vec<f32> = expect
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    let ours = Vec::<f32>::try_from(table.features.to_kind(Kind::Float).flatten(0, -1)).unwrap();
    assert_eq!(
        ours, expect,
        "double features become the same float32 values"
    );

    let err = profiles::read(&d.join("noclass.parquet")).unwrap_err();
    assert!(matches!(
        err,
        ProfilesError::MissingColumn {
            column: "Metadata_Class",
            ..
        }
    ));
    assert!(err.to_string().contains("noclass.parquet"), "{err}");
    let err = profiles::read(&d.join("null.parquet")).unwrap_err();
    assert!(
        matches!(&err, ProfilesError::RowCount { column, found: 24, rows: 25, .. } if column == "Cells_AreaShape_Area"),
        "{err}"
    );
    assert!(err.to_string().contains("null.parquet"), "{err}");
    let err = profiles::read(&d.join("stringfeature.parquet")).unwrap_err();
    assert!(
        matches!(&err, ProfilesError::ColumnType { column, .. } if column == "Cells_Label"),
        "{err}"
    );
    let err = profiles::read(&d.join("missing.parquet")).unwrap_err();
    assert!(err.to_string().contains("missing.parquet"), "{err}");
}

/// scDINO's CSV, byte for byte against numpy's `savetxt(fmt="%.18e")` (what scDINO ran), on
/// f32 values whose exact expansion has exactly 20 significant digits (a rounding tie at the
/// 19th) and on ordinary, tiny, huge and negative ones.
#[test]
fn feature_csv_equals_numpy_savetxt_including_ties() {
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours.csv");
    let theirs = dir.path().join("numpy.csv");
    let values = run_python(
        r#"
import numpy as np
from decimal import Decimal
rng = np.random.default_rng(7)
ties = []
for b in rng.integers(0x30000000, 0x4f000000, size=200000, dtype=np.uint32):
    v = np.uint32(b).view(np.float32)
    digits = Decimal(float(v)).as_tuple().digits
    while digits and digits[-1] == 0:
        digits = digits[:-1]
    if len(digits) == 20:
        ties.append(float(v))
    if len(ties) == 64:
        break
other = [0.1, -2.5, 1e-30, 3.4e38, -7.25e-8, 123456.789, 2.0**-21, 2.0**100, 0.0]
vals = np.array(ties + other, dtype=np.float32)
print(" ".join(repr(float(v)) for v in vals))
"#,
        &[],
    );
    let values: Vec<f32> = values
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(values.len(), 64 + 9, "found too few ties");
    let x = Tensor::from_slice(&values).reshape([1, values.len() as i64]);
    features::write_csv(&ours, &x).unwrap();
    run_python(
        r#"
import sys, numpy as np
vals = np.array([float(v) for v in sys.argv[2:]], dtype=np.float32).reshape(1, -1)
np.savetxt(sys.argv[1], vals.astype(np.float64), delimiter=",")
"#,
        &[theirs.to_str().unwrap()]
            .into_iter()
            .chain(
                values
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .iter()
                    .map(String::as_str),
            )
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        std::fs::read_to_string(&ours).unwrap(),
        std::fs::read_to_string(&theirs).unwrap()
    );
}
