//! `trainer train` end to end: exact resume, preemption by signal, refused resumes, NaN stop,
//! and a loss that falls.
use super::util::{
    bin, logged_epochs, model_dir, ok, run, synth, tensor_digests, text, write_yaml,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A synthetic dataset of `per_class` images for each of `classes` classes.
fn dataset(dir: &Path, classes: usize, per_class: usize) -> PathBuf {
    let data = dir.join("data");
    synth(&data, 11, classes, per_class);
    data.join("Training")
}

/// A CPU-sized config; `extra` is appended under `train:`.
fn config(dir: &Path, data: &Path, name: &str, train_extra: &str) -> String {
    write_yaml(
        dir,
        name,
        &format!(
            "run:\n  name: {name}\n  output_dir: {out}\n  seed: 3\ndata:\n  dataset_dir: {data}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: [\"02\"]\n  num_workers: 2\nmodel:\n  name: m\n  arch: vit_tiny\n  out_dim: 128\naugment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 2\ntrain:\n  precision: fp32\n  num_gpus: 1\n  log_every: 1\n{train_extra}",
            out = dir.join("out").display(),
            data = data.display()
        ),
    )
}

fn log_lines(dir: &Path, name: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(model_dir(dir, name).join("log.txt"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn resume_is_bitwise_exact_mid_epoch_and_at_epoch_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 2, 8); // 16 images: 13 train → 4 batches of 4 per epoch
    let extra = "  epochs: 2\n  batch_size_per_gpu: 4\n  warmup_epochs: 1\n  lr: 0.05\n";
    let straight = config(dir.path(), &data, "straight", extra);
    ok(
        "trainer",
        &["train", "--config", &straight, "--threads", "1"],
    );
    let reference =
        tensor_digests(&model_dir(dir.path(), "straight").join("checkpoint.safetensors"));
    assert!(reference.len() > 100 && reference.contains_key("dino_loss.center"));
    assert!(model_dir(dir.path(), "straight")
        .join("checkpoint0000.safetensors")
        .exists());
    assert!(model_dir(dir.path(), "straight")
        .join("checkpoint0001.safetensors")
        .exists());

    for (name, stop_at) in [("mid", 2), ("boundary", 4), ("late", 7)] {
        let cfg = config(dir.path(), &data, name, extra);
        let out = ok(
            "trainer",
            &[
                "train",
                "--config",
                &cfg,
                "--threads",
                "1",
                "--max-steps",
                &stop_at.to_string(),
            ],
        );
        let _ = out;
        let resumed = run("trainer", &["train", "--config", &cfg, "--threads", "1"]);
        assert!(resumed.status.success(), "{}", text(&resumed.stderr));
        assert!(
            text(&resumed.stderr).contains("resuming from"),
            "{}",
            text(&resumed.stderr)
        );
        let got = tensor_digests(&model_dir(dir.path(), name).join("checkpoint.safetensors"));
        let differing: Vec<&String> = reference
            .keys()
            .filter(|k| reference.get(*k) != got.get(*k))
            .collect();
        assert!(
            differing.is_empty(),
            "stop at {stop_at}: {} tensors differ, e.g. {:?}",
            differing.len(),
            &differing[..differing.len().min(3)]
        );
        assert_eq!(
            log_lines(dir.path(), name),
            log_lines(dir.path(), "straight"),
            "log.txt after stop at {stop_at}"
        );
    }
}

/// `train.cuda_graphs: true` on the CPU: the run trains exactly as without it (same
/// checkpoint tensors, same log) and says once, as a warning, why it does not capture.
#[test]
fn cuda_graphs_on_the_cpu_trains_as_without_and_says_why_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 2, 8);
    let extra = "  epochs: 1\n  batch_size_per_gpu: 4\n  warmup_epochs: 1\n  lr: 0.05\n";
    let mut stderr = Vec::new();
    for (name, on) in [("eager", false), ("graphs", true)] {
        let cfg = config(
            dir.path(),
            &data,
            name,
            &format!("{extra}  cuda_graphs: {on}\n"),
        );
        let out = run("trainer", &["train", "--config", &cfg, "--threads", "1"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        stderr.push(text(&out.stderr));
    }
    let digests =
        |name| tensor_digests(&model_dir(dir.path(), name).join("checkpoint.safetensors"));
    assert!(digests("eager").len() > 100);
    assert_eq!(digests("eager"), digests("graphs"));
    assert_eq!(
        log_lines(dir.path(), "eager"),
        log_lines(dir.path(), "graphs")
    );
    let said = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.contains("without CUDA graphs"))
            .map(str::to_string)
            .collect()
    };
    assert!(said(&stderr[0]).is_empty(), "{}", stderr[0]);
    let lines = said(&stderr[1]);
    assert_eq!(lines.len(), 1, "{}", stderr[1]);
    assert!(
        lines[0].starts_with("warning: train.cuda_graphs") && lines[0].contains("CPU"),
        "{}",
        lines[0]
    );
}

#[test]
fn sigusr1_checkpoints_and_exits_75_then_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 2, 12);
    let cfg = config(
        dir.path(),
        &data,
        "sig",
        "  epochs: 50\n  batch_size_per_gpu: 2\n  warmup_epochs: 1\n",
    );
    let mut child = Command::new(bin("trainer"))
        .args(["train", "--config", &cfg, "--threads", "1"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first progress line, then ask for a checkpoint as Slurm's --signal would.
    use std::io::{BufRead, BufReader};
    let mut reader = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap() > 0 && !line.contains("Epoch: [0/50]  [2/") {
        line.clear();
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-USR1", &pid])
        .status()
        .unwrap()
        .success());
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut reader, &mut rest);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(75), "{rest}");
    assert!(rest.contains("checkpoint written"), "{rest}");
    let ck = model_dir(dir.path(), "sig").join("checkpoint.safetensors");
    assert!(ck.exists());
    // Finish quickly: fewer epochs is a harmless change and is accepted on resume.
    let cfg = config(
        dir.path(),
        &data,
        "sig",
        "  epochs: 2\n  batch_size_per_gpu: 2\n  warmup_epochs: 1\n",
    );
    let out = run("trainer", &["train", "--config", &cfg, "--threads", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("resuming from"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(log_lines(dir.path(), "sig").len(), 2);
}

#[test]
fn resume_with_another_model_shape_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 2, 4);
    let cfg = config(
        dir.path(),
        &data,
        "shape",
        "  epochs: 1\n  batch_size_per_gpu: 4\n  warmup_epochs: 0\n",
    );
    ok("trainer", &["train", "--config", &cfg, "--threads", "1"]);
    let text_cfg = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("out_dim: 128", "out_dim: 64")
        .replace("epochs: 1", "epochs: 2");
    std::fs::write(&cfg, text_cfg).unwrap();
    let out = run("trainer", &["train", "--config", &cfg, "--threads", "1"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot resume")
            && err.contains("\"out_dim\":128")
            && err.contains("\"out_dim\":64"),
        "{err}"
    );
}

#[test]
fn device_cuda_without_a_gpu_fails_before_training_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 2, 3);
    let cfg = config(
        dir.path(),
        &data,
        "cuda",
        "  epochs: 1\n  batch_size_per_gpu: 4\n  warmup_epochs: 0\n  device: cuda\n",
    );
    let out = run("trainer", &["train", "--config", &cfg, "--threads", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    // This CI machine has no GPU; the message names whichever of the two is missing.
    assert!(
        err.contains("train.device is cuda")
            && (err.contains("--features nccl") || err.contains("sees no GPU")),
        "{err}"
    );
    assert!(
        !model_dir(dir.path(), "cuda")
            .join("checkpoint.safetensors")
            .exists(),
        "nothing trained"
    );
    // The CUDA build (scripts/test.sh makes it) knows it could use a GPU and says none is here.
    let out = run(
        "trainer-nccl",
        &["train", "--config", &cfg, "--threads", "1"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("libtorch sees no GPU"), "{err}");
}

#[test]
fn non_finite_loss_stops_with_a_clear_error_and_keeps_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 2, 3); // 6 images, 5 train: one batch per epoch
                                          // Epoch 0 runs at lr 0 (warm-up start), epoch 1 at an absurd lr that wrecks the weights,
                                          // so epoch 2's loss is not finite.
    let cfg = config(
        dir.path(),
        &data,
        "nan",
        "  epochs: 3\n  batch_size_per_gpu: 8\n  warmup_epochs: 1\n  lr: 1.0e+30\n  clip_grad: 0\n",
    );
    let out = run("trainer", &["train", "--config", &cfg, "--threads", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("loss is NaN") || err.contains("loss is inf"),
        "{err}"
    );
    assert!(err.contains("epoch 2"), "{err}");
    let ck = model_dir(dir.path(), "nan").join("checkpoint.safetensors");
    assert!(ck.exists(), "the last good checkpoint is kept");
    // It is the state after the last finite step (iteration 2, the end of epoch 1), tensor for
    // tensor: the same run stopped there by --max-steps writes the same file contents.
    let stopped = config(
        dir.path(),
        &data,
        "nan_stopped",
        "  epochs: 3\n  batch_size_per_gpu: 8\n  warmup_epochs: 1\n  lr: 1.0e+30\n  clip_grad: 0\n",
    );
    ok(
        "trainer",
        &[
            "train",
            "--config",
            &stopped,
            "--threads",
            "1",
            "--max-steps",
            "2",
        ],
    );
    let kept = tensor_digests(&ck);
    assert!(kept.len() > 100, "{} tensors", kept.len());
    assert_eq!(
        kept,
        tensor_digests(&model_dir(dir.path(), "nan_stopped").join("checkpoint.safetensors")),
        "the kept checkpoint is not the state after the last finite step"
    );
    assert_eq!(
        logged_epochs(&model_dir(dir.path(), "nan").join("log.txt")),
        [0, 1]
    );
}

#[test]
fn loss_falls_on_the_synthetic_data() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 4, 12);
    let cfg = config(
        dir.path(),
        &data,
        "fall",
        "  epochs: 6\n  batch_size_per_gpu: 8\n  warmup_epochs: 1\n  lr: 0.01\n",
    );
    ok("trainer", &["train", "--config", &cfg, "--threads", "2"]);
    let lines = log_lines(dir.path(), "fall");
    let losses: Vec<f64> = lines
        .iter()
        .map(|l| l["train_loss"].as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), 6);
    assert!(losses[5] < losses[0] - 0.1, "loss did not fall: {losses:?}");
    for l in &lines {
        for k in ["train_loss", "train_lr", "train_wd", "epoch"] {
            assert!(l.get(k).is_some(), "{k} missing in {l}");
        }
    }
    let md = model_dir(dir.path(), "fall");
    let prom = std::fs::read_to_string(md.join("metrics.prom")).unwrap();
    assert!(
        prom.contains("scdino_train_loss{run=\"fall\",rank=\"0\"}"),
        "{prom}"
    );
    assert!(std::fs::read_dir(md.join("tensorboard")).unwrap().count() == 1);
    let ms =
        std::fs::read_to_string(dir.path().join("out/fall/mean_and_std_of_dataset.txt")).unwrap();
    let ms: serde_json::Value = serde_json::from_str(&ms).unwrap();
    assert_eq!(ms["mean"].as_array().unwrap().len(), 5);
}

/// The shipped small-data recipe (`configs/digits.yaml`) learns on real data from its first
/// epochs: on scikit-learn's digits (`scripts/digits.py`), two epochs of it take the DINO loss
/// well below ln(out_dim) = ln 512 = 6.24 (where every collapsed run on this data sat) and the
/// collapse detector, active from epoch 1, stays quiet. The long run's kNN and linear-probe
/// figures are in BENCHMARKS.md ("Learning on real data").
#[test]
fn the_digits_recipe_learns_in_its_first_epochs_without_a_collapse_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let data = dir.path().join("digits");
    let py = Command::new(root.join(".venv/bin/python"))
        .arg(root.join("scripts/digits.py"))
        .args(["--out", data.to_str().unwrap(), "--size", "16"])
        .output()
        .unwrap();
    assert!(py.status.success(), "{}", text(&py.stderr));
    let recipe = std::fs::read_to_string(root.join("configs/digits.yaml")).unwrap();
    let yaml = recipe
        .replace("digits/data/", &format!("{}/", data.display()))
        .replace(
            "digits/output",
            &dir.path().join("out").display().to_string(),
        );
    assert_ne!(yaml, recipe);
    let cfg = write_yaml(dir.path(), "digits", &yaml);
    // Two of the recipe's 30 epochs (43 iterations each), not a shortened recipe.
    let out = run(
        "trainer",
        &[
            "train",
            "--config",
            &cfg,
            "--threads",
            "1",
            "--max-steps",
            "86",
        ],
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("collapse"), "{err}");
    let losses: Vec<f64> = err
        .lines()
        .filter(|l| l.starts_with("Epoch: [1/30]"))
        .filter_map(|l| l.split_once("  loss: "))
        .filter_map(|(_, r)| r.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(losses.len() >= 2, "{err}");
    let last = *losses.last().unwrap();
    assert!(
        last < 4.5,
        "epoch 1 ended at loss {last} (ln 512 = 6.24): {err}"
    );
    let log = std::fs::read_to_string(
        dir.path()
            .join("out/digits/scDINO_ViTs/digitsViT_channel_digit_blurred_edges/log.txt"),
    )
    .unwrap();
    let epoch0: serde_json::Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    let mean0 = epoch0["train_loss"].as_f64().unwrap();
    assert!(
        last < mean0 - 1.0,
        "epoch 0 mean {mean0}, epoch 1 last {last}"
    );
}

/// DINOv2's iBOT in a real run (separate `ibot_head`, EMA patch centre, KoLeo too, 8 px patches
/// so a 32 px global crop has a 4 × 4 grid to mask): the progress line splits the loss into
/// its DINO, KoLeo and iBOT terms, which add up to it; the checkpoint holds the mask token, the iBOT
/// head and the patch centre under DINOv2's names; a run stopped mid-epoch resumes bit for bit
/// (same masks, same centre); the checkpoint feeds `trainer features` and a timm export (the
/// mask token is training-only and left out); switching iBOT off on resume is refused.
#[test]
fn ibot_resumes_bitwise_feeds_features_and_export_and_a_switch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 2, 8);
    let extra = "  epochs: 2\n  batch_size_per_gpu: 4\n  warmup_epochs: 1\n  lr: 0.05\n  koleo_weight: 0.1\n  ibot:\n    weight: 1.0\n    separate_head: true\n    out_dim: 96\n";
    let with_patch8 = |name: &str| {
        let path = config(dir.path(), &data, name, extra);
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("  out_dim: 128\n", "  out_dim: 128\n  patch_size: 8\n");
        std::fs::write(&path, text).unwrap();
        path
    };
    let straight = with_patch8("ibot_straight");
    let out = run(
        "trainer",
        &["train", "--config", &straight, "--threads", "1"],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Every progress line splits the loss into its terms, which add up to it.
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("Epoch: [") && l.contains("loss: "))
        .collect();
    assert!(!lines.is_empty(), "{stderr}");
    for line in lines {
        let number = |after: &str| -> f64 {
            let rest = &line[line
                .find(after)
                .unwrap_or_else(|| panic!("{after} in {line}"))
                + after.len()..];
            rest.split_whitespace().next().unwrap().parse().unwrap()
        };
        let (total, dino, koleo, ibot) = (
            number("loss: "),
            number("= DINO "),
            number("+ KoLeo "),
            number("+ iBOT "),
        );
        assert!(
            (dino + koleo + ibot - total).abs() < 2e-4,
            "terms do not add up: {line}"
        );
        assert!(ibot > 0.0, "{line}");
    }
    let ck = model_dir(dir.path(), "ibot_straight").join("checkpoint.safetensors");
    let reference = tensor_digests(&ck);
    for key in [
        "ibot_patch_loss.center",
        "student.backbone.mask_token",
        "teacher.backbone.mask_token",
        "student.ibot_head.last_layer.weight_v",
        "teacher.ibot_head.mlp.0.weight",
    ] {
        assert!(
            reference.contains_key(key),
            "{key} missing from the checkpoint"
        );
    }

    let cfg = with_patch8("ibot_mid");
    ok(
        "trainer",
        &[
            "train",
            "--config",
            &cfg,
            "--threads",
            "1",
            "--max-steps",
            "3",
        ],
    );
    let resumed = run("trainer", &["train", "--config", &cfg, "--threads", "1"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let got = tensor_digests(&model_dir(dir.path(), "ibot_mid").join("checkpoint.safetensors"));
    let differing: Vec<&String> = reference
        .keys()
        .filter(|k| reference.get(*k) != got.get(*k))
        .collect();
    assert!(
        differing.is_empty(),
        "resumed iBOT run differs: {differing:?}"
    );

    ok(
        "trainer",
        &["features", "--config", &straight, "--threads", "1"],
    );
    let export = dir.path().join("timm");
    ok(
        "trainer",
        &[
            "export",
            "--checkpoint",
            ck.to_str().unwrap(),
            "--format",
            "timm",
            "--out",
            export.to_str().unwrap(),
        ],
    );
    assert!(export.join("model.safetensors").exists());

    let off = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("    weight: 1.0\n", "    weight: 0.0\n")
        .replace("    out_dim: 96\n", "")
        .replace("  epochs: 2\n", "  epochs: 3\n");
    std::fs::write(&cfg, off).unwrap();
    let out = run("trainer", &["train", "--config", &cfg, "--threads", "1"]);
    assert!(!out.status.success(), "resumed with iBOT switched off");
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot resume") && err.contains("ibot"),
        "{err}"
    );
}
