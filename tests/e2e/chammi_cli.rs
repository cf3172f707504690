//! CHAMMI's tiled crops (`data.screen.layout: chammi`) through the whole pipeline: a table
//! mixing 3-, 4- and 5-channel datasets, read as the channel they share, trains, embeds (a
//! bad row goes to the errors table naming its file and row), scores with `trainer metrics
//! chammi` and packs.
use super::util::{bin, ok, run, text};
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python")
}

fn run_python(args: &[&str]) {
    let out = Command::new(python()).args(args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Writes the CHAMMI-like set (`chammi_set.py`, 6 cells per dataset and split) into
/// `dir/chammi` and returns its table.
fn chammi_table(dir: &Path) -> PathBuf {
    let set = dir.join("chammi");
    std::fs::create_dir_all(&set).unwrap();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../trainer/tests/py/chammi_set.py");
    run_python(&[script.to_str().unwrap(), set.to_str().unwrap(), "6"]);
    set.join("enriched_meta.csv")
}

/// A run config `dir/{name}.yaml` over `table` reading `channels` (a YAML list) with
/// `combinations`; `screen` and `model` add keys to those sections.
fn config(
    dir: &Path,
    table: &Path,
    name: &str,
    (channels, combinations): (&str, &str),
    (screen, model): (&str, &str),
) -> PathBuf {
    let cfg = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &cfg,
        format!(
            "run:\n  name: {name}\n  output_dir: {out}\n\
             data:\n  dataset_dir: {table}\n  channel_names: {channels}\n  \
             channel_combinations: {combinations}\n  num_workers: 2\n  train_fraction: 0.7\n  \
             screen:\n    layout: chammi\n    label_column: Metadata_Label\n{screen}\
             model:\n  name: m\n  arch: vit_tiny\n  out_dim: 64\n{model}\
             augment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 1\n\
             train:\n  epochs: 1\n  warmup_epochs: 0\n  batch_size_per_gpu: 16\n  \
             precision: fp32\n  num_gpus: 1\n\
             downstream:\n  features:\n    resize_length: 32\n  attention:\n    image_size: 32\n  \
             knn:\n    k: [3]\n  umap:\n    n_neighbors: 5\n    epochs: 20\n",
            out = dir.join("out").display(),
            table = table.display(),
        ),
    )
    .unwrap();
    cfg
}

/// `trainer pipeline` on `cfg`; returns its log.
fn pipeline(cfg: &Path) -> String {
    let out = Command::new(bin("trainer"))
        .args([
            "pipeline",
            "--config",
            cfg.to_str().unwrap(),
            "--threads",
            "2",
        ])
        .env_remove("SCDINO_LOG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let log = text(&out.stderr);
    assert!(out.status.success(), "pipeline failed:\n{log}");
    log
}

/// `trainer embed --screen cfg` of `ckpt` into `out`, with `extra` arguments.
fn embed(cfg: &Path, ckpt: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "embed",
        "--screen",
        cfg.to_str().unwrap(),
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ok("trainer", &args);
}

#[test]
fn pipeline_embed_and_score_on_chammi_tiled_crops() {
    let dir = tempfile::tempdir().unwrap();
    let table = chammi_table(dir.path());
    let channels = ("[nucleus]", "[\"0\"]");
    let cfg = config(dir.path(), &table, "ch", channels, ("", ""));
    let log = pipeline(&cfg);
    // 6 cells per dataset and split: Allen 3 splits, HPA 4, CP 5.
    assert!(
        log.contains("72 cells (whole images) in 10 classes"),
        "{log}"
    );
    let analyses = dir.path().join("out/ch/m_channel_nucleus_analyses");
    assert!(analyses.join("report.html").exists());

    // A row naming a missing file: embed records it in its errors table and goes on.
    let mut text_table = std::fs::read_to_string(&table).unwrap();
    text_table.push_str("CP/Train/missing.tif,x,8,CP_c0,Train,False,False,False,False,,plate0,\n");
    std::fs::write(&table, text_table).unwrap();
    let ckpt = dir
        .path()
        .join("out/ch/scDINO_ViTs/m_channel_nucleus/checkpoint.safetensors");
    let profiles = dir.path().join("cells.parquet");
    embed(&cfg, &ckpt, &profiles, &[]);
    let check = r#"
import sys, pandas as pd
emb = pd.read_parquet(sys.argv[1]); err = pd.read_parquet(sys.argv[2])
assert len(emb) == 72, len(emb)
for c in ["Metadata_Dataset", "Metadata_Label", "Metadata_train_test_split", "Metadata_cell_type", "Metadata_Plate", "Metadata_file_path"]:
    assert c in emb.columns, (c, list(emb.columns))
assert "Metadata_ObjectNumber" not in emb.columns
assert sorted(emb.Metadata_Dataset.unique()) == ["Allen", "CP", "HPA"], emb.Metadata_Dataset.unique()
assert (emb.Metadata_file_path == emb.Metadata_ImagePath.str.split("enriched_meta.csv/").str[1]).all()
assert len(err) == 1, err
reason = err.reason[0]
assert "CP/Train/missing.tif" in reason and "enriched_meta.csv: row 73" in reason, reason
"#;
    let errors = dir.path().join("cells.errors.parquet");
    run_python(&[
        "-c",
        check,
        profiles.to_str().unwrap(),
        errors.to_str().unwrap(),
    ]);
    // CHAMMI's score straight from the embed table's columns.
    let json = dir.path().join("chammi.json");
    ok(
        "trainer",
        &[
            "metrics",
            "chammi",
            "--profiles",
            profiles.to_str().unwrap(),
            "--task",
            "Metadata_train_test_split",
            "--label",
            "Metadata_Label",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let score: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let f = score["final_score"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&f), "{score}");
    assert!(score["tasks"]["CP"]["task4"].is_number(), "{score}");

    pack_reads_the_same_cells(dir.path(), &cfg, &table);
}

/// `trainer data pack` fails on the bad row, naming it, and packs every cell without it.
fn pack_reads_the_same_cells(dir: &Path, cfg: &Path, table: &Path) {
    // Packing reads the same cells (the bad row fails the pack, naming it).
    let packed = dir.join("packed");
    let pack = [
        "data",
        "pack",
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        packed.to_str().unwrap(),
    ];
    let out = run("trainer", &pack);
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains("CP/Train/missing.tif"),
        "{err}"
    );
    let table_text = std::fs::read_to_string(table).unwrap();
    let good: Vec<&str> = table_text
        .lines()
        .filter(|l| !l.contains("missing"))
        .collect();
    std::fs::write(table, good.join("\n") + "\n").unwrap();
    let out = ok("trainer", &pack);
    assert!(out.contains("packed 72 images"), "{out}");
}

/// `data.screen.cell_channels: own`: one `tokens` model trained on the mixed table over the
/// union of its channels, each cell with its own; the pipeline's analyses of each dataset's
/// channel set run on the cells that hold it (here each set is one dataset's); `trainer
/// embed` of a pair embeds the cells holding both and records the others, naming the
/// channels they hold; packing is refused.
#[test]
fn tokens_trains_and_embeds_chammi_cells_with_their_own_channels() {
    let dir = tempfile::tempdir().unwrap();
    let table = chammi_table(dir.path());
    let channels = (
        "[nucleus, membrane, protein, microtubules, er, rna, golgi, mito]",
        "[\"012\", \"0234\", \"04567\"]",
    );
    let (screen, model) = ("    cell_channels: own\n", "  channels: tokens\n");
    let cfg = config(dir.path(), &table, "own", channels, (screen, model));
    let log = pipeline(&cfg);
    assert!(log.contains("each cell its own"), "{log}");
    // Each combination's left-out cells are said once, not once per analysis and checkpoint.
    for names in [
        "nucleus, membrane, protein",
        "nucleus, protein, microtubules, er",
        "nucleus, er, rna, golgi, mito",
    ] {
        let said = format!("lack a channel of [{names}]");
        assert_eq!(log.matches(&said).count(), 1, "{said}:\n{log}");
    }
    // 72 cells, 21 held out (floor(0.3 · 72)), each set's analyses on its dataset's.
    let mut held_out = 0;
    for (names, dataset) in [
        ("nucleus_membrane_protein", "Allen/"),
        ("nucleus_protein_microtubules_er", "HPA/"),
        ("nucleus_er_rna_golgi_mito", "CP/"),
    ] {
        let analyses = dir
            .path()
            .join(format!("out/own/m_tokens_channel_{names}_analyses"));
        assert!(analyses.join("report.html").exists(), "{names}");
        let paths = std::fs::read_to_string(analyses.join("image_paths.csv")).unwrap();
        let paths: Vec<&str> = paths.lines().collect();
        assert!(!paths.is_empty(), "{names}");
        assert!(
            paths
                .iter()
                .all(|p| p.contains(&format!("enriched_meta.csv/{dataset}"))),
            "{names}: {paths:?}"
        );
        held_out += paths.len();
    }
    assert_eq!(held_out, 21);
    stages_alone_run_for_every_combination(dir.path(), &cfg);
    let ckpt = dir.path().join(
        "out/own/scDINO_ViTs/m_tokens_channel_nucleus_membrane_protein_microtubules_er_rna_golgi_mito/checkpoint.safetensors",
    );
    let profiles = dir.path().join("pair.parquet");
    embed(&cfg, &ckpt, &profiles, &["--channels", "nucleus,protein"]);
    let check = r#"
import sys, pandas as pd
emb = pd.read_parquet(sys.argv[1]); err = pd.read_parquet(sys.argv[2])
assert sorted(emb.Metadata_Dataset.unique()) == ["Allen", "HPA"], emb.Metadata_Dataset.unique()
assert len(emb) == 18 + 24, len(emb)
assert len(err) == 30, len(err)
assert err.reason.str.contains(r"holds the channels \[nucleus, er, rna, golgi, mito\], not every one of \[nucleus, protein\]").all(), err.reason[0]
"#;
    run_python(&[
        "-c",
        check,
        profiles.to_str().unwrap(),
        dir.path().join("pair.errors.parquet").to_str().unwrap(),
    ]);
    let out = run(
        "trainer",
        &[
            "data",
            "pack",
            "--config",
            cfg.to_str().unwrap(),
            "--out",
            dir.path().join("packed").to_str().unwrap(),
        ],
    );
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cell_channels: own"),
        "{err}"
    );
}

/// A stage's subcommand without `--combination` works on every channel combination, as the
/// launcher's jobs run it (`trainer knn --config FILE`); `trainer report` (a stage without a
/// subcommand of its own) runs that stage alone through the pipeline's runner; an input that
/// belongs to one model needs `--combination`.
fn stages_alone_run_for_every_combination(dir: &Path, cfg: &Path) {
    let cfg = cfg.to_str().unwrap();
    let analyses: Vec<PathBuf> = [
        "nucleus_membrane_protein",
        "nucleus_protein_microtubules_er",
        "nucleus_er_rna_golgi_mito",
    ]
    .iter()
    .map(|names| dir.join(format!("out/own/m_tokens_channel_{names}_analyses")))
    .collect();
    let knn_files = |a: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(a.join("kNN"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with("_knn_metrics.json"))
            .collect()
    };
    for a in &analyses {
        let files = knn_files(a);
        assert!(!files.is_empty(), "{}", a.display());
        for f in files {
            std::fs::remove_file(f).unwrap();
        }
        std::fs::remove_file(a.join("report.html")).unwrap();
    }
    ok("trainer", &["knn", "--config", cfg, "--threads", "1"]);
    for a in &analyses {
        assert!(!knn_files(a).is_empty(), "{}", a.display());
        assert!(!a.join("report.html").exists());
    }
    let out = run("trainer", &["report", "--config", cfg, "--threads", "1"]);
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{log}");
    assert_eq!(
        log.matches("[pipeline] report: running").count(),
        3,
        "{log}"
    );
    assert!(!log.contains("knn epoch"), "{log}");
    for a in &analyses {
        assert!(a.join("report.html").is_file(), "{}", a.display());
    }
    let out = run(
        "trainer",
        &[
            "attention",
            "--config",
            cfg,
            "--checkpoint",
            "x.safetensors",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success()
            && err.contains("add --combination N")
            && err.contains("3 channel combinations"),
        "{err}"
    );
}
