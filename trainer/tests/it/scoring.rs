//! `trainer metrics` against the Python libraries it follows, one oracle process per family
//! (tests/py/map_oracle.py: copairs; batch_oracle.py: scib and scikit-learn;
//! normalize_oracle.py: pycytominer), and its errors on bad tables.
use std::path::Path;
use std::process::Command;

use super::util::{run_py_file, run_python};

/// Runs `trainer metrics ARGS` in `dir`, returning (success, stdout, stderr).
fn metrics(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .current_dir(dir)
        .arg("metrics")
        .args(args)
        .output()
        .expect("trainer runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let (ok, out, err) = metrics(dir, args);
    assert!(ok, "trainer metrics {args:?} failed:\n{err}");
    out
}

/// The error of a run that must fail, with the words it must name (an error, not a panic).
fn fails_naming(dir: &Path, args: &[&str], words: &[&str]) {
    let (ok, _, err) = metrics(dir, args);
    assert!(!ok, "trainer metrics {args:?} should fail");
    assert!(
        !err.contains("panicked"),
        "trainer metrics {args:?} panicked:\n{err}"
    );
    for w in words {
        assert!(
            err.contains(w),
            "error of {args:?} does not name {w:?}:\n{err}"
        );
    }
}

#[test]
fn map_equals_copairs_on_ties_single_members_and_controls() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_py_file("map_oracle.py", &["gen", d.to_str().unwrap()]);
    let case = |name: &str, table: &str, rules: &[&str]| {
        let (ap, map) = (format!("{name}_ap.parquet"), format!("{name}_map.parquet"));
        let mut args = vec!["map", "--profiles", table, "--out", &ap, "--map-out", &map];
        args.extend_from_slice(&["--null-size", "2000", "--seed", "1"]);
        args.extend_from_slice(rules);
        ok(d, &args)
    };
    let rep = "replicate.parquet";
    let summary = case(
        "replicate",
        rep,
        &[
            "--pos-sameby",
            "Metadata_Class",
            "--neg-diffby",
            "Metadata_Class",
        ],
    );
    assert!(summary.contains("\"mean_map\""), "{summary}");
    case(
        "across_donors",
        rep,
        &[
            "--pos-sameby",
            "Metadata_Class",
            "--pos-diffby",
            "Metadata_Donor",
            "--neg-diffby",
            "Metadata_Class",
        ],
    );
    case(
        "within_donor_negs",
        rep,
        &[
            "--pos-sameby",
            "Metadata_Class",
            "--neg-sameby",
            "Metadata_Donor",
            "--neg-diffby",
            "Metadata_Class",
        ],
    );
    // Plates of 350 rows: several tiles of the engine, pairs across tiles counted once.
    case(
        "tiles",
        "tiles.parquet",
        &[
            "--pos-sameby",
            "Metadata_Compound",
            "--neg-sameby",
            "Metadata_Plate",
            "--neg-diffby",
            "Metadata_Compound",
        ],
    );
    let refcols = "Metadata_Compound,Metadata_Reference_Index";
    case(
        "activity",
        "activity.parquet",
        &[
            "--reference",
            "Metadata_Condition=Control",
            "--pos-sameby",
            refcols,
            "--neg-diffby",
            refcols,
            "--map-by",
            "Metadata_Compound",
        ],
    );
    let report = run_py_file("map_oracle.py", &["check", d.to_str().unwrap()]);
    for name in [
        "replicate",
        "across_donors",
        "within_donor_negs",
        "tiles",
        "activity",
    ] {
        assert!(report.contains(&format!("\"{name}\"")), "{report}");
    }
    // Bad input names the file and the column.
    fails_naming(
        d,
        &[
            "map",
            "--profiles",
            rep,
            "--pos-sameby",
            "Metadata_Plate",
            "--neg-diffby",
            "Metadata_Class",
            "--out",
            "x.parquet",
        ],
        &["replicate.parquet", "Metadata_Plate"],
    );
    fails_naming(
        d,
        &[
            "map",
            "--profiles",
            rep,
            "--pos-sameby",
            "Metadata_Class",
            "--neg-diffby",
            "Metadata_Class",
            "--pos-diffby",
            "Metadata_Class",
            "--out",
            "x.parquet",
        ],
        &["replicate.parquet", "Metadata_Class"],
    );
    fails_naming(
        d,
        &[
            "map",
            "--profiles",
            rep,
            "--pos-sameby",
            "Metadata_Well",
            "--neg-diffby",
            "Metadata_Class",
            "--out",
            "x.parquet",
        ],
        &["replicate.parquet", "no positive pairs"],
    );
    fails_naming(
        d,
        &[
            "map",
            "--profiles",
            "absent.parquet",
            "--pos-sameby",
            "Metadata_Class",
            "--out",
            "x.parquet",
        ],
        &["absent.parquet"],
    );
}

#[test]
fn batch_equals_scib_and_scikit_learn() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_py_file("batch_oracle.py", &["gen", d.to_str().unwrap()]);
    let b = "batch.parquet";
    let out = ok(d, &["batch", "--profiles", b, "--json", "batch_k15.json"]);
    ok(
        d,
        &[
            "batch",
            "--profiles",
            b,
            "--n-neighbors",
            "5",
            "--json",
            "batch_k5.json",
        ],
    );
    let report = run_py_file("batch_oracle.py", &["check", d.to_str().unwrap()]);
    assert!(report.contains("silhouette_batch"), "{report}");
    // The table has a donor shift: the scores see it next to the shuffled-donor control.
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = |k: &str| s[k].as_f64().unwrap();
    assert!(
        f("silhouette_batch") < f("silhouette_batch_shuffled") - 0.1,
        "{out}"
    );
    assert!(
        f("f1_leave_one_batch_out") < f("f1_leave_one_batch_out_shuffled") - 0.2,
        "{out}"
    );
    fails_naming(
        d,
        &["batch", "--profiles", b, "--batch", "Metadata_Plate"],
        &["batch.parquet", "Metadata_Plate"],
    );
    fails_naming(
        d,
        &["chammi", "--profiles", b],
        &["batch.parquet", "Metadata_Dataset"],
    );
}

/// `metrics chammi` equals CHAMMI's evaluation (tests/py/chammi_oracle.py re-implements
/// MorphEm's `evaluate` with scikit-learn) with novel classes in the leave-one-out tasks
/// (HPA task 3 by cell type, CP task 4 by plate), with both 1-NN metrics; a perfectly
/// separable table scores 1.0 on every task.
#[test]
fn chammi_equals_chammi_evaluation_with_leave_one_out_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_py_file("chammi_oracle.py", &["gen", d.to_str().unwrap()]);
    for metric in ["cosine", "l2"] {
        let json = format!("chammi_{metric}.json");
        ok(
            d,
            &[
                "chammi",
                "--profiles",
                "chammi.parquet",
                "--metric",
                metric,
                "--json",
                &json,
            ],
        );
    }
    let report = run_py_file("chammi_oracle.py", &["check", d.to_str().unwrap()]);
    assert!(report.contains("cosine_CP_task4"), "{report}");
    let out = ok(d, &["chammi", "--profiles", "separable.parquet"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["final_score"].as_f64(), Some(1.0), "{out}");
    for (ds, tasks) in v["tasks"].as_object().unwrap() {
        for (t, f) in tasks.as_object().unwrap() {
            assert_eq!(f.as_f64(), Some(1.0), "{ds} {t}: {out}");
        }
    }
    assert_eq!(
        v["leave_one_out_groups"]["CP/task4"]
            .as_array()
            .unwrap()
            .len(),
        3,
        "{out}"
    );
    // The leave-one-out groups are read on the task's rows only: a null there is refused.
    let row = run_python(
        r#"
import sys, pandas as pd
from pathlib import Path
d = Path(sys.argv[1])
df = pd.read_parquet(d / "chammi.parquet")
i = df.index[(df.Metadata_Dataset == "CP") & (df.Metadata_Task == "task4")][5]
df.loc[i, "Metadata_Plate"] = None
df.to_parquet(d / "null_plate.parquet")
print(i)
"#,
        &[d.to_str().unwrap()],
    );
    fails_naming(
        d,
        &["chammi", "--profiles", "null_plate.parquet"],
        &[
            "null_plate.parquet",
            "Metadata_Plate",
            &format!("row {}", row.trim()),
        ],
    );
}

#[test]
fn normalize_equals_pycytominer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_py_file("normalize_oracle.py", &["gen", d.to_str().unwrap()]);
    let (c, by) = (
        "--controls=Metadata_Condition=Control",
        "--by=Metadata_Plate",
    );
    let (pca, pca_cor) = ("--spherize-method=PCA", "--spherize-method=PCA-cor");
    let (p, w, wp) = ("plates.parquet", "wide.parquet", "wide_plates.parquet");
    let cases: [(&str, &str, &str, &[&str]); 13] = [
        ("standardize_all", p, "standardize", &[]),
        ("standardize_controls_per_plate", p, "standardize", &[c, by]),
        ("robustize_controls", p, "robustize", &[c]),
        ("mad_robustize_per_plate", p, "mad_robustize", &[by]),
        ("spherize_zca_cor_controls", p, "spherize", &[c]),
        ("spherize_zca_cor_per_plate", p, "spherize", &[by]),
        ("spherize_zca", p, "spherize", &["--spherize-method", "ZCA"]),
        ("spherize_pca_cor", p, "spherize", &[pca_cor]),
        ("spherize_wide", w, "spherize", &[]),
        ("spherize_pca", p, "spherize", &[pca]),
        ("spherize_pca_wide", w, "spherize", &[pca]),
        ("spherize_pca_wide_per_plate", wp, "spherize", &[pca, by]),
        (
            "spherize_pca_cor_wide_per_plate",
            wp,
            "spherize",
            &[pca_cor, by],
        ),
    ];
    for (name, table, method, extra) in cases {
        let out = format!("{name}.parquet");
        let mut args = vec![
            "normalize",
            "--profiles",
            table,
            "--method",
            method,
            "--out",
            &out,
        ];
        args.extend_from_slice(extra);
        let (success, _, err) = metrics(d, &args);
        assert!(success, "trainer metrics {args:?} failed:\n{err}");
        // Spherize fitted on no more rows than features says so, with the numbers.
        let warning = match name {
            "spherize_wide" | "spherize_pca_wide" => {
                Some("spherize is fitted on 9 rows for 14 features: centred, they span at most 8 directions, and the other 6")
            }
            "spherize_pca_wide_per_plate" | "spherize_pca_cor_wide_per_plate" => {
                Some("Metadata_Plate=P1: spherize is fitted on 11 rows for 20 features")
            }
            _ => None,
        };
        match warning {
            Some(w) => assert!(err.contains(w), "{name}: no warning {w:?} in:\n{err}"),
            None => assert!(!err.contains("spherize is fitted"), "{name}:\n{err}"),
        }
    }
    let report = run_py_file("normalize_oracle.py", &["check", d.to_str().unwrap()]);
    // Every PCA output equals pycytominer's up to sign, and the sign convention holds.
    for name in [
        "spherize_pca_wide_per_plate",
        "spherize_pca_cor_wide_per_plate",
        "spherize_pca_convention",
        "spherize_pca_cor_convention",
    ] {
        assert!(report.contains(name), "{report}");
    }
    fails_naming(
        d,
        &[
            "normalize",
            "--profiles",
            p,
            "--method",
            "standardize",
            "--controls",
            "Metadata_Condition=DMSO",
            "--out",
            "x.parquet",
        ],
        &["plates.parquet", "no control rows"],
    );
    fails_naming(
        d,
        &[
            "normalize",
            "--profiles",
            p,
            "--method",
            "standardize",
            "--by",
            "Metadata_Well",
            "--out",
            "x.parquet",
        ],
        &["plates.parquet", "Metadata_Well"],
    );
    fails_naming(
        d,
        &[
            "normalize",
            "--profiles",
            p,
            "--method",
            "standardize",
            "--controls",
            "Metadata_Cond=Control",
            "--out",
            "x.parquet",
        ],
        &["plates.parquet", "Metadata_Cond"],
    );
}

/// Runs `trainer ARGS` in `dir` and requires success, returning stdout.
fn trainer(dir: &Path, args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .current_dir(dir)
        .args(args)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("trainer runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "trainer {args:?} failed:\n{err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The donor effect of `trainer synth` is in the features before any training, and the batch
/// score sees it next to its shuffled-donor control: the test folder's 2 donors × 8 classes ×
/// 5 images of 32 px, embedded (all 5 channels, min–max scaled per image and channel as every
/// stage does) by the initial weights (one step at the warm-up's learning rate 0), scored with
/// `trainer metrics batch --batch Metadata_Donor`: 0.75 against a control of 0.91 here (other
/// initial weights gave margins of 0.06 to 0.16; the seed is fixed).
///
/// synth's donor effect is uneven illumination, a ±10 % ramp whose direction turns with the
/// donor; min–max scaling keeps it (it is not a per-channel affine map), so a faint channel's
/// background slopes one way for donor 1 and the other way for donor 2. synth's former donor
/// effect, a gain of ±2 % on the marker signal, could not pass this test: each channel of an
/// image was then an affine map of the same image without it (up to the noise, whose spread
/// the gain changed by 1 %), which min–max scaling maps to the same input, and the per-cell
/// gain ×exp(N(0, 0.15)) already varies far more. A prototype of this test with a timm ViT on
/// min–max scaled images gave 0.93 against a control of 0.93 with no effect, 0.76 against 0.90
/// with the ramp.
#[test]
fn synth_donor_effect_shows_in_untrained_features_against_the_shuffled_control() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("data");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    trainer(
        d,
        &[
            "synth",
            "--out",
            &s(&data),
            "--seed",
            "2",
            "--per-class",
            "40",
            "--size",
            "32",
        ],
    );
    let cfg = d.join("run.yaml");
    std::fs::write(
        &cfg,
        format!(
            "run: {{name: donor, output_dir: {out}, seed: 1}}\ndata: {{dataset_dir: {train}, channel_names: [APC, BF, DAPI, GREEN, PE], channel_combinations: [\"01234\"], num_workers: 1}}\nmodel: {{name: m, arch: vit_tiny, out_dim: 32}}\ntrain: {{epochs: 1, batch_size_per_gpu: 4, precision: fp32, warmup_epochs: 1}}\naugment: {{global_crop_size: 32, local_crop_size: 16, local_crops_number: 1}}\ndownstream: {{features: {{resize_length: 32}}}}\n",
            out = s(&d.join("out")),
            train = s(&data.join("Training")),
        ),
    )
    .unwrap();
    trainer(
        d,
        &[
            "train",
            "--config",
            &s(&cfg),
            "--max-steps",
            "1",
            "--threads",
            "1",
        ],
    );
    let config = trainer::config::Config::load(&cfg).unwrap();
    let ck = trainer::layout::RunLayout::new(&config)
        .model(&config, &config.training_channels(0).unwrap())
        .latest_checkpoint();
    trainer(
        d,
        &[
            "embed",
            "--checkpoint",
            &s(&ck),
            "--images",
            &s(&data.join("Test")),
            "--path-pattern",
            "{Donor}/{Condition}/{Class}/{File}.tiff",
            "--out",
            "test.parquet",
        ],
    );
    let out = ok(
        d,
        &[
            "batch",
            "--profiles",
            "test.parquet",
            "--batch",
            "Metadata_Donor",
            "--label",
            "Metadata_Class",
            "--json",
            "batch.json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = |k: &str| v[k].as_f64().unwrap();
    assert!(
        f("silhouette_batch") < f("silhouette_batch_shuffled") - 0.08,
        "{out}"
    );
}

/// Tables as pandas, polars and pyarrow write them read whole (tests/py/shapes_oracle.py):
/// a float metadata column with NaN (nulls in the file), booleans, nullable integers,
/// categoricals, enums, dates and timestamps, unsigned 64-bit integers, a null in a
/// non-`Metadata_` string column and a nested column. A null is refused only in a column the
/// command pairs or groups by, naming it and the row; a NaN feature names column and row.
#[test]
fn pandas_and_polars_tables_read_with_nulls_booleans_and_every_type() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_py_file("shapes_oracle.py", &["gen", d.to_str().unwrap()]);
    let map = |table: &str, out: &str, extra: &[&str]| {
        let mut args = vec![
            "map",
            "--profiles",
            table,
            "--pos-sameby",
            "Metadata_Class",
            "--neg-diffby",
            "Metadata_Class",
            "--null-size",
            "200",
            "--out",
            out,
        ];
        args.extend_from_slice(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let args = map("pandas.parquet", "pandas_ap.parquet", &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let full: serde_json::Value = serde_json::from_str(&ok(d, &args)).unwrap();
    let args = map("plain.parquet", "plain_ap.parquet", &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let plain: serde_json::Value = serde_json::from_str(&ok(d, &args)).unwrap();
    // The unused columns change nothing.
    assert_eq!(full["mean_map"], plain["mean_map"], "{full} vs {plain}");
    // Booleans and categoricals group rows.
    ok(
        d,
        &[
            "batch",
            "--profiles",
            "pandas.parquet",
            "--batch",
            "Metadata_Flag",
            "--label",
            "Metadata_Cat",
            "--n-neighbors",
            "5",
        ],
    );
    // A null where the command pairs by the column names it and its row.
    for (col, row) in [("Metadata_Conc", "row 0"), ("Image_FileName", "row 9")] {
        let args = map("pandas.parquet", "x.parquet", &["--pos-diffby", col]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_naming(d, &args, &["pandas.parquet", col, row]);
    }
    let args = map("nan_feature.parquet", "x.parquet", &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails_naming(d, &args, &["nan_feature.parquet", "Cells_F2", "row 7"]);
    ok(
        d,
        &[
            "normalize",
            "--profiles",
            "polars.parquet",
            "--method",
            "standardize",
            "--controls",
            "Metadata_Control=true",
            "--out",
            "polars_norm.parquet",
        ],
    );
    let report = run_py_file("shapes_oracle.py", &["check", d.to_str().unwrap()]);
    assert!(report.contains("Metadata_Time"), "{report}");
}

/// Every `metrics` command on an empty table, a table of one row, one group, or without the
/// control rows it needs: an error (not a panic) naming the table and what is missing.
#[test]
fn degenerate_tables_are_errors_naming_the_table_and_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_python(
        r#"
import sys, numpy as np, pandas as pd
from pathlib import Path
d = Path(sys.argv[1])
rng = np.random.default_rng(0)
def table(n, cls, donor, cond, name):
    df = pd.DataFrame({"Metadata_Class": cls(n), "Metadata_Donor": donor(n),
                       "Metadata_Condition": cond(n), "Metadata_Dataset": ["WTC"] * n,
                       "Metadata_Task": [["train", "task2"][i % 2] for i in range(n)]})
    x = rng.normal(size=(n, 3)).astype(np.float32)
    for j in range(3):
        df[f"Cells_F{j}"] = x[:, j]
    df.to_parquet(d / name)
var = lambda p: (lambda n: [f"{p}{i % 2}" for i in range(n)])
same = lambda v: (lambda n: [v] * n)
table(0, var("c"), var("D"), var("C"), "empty.parquet")
table(1, var("c"), var("D"), same("Control"), "one_row.parquet")
table(8, same("c0"), same("D0"), same("Control"), "one_group.parquet")
table(8, var("c"), var("D"), same("Treated"), "no_controls.parquet")
table(8, var("c"), var("D"), lambda n: ["Control"] + ["Treated"] * (n - 1), "one_control.parquet")
"#,
        &[d.to_str().unwrap()],
    );
    let map = |t: &'static str| {
        vec![
            "map",
            "--profiles",
            t,
            "--pos-sameby",
            "Metadata_Class",
            "--neg-diffby",
            "Metadata_Class",
            "--out",
            "x.parquet",
        ]
    };
    let batch = |t: &'static str| vec!["batch", "--profiles", t, "--n-neighbors", "2"];
    let norm = |t: &'static str| {
        vec![
            "normalize",
            "--profiles",
            t,
            "--method",
            "standardize",
            "--out",
            "x.parquet",
        ]
    };
    let chammi = |t: &'static str| vec!["chammi", "--profiles", t];
    for t in ["empty.parquet", "one_row.parquet"] {
        let have = if t == "empty.parquet" {
            "none (it is empty)"
        } else {
            "has 1"
        };
        for args in [map(t), batch(t), norm(t), chammi(t)] {
            fails_naming(d, &args, &[t, "needs at least 2 rows", have]);
        }
    }
    let g = "one_group.parquet";
    fails_naming(d, &map(g), &[g, "no negative pairs", "one group"]);
    fails_naming(d, &batch(g), &[g, "Metadata_Donor", "one value (`D0`)"]);
    fails_naming(d, &chammi(g), &[g, "Metadata_Dataset=HPA"]);
    let mut one_control = norm("one_control.parquet");
    one_control.extend(["--controls", "Metadata_Condition=Control"]);
    fails_naming(
        d,
        &one_control,
        &["one_control.parquet", "has 1 row to fit on (control)"],
    );
    let n = "no_controls.parquet";
    let mut controls = norm(n);
    controls.extend(["--controls", "Metadata_Condition=Control"]);
    fails_naming(
        d,
        &controls,
        &[n, "no control rows", "Metadata_Condition=Control"],
    );
    let mut reference = map(n);
    reference.extend(["--reference", "Metadata_Condition=Control"]);
    fails_naming(
        d,
        &reference,
        &[n, "no row has `Metadata_Condition` = `Control`"],
    );
    // A group of one row to fit on.
    let mut one = norm("one_group.parquet");
    one.extend([
        "--controls",
        "Metadata_Condition=Control",
        "--by",
        "Metadata_Task",
    ]);
    ok(d, &one);
}

/// `metrics consensus` equals pycytominer's `consensus` (median and mean) on replicate
/// groups of 1 to 5 rows with ties, NaN features (some rows, and every row of a group), a
/// null key, and an extra metadata column (dropped, as pycytominer drops it); an empty table
/// and an absent replicate column are errors naming the table.
#[test]
fn consensus_equals_pycytominer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_py_file("consensus_oracle.py", &["gen", d.to_str().unwrap()]);
    for op in ["median", "mean"] {
        let out = format!("consensus_{op}.parquet");
        ok(
            d,
            &[
                "consensus",
                "--profiles",
                "replicates.parquet",
                "--operation",
                op,
                "--out",
                &out,
            ],
        );
    }
    let report = run_py_file("consensus_oracle.py", &["check", d.to_str().unwrap()]);
    assert!(
        report.contains("median") && report.contains("mean"),
        "{report}"
    );
    fails_naming(
        d,
        &[
            "consensus",
            "--profiles",
            "replicates.parquet",
            "--replicate-columns",
            "Metadata_Compound",
            "--out",
            "x.parquet",
        ],
        &["replicates.parquet", "Metadata_Compound"],
    );
    run_python(
        "import sys, pandas as pd; pd.read_parquet(sys.argv[1] + '/replicates.parquet').iloc[:0].to_parquet(sys.argv[1] + '/none.parquet')",
        &[d.to_str().unwrap()],
    );
    fails_naming(
        d,
        &[
            "consensus",
            "--profiles",
            "none.parquet",
            "--out",
            "x.parquet",
        ],
        &[
            "none.parquet",
            "consensus needs at least 1 row;",
            "it is empty",
        ],
    );
}

/// `metrics select` keeps the columns pycytominer's `feature_select` keeps, in the same
/// order, for each operation alone, all of them in sequence and a sequence where a later
/// operation sees only what the earlier kept (tests/py/select_oracle.py: near-constant,
/// dominant-value and two-valued features, correlated pairs, NaN columns, ties, a blocklist).
#[test]
fn select_equals_pycytominer_feature_select() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_py_file("select_oracle.py", &["gen", d.to_str().unwrap()]);
    let cases: [(&str, &str); 7] = [
        ("default", "variance_threshold"),
        ("frequency", "frequency_threshold"),
        ("correlation", "correlation_threshold"),
        ("na", "drop_na_columns"),
        ("blocklist", "blocklist"),
        (
            "all",
            "variance_threshold,frequency_threshold,correlation_threshold,drop_na_columns,blocklist",
        ),
        ("corr_then_na", "correlation_threshold,drop_na_columns"),
    ];
    for (name, ops) in cases {
        let out = format!("select_{name}.parquet");
        ok(
            d,
            &[
                "select",
                "--profiles",
                "features.parquet",
                "--operations",
                ops,
                "--blocklist",
                "blocklist.csv",
                "--out",
                &out,
            ],
        );
    }
    let report = run_py_file("select_oracle.py", &["check", d.to_str().unwrap()]);
    assert!(report.contains("corr_then_na"), "{report}");
}
