//! `trainer pipeline` end to end on synthetic data: every stage's files, a report whose every
//! image opens, kNN well above chance, make-like reruns, and resuming after a stop signal.
use super::util::{bin, launch, logged_epochs, ok, signal_once_exists, synth, synth_screen, text};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const CLASSES: usize = 4;

fn setup(dir: &Path) -> String {
    let data = dir.join("data");
    synth(&data, 5, CLASSES, 60);
    let path = dir.join("pipe.yaml");
    std::fs::write(
        &path,
        format!(
            "run:\n  name: pipe\n  output_dir: {out}\n  seed: 40\n\
             data:\n  dataset_dir: {data}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  \
             channel_combinations: [\"02\"]\n  num_workers: 2\n  test_dir: {test}\n\
             model:\n  name: m\n  arch: vit_tiny\n  out_dim: 256\n\
             augment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 2\n\
             train:\n  epochs: 3\n  checkpoint_every: 2\n  batch_size_per_gpu: 16\n  \
             precision: fp32\n  num_gpus: 1\n  warmup_epochs: 1\n  lr: 0.005\n\
             downstream:\n  features:\n    resize_length: 32\n  \
             attention:\n    image_size: 48\n  knn:\n    k: [3, 5]\n  \
             umap:\n    n_neighbors: 10\n    epochs: 60\n",
            out = dir.join("out").display(),
            data = data.join("Training").display(),
            test = data.join("Test").display()
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

fn analyses(dir: &Path) -> PathBuf {
    dir.join("out/pipe/m_channel_APC_DAPI_analyses")
}

/// Runs the pipeline to completion; returns stderr (the per-stage log).
fn pipeline(cfg: &str) -> String {
    let out = Command::new(bin("trainer"))
        .args(["pipeline", "--config", cfg, "--threads", "2"])
        .env_remove("SCDINO_LOG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "pipeline failed:\n{err}");
    err
}

/// Every `<img src>` of the report, decoded and opened (Python's HTML parser + Pillow).
fn check_report(report: &Path) -> Vec<(String, u32, u32)> {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let script = r#"
import sys, base64, io, json
from html.parser import HTMLParser
from PIL import Image
class P(HTMLParser):
    def __init__(self):
        super().__init__(); self.imgs = []; self.ids = set()
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a: self.ids.add(a["id"])
        if tag == "img": self.imgs.append((a.get("alt", ""), a["src"]))
p = P(); p.feed(open(sys.argv[1], encoding="utf-8").read()); p.close()
out = []
for alt, src in p.imgs:
    assert src.startswith("data:image/png;base64,"), "external image: " + src[:80]
    im = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1], validate=True)))
    im.load()
    out.append([alt, im.size[0], im.size[1]])
print(json.dumps({"imgs": out, "ids": sorted(p.ids)}))
"#;
    let out = Command::new(py)
        .args(["-c", script, report.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let ids: Vec<&str> = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"knn") && ids.contains(&"per-class") && ids.contains(&"evaluation"),
        "{ids:?}"
    );
    v["imgs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i[0].as_str().unwrap().to_string(),
                i[1].as_u64().unwrap() as u32,
                i[2].as_u64().unwrap() as u32,
            )
        })
        .collect()
}

#[test]
fn pipeline_writes_every_stage_and_a_report_then_reruns_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path());
    let log = pipeline(&cfg);
    let a = analyses(dir.path());
    // Only the project's own lines at the default level: the UMAP crate's internal timings
    // (info events of a dependency) stay out unless SCDINO_LOG/RUST_LOG ask for them.
    assert!(log.contains("[pipeline] umap"), "{log}");
    assert!(
        !log.contains("set_operations") && !log.contains("fuzzy simplicial set"),
        "a dependency's events leaked into the default output:\n{log}"
    );
    // Checkpoints kept at epochs 0 and 2 (checkpoint_every 2, and the last).
    for tag in ["epoch0", "epoch2"] {
        for f in [
            format!("CLS_features/{tag}_features.csv"),
            format!("CLS_features/{tag}_features.safetensors"),
            format!("kNN/{tag}_knn_metrics.json"),
            format!("kNN/{tag}_confusion.png"),
            format!("embedding_plots/{tag}_umap.png"),
            format!("embedding_plots/pdf_format/{tag}_umap.pdf"),
            format!("embedding_plots/{tag}_umap.csv"),
            format!("embedding_plots/{tag}_umap.json"),
            format!("attention_images/{tag}/attention_images.json"),
            format!("evaluation/{tag}_evaluation.json"),
            format!("evaluation/{tag}_train_features.safetensors"),
            format!("evaluation/{tag}_queries_features.safetensors"),
            format!("CLS_features/{tag}_profiles.parquet"),
            format!("evaluation/{tag}_profiles.parquet"),
            format!("evaluation/{tag}_scores.json"),
        ] {
            assert!(a.join(&f).is_file(), "{f} missing; log:\n{log}");
        }
    }
    assert!(!a.join("CLS_features/epoch1_features.csv").exists());
    // The PDF copy is the PNG's figure as a vector page of 14×10 in, as scDINO's.
    let pdf = std::fs::read(a.join("embedding_plots/pdf_format/epoch2_umap.pdf")).unwrap();
    let head = String::from_utf8_lossy(&pdf);
    assert!(pdf.starts_with(b"%PDF-1.4"), "not a PDF");
    assert!(head.contains("/MediaBox [0 0 1008.00 720.00]"), "page size");
    // Read by pypdf (an independent parser): one page, no raster, the title and every class
    // name as text, and one circle (four Bézier segments) per embedded cell and legend entry.
    let cells = std::fs::read_to_string(a.join("embedding_plots/epoch2_umap.csv"))
        .unwrap()
        .lines()
        .count()
        - 1;
    let py = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let check = Command::new(py)
        .args([
            "-c",
            "import sys, json\nfrom pypdf import PdfReader\nr = PdfReader(sys.argv[1])\np = r.pages[0]\nops = p.get_contents().get_data().decode('latin-1')\ntext = p.extract_text()\nprint(json.dumps({'pages': len(r.pages), 'box': [float(v) for v in p.mediabox], 'images': len(p.images), 'curves': ops.count(' c '), 'title': 'CLS Token embedding of' in text, 'classes': all(c in text for c in ['B', 'CD4T', 'CD8T', 'DC'])}))",
        ])
        .arg(a.join("embedding_plots/pdf_format/epoch2_umap.pdf"))
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check.stderr));
    let got: serde_json::Value = serde_json::from_str(text(&check.stdout).trim()).unwrap();
    assert_eq!(
        got,
        serde_json::json!({"pages": 1, "box": [0.0, 0.0, 1008.0, 720.0], "images": 0,
            "curves": 4 * (cells + CLASSES), "title": true, "classes": true})
    );
    // scDINO's global_kNN.txt: one block per checkpoint, in epoch order.
    let txt = std::fs::read_to_string(a.join("kNN/global_kNN.txt")).unwrap();
    let e0 = txt.find("_epoch0\n").expect("epoch0 block");
    let e2 = txt.find("_epoch2\n").expect("epoch2 block");
    assert!(e0 < e2 && txt.matches("3-NN Top1").count() == 2, "{txt}");
    // kNN well above chance (1/4) after training.
    let knn: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(a.join("kNN/epoch2_knn_metrics.json")).unwrap(),
    )
    .unwrap();
    let top1 = knn["results"][1]["top1_percent"].as_f64().unwrap();
    assert_eq!(knn["results"][1]["k"], 5);
    assert!(top1 >= 60.0, "5-NN top-1 {top1} % (chance 25 %)");
    // Attention: one image per class, at the features' size (32) and the attention size (48),
    // 2 channel PNGs + 3 heads (vit_tiny) each.
    let att: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(a.join("attention_images/epoch2/attention_images.json")).unwrap(),
    )
    .unwrap();
    let att = att.as_array().unwrap();
    assert_eq!(att.len(), CLASSES * 2);
    for img in att {
        assert_eq!(img["channel_pngs"].as_array().unwrap().len(), 2);
        assert_eq!(img["head_pngs"].as_array().unwrap().len(), 3);
    }
    // The evaluation: every training image as kNN bank and probe training set, the test
    // folder as queries, well above chance, and the checkpoint it came from.
    let eval: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(a.join("evaluation/epoch2_evaluation.json")).unwrap(),
    )
    .unwrap();
    assert!(
        eval["queries_from"]
            .as_str()
            .unwrap()
            .starts_with("test folder "),
        "{eval}"
    );
    assert_eq!(eval["n_train"], CLASSES * 60);
    assert!(
        eval["n_queries"].as_u64().unwrap() >= CLASSES as u64,
        "{eval}"
    );
    let probe = eval["linear_probe"]["scores"]["top1_percent"]
        .as_f64()
        .unwrap();
    let knn5 = eval["knn"][1]["scores"]["top1_percent"].as_f64().unwrap();
    assert!(
        probe >= 60.0 && knn5 >= 60.0,
        "probe {probe} %, 5-NN {knn5} % (chance 25 %)"
    );
    let prov = &eval["provenance"];
    assert!(
        prov["checkpoint"]
            .as_str()
            .unwrap()
            .ends_with("checkpoint0002.safetensors"),
        "{prov}"
    );
    assert_eq!(prov["epoch"], 3);
    assert_eq!(prov["checkpoint_sha256"].as_str().unwrap().len(), 64);
    assert!(knn["checkpoint"]
        .as_str()
        .unwrap()
        .ends_with("checkpoint0002.safetensors"));
    assert_eq!(knn["checkpoint_epoch"], 3);
    let umap: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(a.join("embedding_plots/epoch2_umap.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(umap["n_neighbors"], 10);
    assert_eq!(umap["epochs"], 60);
    assert!(umap["trustworthiness"].as_f64().unwrap() > 0.7, "{umap}");

    // The report: every image embedded and decodable.
    let report = a.join("report.html");
    let imgs = check_report(&report);
    let n_att = CLASSES * 2 * (2 + 3);
    assert_eq!(imgs.len(), 3 + 1 + 1 + n_att, "{imgs:?}");
    assert!(imgs
        .iter()
        .any(|(alt, w, h)| alt == "UMAP epoch2" && *w == 1400 && *h == 1000));
    assert!(imgs
        .iter()
        .any(|(alt, w, h)| alt == "attn-head0" && *w == 48 && *h == 48));
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("<td>epoch0</td>") && html.contains("<td>epoch2</td>"));
    // One "what to look at" line per section: dataset, training, kNN, evaluation, profiling
    // scores, UMAP, attention.
    assert_eq!(html.matches("What to look at:").count(), 7, "{html}");
    // The profiling scores of each checkpoint: replicate-retrieval mAP on the evaluation
    // table and, with the test folder's two donors, the batch scores with their control.
    let scores: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(a.join("evaluation/epoch2_scores.json")).unwrap(),
    )
    .unwrap();
    let map = scores["map"]["mean_map"].as_f64().unwrap();
    assert!(map > 0.0 && map <= 1.0, "{scores}");
    let sil = scores["batch"]["silhouette_batch"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&sil), "{scores}");
    assert!(
        scores["batch"]["silhouette_batch_shuffled"].is_f64(),
        "{scores}"
    );
    assert!(html.contains("id=\"scores\""), "{html}");
    assert!(
        html.contains("ln(out_dim) = 5.55"),
        "uniform-collapse level of out_dim 256"
    );

    // Everything is up to date: a rerun runs nothing and leaves the report alone.
    let before = std::fs::metadata(&report).unwrap().modified().unwrap();
    let log = pipeline(&cfg);
    assert!(!log.contains(": running"), "{log}");
    assert_eq!(
        std::fs::metadata(&report).unwrap().modified().unwrap(),
        before
    );

    // A lost output is redone, and only what depends on it.
    std::fs::remove_file(a.join("embedding_plots/epoch2_umap.json")).unwrap();
    let log = pipeline(&cfg);
    let ran: Vec<&str> = log.lines().filter(|l| l.ends_with(": running")).collect();
    assert_eq!(
        ran,
        [
            "[pipeline] umap epoch2: running",
            "[pipeline] report: running"
        ],
        "{log}"
    );

    // The profile tables stand in for the features: kNN on the features stage's table and the
    // evaluation on the evaluate stage's (train rows against test rows) give the scores the
    // stages gave.
    let json = |f: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(a.join(f)).unwrap()).unwrap()
    };
    let knn_stage = json("kNN/epoch2_knn_metrics.json");
    let eval_stage = json("evaluation/epoch2_evaluation.json");
    let table = a.join("CLS_features/epoch2_profiles.parquet");
    ok(
        "trainer",
        &[
            "knn",
            "--config",
            &cfg,
            "--profiles",
            table.to_str().unwrap(),
        ],
    );
    let knn_table = json("kNN/epoch2_knn_metrics.json");
    assert_eq!(knn_table["results"], knn_stage["results"]);
    let umap_stage = json("embedding_plots/epoch2_umap.json");
    ok(
        "trainer",
        &[
            "umap",
            "--config",
            &cfg,
            "--profiles",
            table.to_str().unwrap(),
        ],
    );
    assert_eq!(json("embedding_plots/epoch2_umap.json"), umap_stage);
    let table = a.join("evaluation/epoch2_profiles.parquet");
    ok(
        "trainer",
        &[
            "evaluate",
            "--config",
            &cfg,
            "--profiles",
            table.to_str().unwrap(),
        ],
    );
    let eval_table = json("evaluation/epoch2_evaluation.json");
    assert_eq!(eval_table["knn"], eval_stage["knn"]);
    assert_eq!(
        eval_table["linear_probe"]["scores"],
        eval_stage["linear_probe"]["scores"]
    );
    assert_eq!(
        (&eval_table["n_train"], &eval_table["n_queries"]),
        (&eval_stage["n_train"], &eval_stage["n_queries"])
    );
    assert_eq!(eval_table["provenance"], eval_stage["provenance"]);
}

#[test]
fn pipeline_stopped_by_signal_resumes_and_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path());
    let model = dir.path().join("out/pipe/scDINO_ViTs/m_channel_APC_DAPI");
    let child = Command::new(bin("trainer"))
        .args(["pipeline", "--config", &cfg, "--threads", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Stop once the first epoch's checkpoint exists (training or analyses are under way).
    let out = signal_once_exists(
        child,
        &model.join("checkpoint0000.safetensors"),
        "-USR1",
        Duration::from_secs(300),
    );
    assert_eq!(
        out.status.code(),
        Some(75),
        "stderr:\n{}",
        text(&out.stderr)
    );
    assert!(!analyses(dir.path()).join("report.html").exists());
    let log = pipeline(&cfg);
    assert!(analyses(dir.path()).join("report.html").is_file(), "{log}");
    // Training resumed rather than restarted: one log line per epoch.
    let epochs = logged_epochs(&model.join("log.txt"));
    assert_eq!(epochs, [0, 1, 2]);
}

/// `trainer launch --nproc 2 -- pipeline`: training and features run data-parallel on both
/// ranks, every other stage once on rank 0, and a rerun finds everything up to date on both.
#[test]
fn pipeline_on_two_ranks_runs_collective_stages_on_both_and_the_rest_once() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path());
    let launch = || {
        let out = Command::new(bin("trainer"))
            .args(launch(
                "2",
                "29721",
                &[],
                &["pipeline", "--config", &cfg, "--threads", "1"],
            ))
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert!(out.status.success(), "pipeline on 2 ranks failed:\n{err}");
        (text(&out.stdout), err)
    };
    let (stdout, log) = launch();
    // Data-parallel training: both ranks end with the same parameters.
    let sums: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_once("student parameter checksum ").map(|(_, c)| c))
        .collect();
    assert_eq!(sums.len(), 2, "{log}");
    assert_eq!(sums[0], sums[1], "{log}");
    // Rank 1 took part in training and the features of both checkpoints, nothing else.
    assert!(
        log.contains("rank 1: pipeline finished (3 collective stages ran)"),
        "{log}"
    );
    for stage in [
        "features epoch0",
        "knn epoch0",
        "umap epoch0",
        "attention epoch0",
        "features epoch2",
        "knn epoch2",
        "umap epoch2",
        "attention epoch2",
        "report",
    ] {
        let line = format!("[pipeline] {stage}: running");
        assert_eq!(log.matches(&line).count(), 1, "{line}:\n{log}");
    }
    let a = analyses(dir.path());
    assert_eq!(stdout.trim(), a.join("report.html").display().to_string());
    let csv = std::fs::read_to_string(a.join("CLS_features/epoch2_features.csv")).unwrap();
    let knn: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(a.join("kNN/epoch2_knn_metrics.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(knn["n_samples"], csv.lines().count());
    assert!(a.join("embedding_plots/epoch2_umap.png").is_file());
    assert_eq!(
        check_report(&a.join("report.html")).len(),
        3 + 1 + 1 + CLASSES * 2 * 5
    );

    let (_, log) = launch();
    assert!(!log.contains(": running"), "{log}");
    assert!(
        log.contains("rank 1: pipeline finished (0 collective stages ran)"),
        "{log}"
    );

    // The features the two ranks gathered are one process's: same rows, same order, same
    // digits.
    for f in ["epoch2_features.csv", "epoch2_features.safetensors"] {
        std::fs::remove_file(a.join("CLS_features").join(f)).unwrap();
    }
    let out = Command::new(bin("trainer"))
        .args(["features", "--config", &cfg, "--threads", "1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(a.join("CLS_features/epoch2_features.csv")).unwrap(),
        csv
    );
}

/// A screen as CellProfiler stores it (fields of view per channel, a LoadData table, an
/// object table), written by `trainer synth --layout fov`, goes through the whole pipeline
/// without a conversion script: mean/std, training and every analysis read its cells, the
/// held-out cells are whole wells, training in `data.order: sites` decodes each site once,
/// and `trainer data pack` packs the same cells.
#[test]
fn pipeline_runs_on_a_screen_stored_as_fields_of_view() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("screen");
    synth_screen(&data);
    let cfg = dir.path().join("screen.yaml");
    std::fs::write(
        &cfg,
        format!(
            "run:\n  name: scr\n  output_dir: {out}\n\
             data:\n  dataset_dir: {table}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  \
             channel_combinations: [\"02\"]\n  num_workers: 2\n  train_fraction: 0.7\n  \
             order: sites\n  \
             screen:\n    objects: {objects}\n    box_size: 50\n    \
             label_column: Metadata_Treatment\n    split_by: Metadata_Well\n    \
             site_cache: 40\n\
             model:\n  name: m\n  arch: vit_tiny\n  out_dim: 64\n\
             augment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 1\n\
             train:\n  epochs: 1\n  warmup_epochs: 0\n  batch_size_per_gpu: 16\n  \
             precision: fp32\n  num_gpus: 1\n\
             downstream:\n  features:\n    resize_length: 32\n  attention:\n    image_size: 32\n  \
             knn:\n    k: [3]\n  umap:\n    n_neighbors: 5\n    epochs: 20\n\
             {PROFILING}",
            out = dir.path().join("out").display(),
            table = data.join("load_data.csv").display(),
            objects = data.join("Nuclei.csv").display(),
        ),
    )
    .unwrap();
    let log = pipeline(cfg.to_str().unwrap());
    assert!(
        log.contains("72 cells (50×50 px boxes) in 3 classes"),
        "{log}"
    );

    let analyses = dir.path().join("out/scr/m_channel_APC_DAPI_analyses");
    assert!(analyses.join("report.html").exists());
    // The held-out cells (the features stage's rows) are whole wells: no well of theirs
    // has a cell among the training ones.
    let paths = std::fs::read_to_string(analyses.join("image_paths.csv")).unwrap();
    // `{table}/{plate}/{well}/{site}/{object}` → `{plate}/{well}`.
    let well = |p: &str| {
        let parts: Vec<&str> = p.rsplit('/').collect();
        format!("{}/{}", parts[3], parts[2])
    };
    let held: std::collections::BTreeSet<String> = paths.lines().map(well).collect();
    assert!(
        !held.is_empty() && held.len() < 6,
        "held-out wells {held:?}"
    );
    let sizes: Vec<usize> = held
        .iter()
        .map(|w| {
            paths
                .lines()
                .filter(|l| l.contains(&format!("/{w}/")))
                .count()
        })
        .collect();
    assert!(
        sizes.iter().all(|&n| n == 12),
        "every held-out well whole: {held:?} {sizes:?}"
    );
    // `data.order: sites` decoded each training site once in the epoch (a well is 3 sites).
    let training_sites = 18 - 3 * held.len();
    assert!(
        log.contains(&format!(
            "epoch 0: {training_sites} site reads for 18 sites"
        )),
        "{log}"
    );
    // `trainer embed --screen` embeds every cell, each row with its plate/well/site/object
    // metadata, and the held-out cells' rows equal the features stage's (read by pandas).
    let ckpt = dir
        .path()
        .join("out/scr/scDINO_ViTs/m_channel_APC_DAPI/checkpoint.safetensors");
    let table = dir.path().join("cells.parquet");
    let out = Command::new(bin("trainer"))
        .args([
            "embed",
            "--screen",
            cfg.to_str().unwrap(),
            "--checkpoint",
            ckpt.to_str().unwrap(),
        ])
        .args(["--out", table.to_str().unwrap(), "--part-size", "20"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let script = r#"
import sys, glob, numpy as np, pandas as pd
emb = pd.read_parquet(sys.argv[1]); feats = pd.read_parquet(glob.glob(sys.argv[2] + "/CLS_features/epoch*_profiles.parquet")[0])
assert len(emb) == 72, len(emb)
for c in ["Metadata_Plate", "Metadata_Well", "Metadata_Site", "Metadata_Treatment", "Metadata_ObjectNumber", "Metadata_Center_X"]:
    assert c in emb.columns, (c, list(emb.columns))
fe = [c for c in emb.columns if not c.startswith("Metadata_")]
ff = [c for c in feats.columns if not c.startswith("Metadata_")]
assert len(fe) == len(ff), (len(fe), len(ff))
path = [c for c in feats.columns if "Path" in c][0]
e = emb.set_index("Metadata_ImagePath").loc[feats[path]]
d = np.abs(e[fe].to_numpy() - feats[ff].to_numpy()).max()
assert d < 1e-5, d
print(len(feats), d)
"#;
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let out = Command::new(py)
        .args([
            "-c",
            script,
            table.to_str().unwrap(),
            analyses.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Packing reads the same cells.
    let packed = dir.path().join("packed");
    let out = Command::new(bin("trainer"))
        .args([
            "data",
            "pack",
            "--config",
            cfg.to_str().unwrap(),
            "--out",
            packed.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("packed 72 images"),
        "{}",
        text(&out.stdout)
    );
    check_profiling(dir.path(), &cfg, &analyses);
}

/// The synthetic screen's profiling recipe: one well per class and plate, the class is the
/// perturbation and class B the negative control; normalised over the screen (one control
/// well per plate has no spread of its own).
const RECIPE: &str = "perturbation: Metadata_Treatment\n\
                      negcon: Metadata_Treatment == B\n\
                      normalize: {by: []}\n\
                      map: {null_size: 1000}\n";

/// `downstream.profiling` with [`RECIPE`] inline, as the screen test's config writes it.
const PROFILING: &str = "  profiling:\n    enabled: true\n    recipe:\n      \
                         perturbation: Metadata_Treatment\n      \
                         negcon: Metadata_Treatment == B\n      \
                         normalize: {by: []}\n      map: {null_size: 1000}\n";

/// The profiling stage of the screen pipeline: its summary is what `trainer embed --screen`
/// and `trainer metrics profile` give when run by hand on the same checkpoint with the same
/// recipe, the report shows it with its figures, a rerun skips it, and a changed recipe
/// reruns it without embedding again.
fn check_profiling(dir: &Path, cfg: &Path, analyses: &Path) {
    let stage = analyses.join("profiling/epoch0");
    let summary = read_json(&stage.join("profile/summary.json"));
    for f in [
        "cells.parquet",
        "profiling.json",
        "profile/index.html",
        "profile/aggregated.parquet",
        "profile/replicate_map.parquet",
        "profile/activity_map_vs_p.png",
        "profile/map_per_plate.png",
    ] {
        assert!(stage.join(f).exists(), "{f}");
    }
    assert_eq!(summary["cells_rows"], 72, "{summary}");
    let ckpt = dir.join("out/scr/scDINO_ViTs/m_channel_APC_DAPI/checkpoint0000.safetensors");
    let (cells, recipe, by_hand) = (
        dir.join("hand.parquet"),
        dir.join("recipe.yaml"),
        dir.join("hand"),
    );
    std::fs::write(&recipe, RECIPE).unwrap();
    let (c, k, t, r, o) = (
        cfg.to_str().unwrap(),
        ckpt.to_str().unwrap(),
        cells.to_str().unwrap(),
        recipe.to_str().unwrap(),
        by_hand.to_str().unwrap(),
    );
    ok(
        "trainer",
        &["embed", "--screen", c, "--checkpoint", k, "--out", t],
    );
    ok(
        "trainer",
        &[
            "metrics",
            "profile",
            "--profiles",
            t,
            "--recipe",
            r,
            "--out-dir",
            o,
        ],
    );
    let hand = read_json(&by_hand.join("summary.json"));
    for key in ["steps", "replicate", "activity", "recipe"] {
        assert_eq!(summary[key], hand[key], "{key}: pipeline vs by hand");
    }
    let replicate = summary["replicate"]["map"]["mean_map"].as_f64().unwrap();
    assert!(replicate > 0.0 && replicate <= 1.0, "{summary}");
    let report = analyses.join("report.html");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(
        html.contains("<h2>Profiling a screen"),
        "no profiling section"
    );
    assert!(
        html.contains(&format!("<td>{:.3}</td>", replicate)),
        "the report shows replicate mAP {replicate}"
    );
    let imgs = check_report(&report);
    for figure in [
        "replicate_map_vs_p.png",
        "activity_map_vs_p.png",
        "map_per_plate.png",
    ] {
        let alt = format!("epoch0 {figure}");
        assert!(imgs.iter().any(|(a, _, _)| *a == alt), "{alt}: {imgs:?}");
    }
    let record = stage.join("profiling.json");
    let written = std::fs::metadata(&record).unwrap().modified().unwrap();
    let log = pipeline(c);
    assert!(
        log.contains("profiling epoch0: up to date, skipped"),
        "{log}"
    );
    assert_eq!(
        std::fs::metadata(&record).unwrap().modified().unwrap(),
        written
    );
    let yaml = std::fs::read_to_string(cfg).unwrap();
    // A typo in the inline recipe is refused by `config check`, before any run.
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        yaml.replace("      perturbation:", "      perturbaton:"),
    )
    .unwrap();
    let out = super::util::run("trainer", &["config", "check", bad.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("downstream.profiling.recipe")
            && err.contains("perturbaton"),
        "{err}"
    );
    std::fs::write(cfg, yaml.replace("null_size: 1000", "null_size: 500")).unwrap();
    let log = pipeline(c);
    assert!(log.contains("profiling epoch0: running"), "{log}");
    assert!(!log.contains("embedding again"), "{log}");
    let rerun = read_json(&stage.join("profile/summary.json"));
    assert_eq!(rerun["recipe"]["map"]["null_size"], 500);
    assert_eq!(
        rerun["replicate"]["map"]["mean_map"],
        summary["replicate"]["map"]["mean_map"]
    );
    same_answer_on_two_ranks(&stage, c, &rerun);
}

/// The profiling stage on two ranks (the embedding collective, the recipe on rank 0) gives
/// the one-rank `summary`.
fn same_answer_on_two_ranks(stage: &Path, c: &str, summary: &serde_json::Value) {
    std::fs::remove_dir_all(stage).unwrap();
    let out = Command::new(bin("trainer"))
        .args(launch(
            "2",
            "29723",
            &[],
            &["pipeline", "--config", c, "--threads", "1"],
        ))
        .output()
        .unwrap();
    let log = text(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("rank 1: pipeline finished (1 collective stages ran)"),
        "{log}"
    );
    let two = read_json(&stage.join("profile/summary.json"));
    for key in ["steps", "replicate", "activity"] {
        assert_eq!(two[key], summary[key], "{key}: 2 ranks vs 1");
    }
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}
