//! The profiling recipe from single cells (`trainer metrics aggregate`, `trainer metrics
//! profile`) against pycytominer and copairs run by hand (tests/py/aggregate_oracle.py,
//! tests/py/profile_oracle.py), and its errors on bad tables.
use std::path::Path;
use std::process::Command;

use super::util::run_py_file;

/// Runs `trainer metrics ARGS` in `dir`, returning (success, stderr).
fn metrics(dir: &Path, args: &[&str]) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .current_dir(dir)
        .arg("metrics")
        .args(args)
        .output()
        .expect("trainer runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ok(dir: &Path, args: &[&str]) {
    let (ok, err) = metrics(dir, args);
    assert!(ok, "trainer metrics {args:?} failed:\n{err}");
}

/// The error of a run that must fail, with the words it must name (an error, not a panic).
fn fails_naming(dir: &Path, args: &[&str], words: &[&str]) {
    let (ok, err) = metrics(dir, args);
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

/// `metrics aggregate` equals pycytominer's `aggregate` (median exactly, mean to 1e-12) on a
/// pandas table, a polars table split in row groups of 7 rows and a 150,000-row pandas table
/// in one row group (read in chunks): NaN features (as NaN and as
/// nulls, on some rows and on every row of a group), ties, null strata values (groups of
/// their own, sorted last), integer plates (sorted numerically), single-cell groups, a
/// one-row table and named features (an integer one); an empty table, a missing stratum, a
/// non-numeric feature and a kept column that varies within a well are errors naming them.
#[test]
fn aggregate_equals_pycytominer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_py_file("aggregate_oracle.py", &["gen", d.to_str().unwrap()]);
    for table in ["cells_pandas", "cells_polars", "cells_big", "one_row"] {
        for op in ["median", "mean"] {
            let (input, out) = (format!("{table}.parquet"), format!("{table}_{op}.parquet"));
            ok(
                d,
                &[
                    "aggregate",
                    "--profiles",
                    &input,
                    "--operation",
                    op,
                    "--out",
                    &out,
                ],
            );
        }
    }
    ok(
        d,
        &[
            "aggregate",
            "--profiles",
            "cells_pandas.parquet",
            "--features",
            "Cells_Count,Cells_F0",
            "--out",
            "named_median.parquet",
        ],
    );
    let report = run_py_file("aggregate_oracle.py", &["check", d.to_str().unwrap()]);
    assert!(report.contains("cells_polars_mean"), "{report}");
    let agg = |table: &str, extra: &[&str], words: &[&str]| {
        let mut args = vec!["aggregate", "--profiles", table, "--out", "x.parquet"];
        args.extend_from_slice(extra);
        fails_naming(d, &args, words);
    };
    agg(
        "empty.parquet",
        &[],
        &[
            "empty.parquet",
            "aggregate needs at least 1 row",
            "it is empty",
        ],
    );
    agg(
        "cells_pandas.parquet",
        &["--strata", "Metadata_Plate,Metadata_Nope"],
        &["cells_pandas.parquet", "Metadata_Nope"],
    );
    agg(
        "cells_pandas.parquet",
        &["--features", "Metadata_Site"],
        &["cells_pandas.parquet", "Metadata_Site", "not numeric"],
    );
    agg(
        "cells_pandas.parquet",
        &["--keep", "Metadata_Site"],
        &[
            "cells_pandas.parquet",
            "Metadata_Site",
            "not constant within the group",
        ],
    );
    assert!(!d.join("x.parquet").exists(), "a failed run left an output");
}

/// `metrics profile` reproduces the recipe run by hand with pycytominer and copairs
/// (tests/py/profile_oracle.py): the aggregated table exactly, the normalized, selected and
/// sphered tables to 1e-4, the same features kept, AP and mAP to 1e-4, p-values within their
/// Monte-Carlo error, and its summary, figures and page; a recipe with a misspelt key and a
/// screen without the negative controls it names are errors naming the file and the key.
#[test]
fn profile_equals_pycytominer_and_copairs_step_by_step() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_py_file("profile_oracle.py", &["gen", d.to_str().unwrap()]);
    ok(
        d,
        &[
            "profile",
            "--profiles",
            "cells.parquet",
            "--recipe",
            "recipe.yaml",
            "--out-dir",
            ".",
        ],
    );
    let report = run_py_file("profile_oracle.py", &["check", d.to_str().unwrap()]);
    assert!(report.contains("\"activity\""), "{report}");

    std::fs::write(d.join("typo.yaml"), "normalize:\n  metod: mad_robustize\n").unwrap();
    fails_naming(
        d,
        &[
            "profile",
            "--profiles",
            "cells.parquet",
            "--recipe",
            "typo.yaml",
            "--out-dir",
            "typo",
        ],
        &["typo.yaml", "metod"],
    );
    std::fs::write(
        d.join("nocontrols.yaml"),
        "negcon: Metadata_control_type == vehicle\n",
    )
    .unwrap();
    fails_naming(
        d,
        &[
            "profile",
            "--profiles",
            "cells.parquet",
            "--recipe",
            "nocontrols.yaml",
            "--out-dir",
            "nocontrols",
        ],
        &[
            "aggregated.parquet",
            "no control rows",
            "Metadata_control_type=vehicle",
        ],
    );
    // One plate: no replicate on another plate, so replicate retrieval has no positive pair.
    super::util::run_python(
        "import sys, pandas as pd; d = pd.read_parquet(sys.argv[1] + '/cells.parquet'); d[d.Metadata_Plate == 'P1'].to_parquet(sys.argv[1] + '/p1.parquet')",
        &[d.to_str().unwrap()],
    );
    fails_naming(
        d,
        &["profile", "--profiles", "p1.parquet", "--out-dir", "p1"],
        &["map.replicate", "no positive pairs", "enabled: false"],
    );
}
