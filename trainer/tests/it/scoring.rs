//! `trainer metrics` against the Python libraries it follows, one oracle process per family
//! (tests/py/map_oracle.py: copairs; batch_oracle.py: scib and scikit-learn;
//! normalize_oracle.py: pycytominer), and its errors on bad tables.
use std::path::Path;
use std::process::Command;

use super::util::run_py_file;

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

/// The error of a run that must fail, with the words it must name.
fn fails_naming(dir: &Path, args: &[&str], words: &[&str]) {
    let (ok, _, err) = metrics(dir, args);
    assert!(!ok, "trainer metrics {args:?} should fail");
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
fn batch_and_chammi_equal_scib_and_scikit_learn() {
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
    ok(
        d,
        &[
            "chammi",
            "--profiles",
            "chammi.parquet",
            "--json",
            "chammi.json",
        ],
    );
    let report = run_py_file("batch_oracle.py", &["check", d.to_str().unwrap()]);
    assert!(
        report.contains("silhouette_batch") && report.contains("chammi_final"),
        "{report}"
    );
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

#[test]
fn normalize_equals_pycytominer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_py_file("normalize_oracle.py", &["gen", d.to_str().unwrap()]);
    let (c, by) = (
        "--controls=Metadata_Condition=Control",
        "--by=Metadata_Plate",
    );
    let cases: [(&str, &str, &[&str]); 9] = [
        ("standardize_all", "standardize", &[]),
        ("standardize_controls_per_plate", "standardize", &[c, by]),
        ("robustize_controls", "robustize", &[c]),
        ("mad_robustize_per_plate", "mad_robustize", &[by]),
        ("spherize_zca_cor_controls", "spherize", &[c]),
        ("spherize_zca_cor_per_plate", "spherize", &[by]),
        ("spherize_zca", "spherize", &["--spherize-method", "ZCA"]),
        (
            "spherize_pca_cor",
            "spherize",
            &["--spherize-method", "PCA-cor"],
        ),
        ("spherize_wide", "spherize", &[]),
    ];
    for (name, method, extra) in cases {
        let table = if name == "spherize_wide" {
            "wide.parquet"
        } else {
            "plates.parquet"
        };
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
        ok(d, &args);
    }
    let report = run_py_file("normalize_oracle.py", &["check", d.to_str().unwrap()]);
    assert!(report.contains("spherize_wide"), "{report}");
    let p = "plates.parquet";
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
