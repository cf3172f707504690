//! `trainer` end to end: synth → config check → forward, and config errors as a user sees them.
use super::util::{bin, ok, run, synth, text};
use std::path::Path;

fn write_config(dir: &Path, data: &Path, extra: &str) -> String {
    let cfg = dir.join("cfg.yaml");
    std::fs::write(
        &cfg,
        format!(
            "run:\n  name: e2e\n  output_dir: {out}\ndata:\n  dataset_dir: {data}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: [\"024\"]\nmodel:\n  arch: vit_tiny\n  out_dim: 256\ntrain:\n  batch_size_per_gpu: 6\n  precision: fp32\naugment:\n  global_crop_size: 64\n  local_crop_size: 32\n  local_crops_number: 2\n{extra}",
            out = dir.join("out").display(),
            data = data.display()
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_string()
}

#[test]
fn synth_then_check_then_forward() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let said = synth(&data, 5, 3, 8);
    assert!(said.contains("wrote 24 training images"), "{said}");
    for class in ["B", "CD4T", "CD8T"] {
        let n = std::fs::read_dir(data.join("Training").join(class))
            .unwrap()
            .count();
        assert_eq!(n, 8, "{class}");
    }
    assert!(data.join("Test/Donor01/Control/B").is_dir());

    let cfg = write_config(dir.path(), &data.join("Training"), "");
    let checked = ok("trainer", &["config", "check", &cfg]);
    assert!(checked.contains("valid"), "{checked}");

    let out = ok("trainer", &["forward", "--config", &cfg, "--threads", "2"]);
    let report: serde_json::Value = serde_json::from_str(&out).expect("forward prints JSON");
    assert_eq!(report["dataset_images"], 24);
    // floor((1 - 0.8) · 24) = 4 held out, as scDINO.
    assert_eq!(report["held_out_images"], 4);
    assert_eq!(report["train_images"], 20);
    assert_eq!(report["channels"], serde_json::json!([0, 2, 4]));
    assert_eq!(report["batch_images"], 6);
    assert_eq!(
        report["crop_shapes"],
        serde_json::json!(["6x3x64x64", "6x3x64x64", "6x3x32x32", "6x3x32x32"])
    );
    assert_eq!(report["student_output_shape"], serde_json::json!([24, 256]));
    assert_eq!(report["teacher_output_shape"], serde_json::json!([12, 256]));
    assert_eq!(report["backbone_parameters"], 5_622_720 - 2 * 16 * 16 * 192);
}

#[test]
fn synth_is_deterministic_by_seed() {
    let dir = tempfile::tempdir().unwrap();
    let gen = |name: &str, seed: &str| {
        let out = dir.path().join(name);
        synth(&out, seed.parse().unwrap(), 2, 3);
        std::fs::read(out.join("Training/CD4T/CD4T-0002.tiff")).unwrap()
    };
    let (a, b, c) = (gen("a", "1"), gen("b", "1"), gen("c", "2"));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn config_errors_name_file_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), dir.path(), "  techer_temp: 0.07\n");
    let out = run("trainer", &["config", "check", &cfg]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("techer_temp") && err.contains("line 18") && err.contains("cfg.yaml"),
        "{err}"
    );

    let cfg = write_config(
        dir.path(),
        dir.path(),
        "downstream:\n  knn:\n    k: [5, 0]\n",
    );
    let out = run("trainer", &["config", "check", &cfg]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("downstream.knn.k[1]") && err.contains(":20"),
        "{err}"
    );

    // A user's error is its message chain whatever RUST_BACKTRACE says (set on many
    // developers' machines): no stack backtrace of the binary under it.
    for bin_name in ["trainer", "launcher"] {
        let args: &[&str] = if bin_name == "trainer" {
            &["config", "check", &cfg]
        } else {
            &[
                "render",
                "--cluster",
                "/no/such/cluster.yaml",
                "--out",
                "/no/such/out",
            ]
        };
        let out = std::process::Command::new(bin(bin_name))
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .env_remove("LD_LIBRARY_PATH")
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{bin_name}: {err}");
        assert!(err.starts_with("Error: "), "{bin_name}: {err}");
        assert!(
            !err.contains("backtrace") && !err.contains("Backtrace"),
            "{bin_name} printed a backtrace:\n{err}"
        );
    }
}

#[test]
fn config_show_prints_a_config_that_checks() {
    let dir = tempfile::tempdir().unwrap();
    // A cluster path that does not exist here: the dataset is reported as not checked.
    let cfg = write_config(dir.path(), Path::new("/fsx/not/here"), "");
    assert!(ok("trainer", &["config", "check", &cfg]).contains("not checked"));
    let shown = ok("trainer", &["config", "show", &cfg]);
    assert!(
        shown.contains("weight_decay_end: 0.4"),
        "defaults are written out:\n{shown}"
    );
    let again = dir.path().join("shown.yaml");
    std::fs::write(&again, &shown).unwrap();
    ok("trainer", &["config", "check", again.to_str().unwrap()]);
    assert_eq!(
        ok("trainer", &["config", "show", again.to_str().unwrap()]),
        shown
    );
}

/// The keys scDINO's files set that nothing reads are accepted, and loading a file that
/// writes one logs one warning naming the key and its line; a file that leaves them at their
/// defaults (or sets `train.num_gpus`, which `trainer launch` reads) gets none.
#[test]
fn ignored_scdino_keys_warn_only_when_written() {
    let dir = tempfile::tempdir().unwrap();
    let data = "data:\n  dataset_dir: /fsx/not/here\n";
    let quiet = super::util::write_yaml(
        dir.path(),
        "quiet",
        &format!("{data}train:\n  num_gpus: 1\n  epochs: 6\n"),
    );
    let out = run("trainer", &["config", "check", &quiet]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("ignored"),
        "{}",
        text(&out.stderr)
    );

    let noisy = super::util::write_yaml(
        dir.path(),
        "noisy",
        &format!(
            "{data}train:\n  num_gpus: 1\n  dist_url: tcp://10.0.0.1:23456\ndownstream:\n  features:\n    num_gpus: 4\n    num_workers: 2\n"
        ),
    );
    let out = run("trainer", &["config", "check", &noisy]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    for (key, line) in [
        ("train.dist_url", 5),
        ("downstream.features.num_gpus", 8),
        ("downstream.features.num_workers", 9),
    ] {
        let said: Vec<&str> = err
            .lines()
            .filter(|l| l.contains(&format!("`{key}`")))
            .collect();
        assert_eq!(said.len(), 1, "{key}: {err}");
        assert!(
            said[0].starts_with("warning: ")
                && said[0].contains(&format!("noisy.yaml:{line}:"))
                && said[0].contains("accepted for scDINO compatibility and ignored"),
            "{}",
            said[0]
        );
    }
    assert!(!err.contains("`train.num_gpus`"), "{err}");
}

/// `trainer config default`: every section and key with its default, as a file `config check`
/// accepts and `config show` reproduces (so nothing is left out or renamed).
#[test]
fn config_default_prints_every_key_as_a_config_that_checks() {
    let dir = tempfile::tempdir().unwrap();
    let defaults = ok("trainer", &["config", "default"]);
    for key in [
        "run:",
        "data:",
        "model:",
        "train:",
        "augment:",
        "downstream:",
        "dataset_dir:",
        "channel_combinations:",
        "out_dim: 65536",
        "channels: fixed",
        "weight_decay_end: 0.4",
        "precision:",
        "global_crops_scale:",
        "knn:",
        "umap:",
        "attention:",
        "object_store:",
        "cache:",
    ] {
        assert!(defaults.contains(key), "{key} missing:\n{defaults}");
    }
    let path = dir.path().join("defaults.yaml");
    std::fs::write(&path, &defaults).unwrap();
    let p = path.to_str().unwrap();
    assert!(ok("trainer", &["config", "check", p]).contains(": valid"));
    // Same content as the resolved form of the file itself (comment line aside).
    let shown = ok("trainer", &["config", "show", p]);
    assert_eq!(
        defaults.lines().skip(1).collect::<Vec<_>>(),
        shown.lines().collect::<Vec<_>>()
    );
}

#[test]
fn forward_refuses_images_with_other_channel_counts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    ok(
        "trainer",
        &[
            "synth",
            "--out",
            data.to_str().unwrap(),
            "--classes",
            "2",
            "--per-class",
            "5",
            "--channels",
            "3",
        ],
    );
    let cfg = write_config(dir.path(), &data.join("Training"), "");
    let out = run("trainer", &["forward", "--config", &cfg]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("has 3 channels but data.channel_names lists 5"),
        "{err}"
    );
    assert!(err.contains(".tiff"), "names the file: {err}");
}
