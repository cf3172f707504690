//! `trainer export` against the consumers it is for: timm's `VisionTransformer` and
//! `torch.jit.load` in the venv (`tests/py/export_oracle.py`) give our CLS features on the same
//! images; channel-adaptive models are refused by timm; bad checkpoints and occupied output
//! folders are errors naming the file.
use super::util::{max_abs_diff, run_py_file, torch_rng_lock};
use std::path::{Path, PathBuf};
use std::process::Command;
use tch::{nn, Kind, Tensor};
use trainer::checkpoint::{self, CheckpointMeta, EpochTotals};
use trainer::config::{Arch, ChannelMode, CheckpointKey, Config};
use trainer::export::{export, ExportError, ExportRequest, Format};
use trainer::model::{bag_cls, VisionTransformer, VitConfig};

const CHANNELS: [&str; 5] = ["DAPI", "CD3", "CD19", "CD56", "Actin"];
const MEAN: [f32; 5] = [0.31, 0.42, 0.25, 0.5, 0.37];
const STD: [f32; 5] = [0.21, 0.18, 0.3, 0.25, 0.2];

/// A teacher (and a different student) backbone of `mode`, saved as a training checkpoint
/// would be; returns the checkpoint and the teacher.
fn checkpoint(
    dir: &Path,
    mode: ChannelMode,
    registers: usize,
) -> (PathBuf, nn::VarStore, VisionTransformer) {
    checkpoint_blocks(dir, mode, registers, 0, 0)
}

/// [`checkpoint`] of a model whose first `separate` blocks attend within a channel and the
/// `mixing` blocks after them within a position (`model.channel_separate_blocks`,
/// `model.channel_mixing_blocks`, `tokens` only), recorded in its fingerprint.
fn checkpoint_blocks(
    dir: &Path,
    mode: ChannelMode,
    registers: usize,
    separate: i64,
    mixing: i64,
) -> (PathBuf, nn::VarStore, VisionTransformer) {
    let _rng = torch_rng_lock();
    tch::manual_seed(7);
    let k = CHANNELS.len();
    let cfg = match mode {
        ChannelMode::Fixed => VitConfig::new(Arch::VitTiny, 16, k),
        ChannelMode::Bag => VitConfig::new(Arch::VitTiny, 16, 1),
        ChannelMode::Tokens => VitConfig::new(Arch::VitTiny, 16, k).with_channel_tokens(),
    }
    .with_registers(registers);
    let cfg = VitConfig {
        channel_separate_blocks: separate,
        channel_mixing_blocks: mixing,
        ..cfg
    };
    let mut vs = nn::VarStore::new(tch::Device::Cpu);
    let vit = VisionTransformer::new(vs.root() / "backbone", cfg);
    let mut tensors = Vec::new();
    tch::no_grad(|| {
        for (name, t) in vs.variables() {
            // Registers and LayerNorm affine parameters away from their init, so they matter.
            if name.contains("register_tokens") || name.contains("norm") {
                t.shallow_clone()
                    .copy_(&(&t + Tensor::randn_like(&t) * 0.5));
            }
            tensors.push((format!("teacher.{name}"), t.copy()));
            tensors.push((format!("student.{name}"), t.copy() * 0.5));
        }
    });
    vs.freeze();
    let mut fp = serde_json::json!({
        "arch": "vit_tiny",
        "patch_size": 16,
        "out_dim": 128,
        "channel_names": CHANNELS,
        "channels": (0..k).collect::<Vec<_>>(),
    });
    if mode != ChannelMode::Fixed {
        fp["model_channels"] = mode.name().into();
    }
    if registers > 0 {
        fp["num_register_tokens"] = registers.into();
    }
    if separate > 0 {
        fp["channel_separate_blocks"] = separate.into();
    }
    if mixing > 0 {
        fp["channel_mixing_blocks"] = mixing.into();
    }
    let meta = CheckpointMeta {
        format: checkpoint::FORMAT.into(),
        epoch: 3,
        epoch_batch: 0,
        iteration: 30,
        seed: 0,
        fingerprint: fp.to_string(),
        config_yaml: Config::from_yaml("", "test").unwrap().to_yaml(),
        mean: MEAN.to_vec(),
        std: STD.to_vec(),
        epoch_totals: EpochTotals::default(),
        loss_scaler: None,
        dataset: None,
    };
    let path = dir.join("checkpoint0002.safetensors");
    checkpoint::save(&path, &tensors, &meta).unwrap();
    (path, vs, vit)
}

/// The checkpoint `from` saved again as `to` with `change` made to its metadata.
fn resave(from: &Path, to: &Path, change: impl FnOnce(&mut CheckpointMeta)) {
    let ck = checkpoint::load(from).unwrap();
    let mut meta = ck.meta.clone();
    change(&mut meta);
    let tensors: Vec<(String, Tensor)> = ck
        .tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    checkpoint::save(to, &tensors, &meta).unwrap();
}

fn request(ckpt: &Path, format: Format, out: &Path) -> ExportRequest {
    ExportRequest {
        checkpoint: ckpt.to_path_buf(),
        format,
        out: out.to_path_buf(),
        network: CheckpointKey::Teacher,
        force: false,
        image_size: None,
    }
}

/// Runs the oracle on `x` and our features `ours`, returning its JSON.
fn oracle(format: &str, export_dir: &Path, x: &Tensor, ours: &Tensor) -> serde_json::Value {
    let tensors = export_dir.with_extension("inputs.safetensors");
    let (x, ours) = (x.contiguous(), ours.contiguous());
    Tensor::write_safetensors(&[("x", &x), ("ours", &ours)], &tensors).unwrap();
    let out = run_py_file(
        "export_oracle.py",
        &[
            format,
            export_dir.to_str().unwrap(),
            tensors.to_str().unwrap(),
        ],
    );
    serde_json::from_str(out.trim()).unwrap()
}

/// Images scaled to [0, 1] and their normalisation with the checkpoint's mean/std.
fn images(b: i64, k: i64) -> (Tensor, Tensor) {
    let _rng = torch_rng_lock();
    tch::manual_seed(11);
    let raw = Tensor::rand([b, k, 224, 224], (Kind::Float, tch::Device::Cpu));
    let mean = Tensor::from_slice(&MEAN[..k as usize]).reshape([1, k, 1, 1]);
    let std = Tensor::from_slice(&STD[..k as usize]).reshape([1, k, 1, 1]);
    let normalized = (&raw - mean) / std;
    (raw, normalized)
}

fn timm_matches(registers: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, _vs, vit) = checkpoint(dir.path(), ChannelMode::Fixed, registers);
    let out = dir.path().join("timm");
    let files = export(&request(&ckpt, Format::Timm, &out)).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["README.md", "config.json", "model.safetensors"]);
    let (_, x) = images(3, 5);
    let ours = tch::no_grad(|| vit.forward_t(&x, false));
    assert!(
        ours.abs().max().double_value(&[]) > 0.1,
        "features worth comparing"
    );
    let v = oracle("timm", &out, &x, &ours);
    for route in ["local_dir", "overlay", "state_dict"] {
        let diff = v[route].as_f64().unwrap();
        eprintln!("timm ({route}, {registers} registers): max |timm - ours| = {diff:e}");
        assert!(diff <= 1e-4, "{route}: max |timm - ours| = {diff}");
        assert_eq!(v[format!("{route}_shape")], serde_json::json!([3, 192]));
    }
    let close = |a: &serde_json::Value, b: &[f32]| {
        a.as_array()
            .unwrap()
            .iter()
            .zip(b)
            .all(|(a, b)| (a.as_f64().unwrap() - f64::from(*b)).abs() < 1e-6)
    };
    assert!(close(&v["mean"], &MEAN) && close(&v["std"], &STD), "{v}");
    assert_eq!(v["input_size"], serde_json::json!([5, 224, 224]));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architecture"], "vit_tiny_patch16_224");
    assert_eq!(config["channel_names"], serde_json::json!(CHANNELS));
    assert_eq!(config["pretrained_cfg"]["notes"][1], "channel 1: CD3");
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    for needle in [
        "local-dir:",
        "pretrained_cfg_overlay",
        "| 1 | CD3 | 0.42 | 0.18 |",
    ] {
        assert!(card.contains(needle), "the card lacks {needle}:\n{card}");
    }
}

#[test]
fn export_timm_gives_our_cls_features() {
    timm_matches(0);
}

#[test]
fn export_timm_with_registers_gives_our_cls_features() {
    timm_matches(4);
}

#[test]
fn export_torchscript_gives_our_cls_features_for_every_channel_mode() {
    // (mode, registers, channel-separate blocks, channel-mixing blocks): the blocks' attention
    // masks are built in the forward, from the input by ops that name no device.
    for (mode, registers, separate, mixing) in [
        (ChannelMode::Fixed, 2, 0, 0),
        (ChannelMode::Tokens, 0, 0, 0),
        (ChannelMode::Tokens, 2, 1, 1),
        (ChannelMode::Bag, 0, 0, 0),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (ckpt, _vs, vit) = checkpoint_blocks(dir.path(), mode, registers, separate, mixing);
        let out = dir.path().join("ts");
        export(&request(&ckpt, Format::Torchscript, &out)).unwrap();
        // Traced on two images; three go through (the batch is not baked in).
        let (raw, x) = images(3, 5);
        let ours = tch::no_grad(|| match mode {
            ChannelMode::Fixed => vit.forward_t(&x, false),
            ChannelMode::Tokens => vit.forward_channels_t(&x, Some(&[0, 1, 2, 3, 4]), false),
            ChannelMode::Bag => bag_cls(&vit, &x),
        });
        assert!(
            ours.abs().max().double_value(&[]) > 0.1,
            "features worth comparing"
        );
        let v = oracle("torchscript", &out, &raw, &ours);
        let diff = v["torchscript"].as_f64().unwrap();
        eprintln!(
            "torchscript ({}, {separate} separate, {mixing} mixing): max |ts - ours| = {diff:e}",
            mode.name()
        );
        assert!(
            diff <= 1e-5,
            "{}: max |torchscript - ours| = {diff}",
            mode.name()
        );
        let shape = if mode == ChannelMode::Bag {
            serde_json::json!([3, 5, 192])
        } else {
            serde_json::json!([3, 192])
        };
        assert_eq!(v["shape"], shape, "{}", mode.name());
        // No device is written into the graph: map_location places the whole module.
        let code = v["code"].as_str().unwrap();
        assert!(!code.contains("cpu"), "{code}");
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config["model_channels"], mode.name());
        assert!(out.join("README.md").exists());
    }
}

#[test]
fn export_student_differs_from_teacher() {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, _vs, _vit) = checkpoint(dir.path(), ChannelMode::Fixed, 0);
    let mut req = request(&ckpt, Format::Timm, &dir.path().join("teacher"));
    export(&req).unwrap();
    req.network = CheckpointKey::Student;
    req.out = dir.path().join("student");
    export(&req).unwrap();
    let read = |d: &str| {
        Tensor::read_safetensors(dir.path().join(d).join("model.safetensors"))
            .unwrap()
            .into_iter()
            .find(|(n, _)| n == "blocks.0.attn.qkv.weight")
            .unwrap()
            .1
    };
    let (t, s) = (read("teacher"), read("student"));
    assert!(max_abs_diff(&(t * 0.5), &s) < 1e-7);
    let card = std::fs::read_to_string(dir.path().join("student/README.md")).unwrap();
    assert!(card.contains("student backbone"), "{card}");
}

/// A `tokens` model with channel-separate or channel-mixing blocks is refused by timm, naming
/// why (its ViT has no per-channel tokens), and no folder is left behind; TorchScript takes
/// it (the test above).
#[test]
fn export_timm_refuses_channel_separate_and_mixing_blocks() {
    for (separate, mixing) in [(0, 1), (2, 0)] {
        let dir = tempfile::tempdir().unwrap();
        let (ckpt, _vs, _vit) =
            checkpoint_blocks(dir.path(), ChannelMode::Tokens, 2, separate, mixing);
        let out = dir.path().join("timm");
        let e = export(&request(&ckpt, Format::Timm, &out)).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, ExportError::Unsupported { .. }), "{text}");
        assert!(text.contains("channel-adaptive"), "{text}");
        assert!(!out.exists(), "{}", out.display());
    }
}

#[test]
fn export_timm_refuses_channel_adaptive_models() {
    for mode in [ChannelMode::Bag, ChannelMode::Tokens] {
        let dir = tempfile::tempdir().unwrap();
        let (ckpt, _vs, _vit) = checkpoint(dir.path(), mode, 0);
        let out = dir.path().join("timm");
        let e = export(&request(&ckpt, Format::Timm, &out))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("model.channels: {}", mode.name()))
                && e.contains("checkpoint0002.safetensors")
                && e.contains("as timm"),
            "{e}"
        );
        assert!(!out.exists(), "a refused export leaves no folder");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}

#[test]
fn export_refuses_bad_checkpoints_and_occupied_folders() {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, _vs, _vit) = checkpoint(dir.path(), ChannelMode::Fixed, 0);
    // A checkpoint that does not record its model (as one imported from a .pth).
    let bare = dir.path().join("imported.safetensors");
    resave(&ckpt, &bare, |meta| {
        meta.fingerprint = serde_json::json!({"imported_from": "x.pth"}).to_string()
    });
    let e = export(&request(&bare, Format::Timm, &dir.path().join("a")))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("imported.safetensors")
            && e.contains("arch, patch_size, channel_names")
            && e.contains("imported from a .pth"),
        "{e}"
    );
    // Not a checkpoint at all.
    let junk = dir.path().join("junk.safetensors");
    std::fs::write(&junk, b"not a checkpoint").unwrap();
    let e = export(&request(&junk, Format::Timm, &dir.path().join("b")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("junk.safetensors"), "{e}");
    // A PyTorch file (torch.save's zip) is named as one, with what to do instead of
    // safetensors' `HeaderTooLarge`.
    let pth = dir.path().join("dino.pth");
    super::util::run_python(
        "import sys, torch\ntorch.save({'teacher': {'backbone.cls_token': torch.zeros(1, 1, 4)}}, sys.argv[1])\n",
        &[pth.to_str().unwrap()],
    );
    let e = export(&request(&pth, Format::Timm, &dir.path().join("c")))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("dino.pth is a PyTorch file")
            && e.contains("format: pth")
            && !e.contains("HeaderTooLarge"),
        "{e}"
    );
    // An output folder with files: refused, untouched; replaced with force.
    let out = dir.path().join("occupied");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), b"mine").unwrap();
    let mut req = request(&ckpt, Format::Timm, &out);
    let e = export(&req).unwrap_err().to_string();
    assert!(
        e.contains("occupied") && e.contains("not empty") && e.contains("--force"),
        "{e}"
    );
    assert!(out.join("keep.txt").exists());
    // --force replaces a previous export only: a folder of other files, or one holding a
    // run (here the checkpoint's own folder), is refused with its path and left as it was.
    req.force = true;
    let e = export(&req).unwrap_err().to_string();
    assert!(
        e.contains("occupied") && e.contains("not a previous export") && e.contains("keep.txt"),
        "{e}"
    );
    assert_eq!(std::fs::read(out.join("keep.txt")).unwrap(), b"mine");
    let run = request(&ckpt, Format::Timm, dir.path());
    let e = export(&ExportRequest { force: true, ..run })
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a previous export"), "{e}");
    assert!(ckpt.exists() && dir.path().join("imported.safetensors").exists());
    // A folder with an export's files but someone else's config.json is not ours either.
    let lookalike = dir.path().join("lookalike");
    std::fs::create_dir(&lookalike).unwrap();
    std::fs::write(lookalike.join("config.json"), b"{\"architecture\": \"x\"}").unwrap();
    let e = export(&request(&ckpt, Format::Timm, &lookalike))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not empty"), "{e}");
    let e = export(&ExportRequest {
        force: true,
        ..request(&ckpt, Format::Timm, &lookalike)
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("not written by `trainer export`"), "{e}");
    // A previous export (of either format) is replaced.
    let previous = dir.path().join("previous");
    export(&request(&ckpt, Format::Torchscript, &previous)).unwrap();
    export(&ExportRequest {
        force: true,
        ..request(&ckpt, Format::Timm, &previous)
    })
    .unwrap();
    assert!(previous.join("model.safetensors").exists() && !previous.join("model.pt").exists());
    // An empty folder is fine without force; a file is not a folder.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    export(&request(&ckpt, Format::Torchscript, &empty)).unwrap();
    assert!(empty.join("model.pt").exists());
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let e = export(&request(&ckpt, Format::Timm, &file))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is a file"), "{e}");
    // The binary: its error names the folder, exit status 1.
    let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["export", "--format", "timm", "--checkpoint"])
        .arg(&ckpt)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("occupied") && stderr.contains("--force"),
        "{stderr}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["export", "--force", "--format", "timm", "--checkpoint"])
        .arg(&ckpt)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not a previous export"), "{stderr}");
    assert_eq!(std::fs::read(out.join("keep.txt")).unwrap(), b"mine");
}

#[test]
fn export_card_reports_the_runs_scores_for_this_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("run/scDINO_ViTs/vit_tiny_channel_all");
    std::fs::create_dir_all(&model_dir).unwrap();
    let (ckpt, _vs, _vit) = checkpoint(&model_dir, ChannelMode::Fixed, 0);
    // The pipeline's evaluation of this checkpoint (3 epochs done: tag epoch2).
    let eval_dir = dir
        .path()
        .join("run/vit_tiny_channel_all_analyses/evaluation");
    std::fs::create_dir_all(&eval_dir).unwrap();
    let scores = |top1: f64| serde_json::json!({"top1_percent": top1, "balanced_accuracy_percent": 61.5, "macro_f1": 0.6});
    let report = serde_json::json!({
        "queries_from": "held-out split",
        "n_train": 40,
        "n_queries": 10,
        "knn": [{"k": 20, "scores": scores(70.0)}],
        "linear_probe": {"scores": scores(80.0)},
    });
    std::fs::write(eval_dir.join("epoch2_evaluation.json"), report.to_string()).unwrap();
    let out = dir.path().join("ts");
    export(&request(&ckpt, Format::Torchscript, &out)).unwrap();
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    for needle in [
        "| 20-NN | 70.00 | 61.50 | 0.6000 |",
        "| linear probe | 80.00 | 61.50 | 0.6000 |",
        "held-out split, 40 training and 10 query images",
        "torch.jit.load",
        "3 epochs done",
    ] {
        assert!(card.contains(needle), "the card lacks {needle}:\n{card}");
    }
}

/// The features stage's rows of `csv` (`%.18e`, comma-separated) as a `[rows, D]` tensor.
fn csv_rows(csv: &Path) -> Tensor {
    let text = std::fs::read_to_string(csv).unwrap();
    let rows: Vec<Vec<f32>> = text
        .lines()
        .map(|l| {
            l.split(',')
                .map(|v| v.parse::<f64>().unwrap() as f32)
                .collect()
        })
        .collect();
    let d = rows[0].len() as i64;
    let flat: Vec<f32> = rows.concat();
    Tensor::from_slice(&flat).reshape([-1, d])
}

/// The images at `paths` as the features stage has them before normalising: the `channels`
/// selected, min-max scaled, the shorter side resized (bilinear) to `side` (square images
/// here, so `[B, k, side, side]`), with the crate's own preprocessing functions.
fn features_stage_inputs(paths: &[String], channels: &[usize], side: i64) -> Tensor {
    use trainer::data::{preprocess::preprocess, read_tiff, PreprocessOptions};
    let opts = PreprocessOptions {
        selected_channels: Some(channels.to_vec()),
        center_crop: 0,
    };
    let images: Vec<Tensor> = paths
        .iter()
        .map(|p| {
            let (img, _) = preprocess(&read_tiff(Path::new(p)).unwrap(), &opts).unwrap();
            Tensor::from_slice(&img.data)
                .reshape([img.channels as i64, img.height as i64, img.width as i64])
                .unsqueeze(0)
                .upsample_bilinear2d([side, side], false, None, None)
        })
        .collect();
    Tensor::cat(&images, 0)
}

/// Runs `trainer ARGS`, panicking with its stderr when it fails.
fn trainer(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "trainer {args:?}: {stderr}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The pipeline at sizes other than 224 (crops of 16 and 8 px, features at 24 px, patch 8,
/// so the position embeddings are resampled at every stage): real `trainer train`,
/// `trainer features` and `trainer export` processes. On the same preprocessed held-out
/// images, the TorchScript module (every channel mode) and timm's `local-dir:` model
/// (`fixed`) give the features stage's CSV rows; the module refuses inputs of another
/// shape or dtype with the shape it takes.
#[test]
fn exports_give_the_features_stage_rows_at_the_runs_resolution() {
    use trainer::data::{generate_synthetic, SynthOptions};
    use trainer::layout::RunLayout;
    let dir = tempfile::tempdir().unwrap();
    generate_synthetic(&SynthOptions {
        out: dir.path().join("data"),
        seed: 4,
        classes: 2,
        per_class: 8,
        size: 32,
        channels: 3,
        ..SynthOptions::default()
    })
    .unwrap();
    // tokens_alone: the shipped tokens recipe's pool (`joint_and_alone`) with a channel-separate
    // and a channel-mixing block, whose masks the trace must not fix on its device.
    for run in ["fixed", "tokens", "tokens_alone", "bag"] {
        let (mode, model_extra, features_extra) = match run {
            "tokens_alone" => (
                "tokens",
                ", channel_separate_blocks: 1, channel_mixing_blocks: 1",
                ", tokens_pool: joint_and_alone",
            ),
            _ => (run, "", ""),
        };
        let combination = if mode == "fixed" { "\"02\"" } else { "\"012\"" };
        let yaml = format!(
            "run: {{name: {run}, output_dir: {out}, seed: 2}}\ndata: {{dataset_dir: {data}, channel_names: [a, b, c], channel_combinations: [{combination}], num_workers: 1}}\nmodel: {{name: m, arch: vit_tiny, patch_size: 8, out_dim: 64, channels: {mode}{model_extra}}}\ntrain: {{epochs: 1, batch_size_per_gpu: 4, precision: fp32, warmup_epochs: 0, lr: 0.01}}\naugment: {{global_crop_size: 16, local_crop_size: 8, local_crops_number: 1}}\ndownstream: {{features: {{resize_length: 24{features_extra}}}}}\n",
            out = dir.path().join("out").display(),
            data = dir.path().join("data/Training").display(),
        );
        let cfg_path = dir.path().join(format!("{run}.yaml"));
        std::fs::write(&cfg_path, &yaml).unwrap();
        let cfg_arg = cfg_path.to_str().unwrap();
        trainer(&["train", "--config", cfg_arg]);
        trainer(&["features", "--config", cfg_arg]);
        let cfg = Config::from_yaml(&yaml, "test").unwrap();
        let channels = cfg.channel_sets[0].clone();
        let files = RunLayout::new(&cfg).model(&cfg, &channels);
        let ckpt = files.latest_checkpoint();
        let tag = trainer::model::backbone::checkpoint_tag(&ckpt).unwrap();
        let rows = csv_rows(&files.features_csv(&tag));
        let paths: Vec<String> = std::fs::read_to_string(files.image_paths_csv())
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        assert_eq!(rows.size()[0], paths.len() as i64);
        let x = features_stage_inputs(&paths, &channels, 24);
        let k = channels.len();
        let formats: &[&str] = if mode == "fixed" {
            &["torchscript", "timm"]
        } else {
            &["torchscript"]
        };
        for format in formats {
            let out = dir.path().join(format!("export_{run}_{format}"));
            trainer(&[
                "export",
                "--format",
                format,
                "--checkpoint",
                ckpt.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ]);
            let tensors = out.with_extension("inputs.safetensors");
            Tensor::write_safetensors(&[("x", &x), ("rows", &rows)], &tensors).unwrap();
            let v: serde_json::Value = serde_json::from_str(
                run_py_file(
                    "export_oracle.py",
                    &[
                        &format!("pipeline-{format}"),
                        out.to_str().unwrap(),
                        tensors.to_str().unwrap(),
                    ],
                )
                .trim(),
            )
            .unwrap();
            let diff = v["max_abs_diff"].as_f64().unwrap();
            eprintln!("{run} {format}: max |export - features stage| = {diff:e}");
            assert!(diff <= 1e-5, "{run} {format}: {v}");
            if run == "tokens_alone" {
                // (3k + 1)·D: the joint pass's CLS and k channel tokens, each channel's own two.
                assert_eq!(v["shape"][1], (3 * k + 1) * 192, "{v}");
                let config = std::fs::read_to_string(out.join("config.json")).unwrap();
                assert!(config.contains("joint_and_alone"), "{config}");
            }
            assert_eq!(
                v["marker"]["input_size"],
                serde_json::json!({"side": 24, "from": "downstream.features.resize_length"}),
                "{v}"
            );
            let card = std::fs::read_to_string(out.join("README.md")).unwrap();
            assert!(
                card.contains(
                    "The input size 24×24 is the run's `downstream.features.resize_length`"
                ),
                "{card}"
            );
            if *format == "timm" {
                assert_eq!(v["input_size"], serde_json::json!([k, 24, 24]), "{v}");
                continue;
            }
            let expected = format!("float32 [B, {k}, 24, 24]");
            for (case, e) in v["errors"].as_object().unwrap() {
                let e = e
                    .as_str()
                    .unwrap_or_else(|| panic!("{run}: {case} was accepted"));
                assert!(e.contains(&expected), "{run} {case}: {e}");
            }
        }
    }
}

/// `--image-size` exports for another size: the module at 32 px gives what our ViT gives for
/// 32 px images (its position embeddings resampled on the fly, as `trainer features` would),
/// and says where the size came from; a run whose features stage does not resize has no size
/// to default to and is refused naming the flag.
#[test]
fn export_at_a_requested_size_gives_our_features_at_that_size() {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, _vs, vit) = checkpoint(dir.path(), ChannelMode::Fixed, 0);
    let out = dir.path().join("ts32");
    export(&ExportRequest {
        image_size: Some(32),
        ..request(&ckpt, Format::Torchscript, &out)
    })
    .unwrap();
    let (raw, x) = images(3, 5);
    let (raw, x) = (
        raw.narrow(2, 0, 32).narrow(3, 0, 32),
        x.narrow(2, 0, 32).narrow(3, 0, 32),
    );
    let ours = tch::no_grad(|| vit.forward_t(&x, false));
    let v = oracle("torchscript", &out, &raw, &ours);
    let diff = v["torchscript"].as_f64().unwrap();
    assert!(diff <= 1e-5, "max |torchscript - ours| at 32 px = {diff}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        config["input"]["shape"],
        serde_json::json!(["B", 5, 32, 32])
    );
    assert_eq!(
        config["scdino_export"]["input_size"],
        serde_json::json!({"side": 32, "from": "--image-size"})
    );
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(
        card.contains(
            "asked for with `--image-size` (the run's features stage embedded at 224 px)"
        ),
        "{card}"
    );
    // No resize in the features stage: no default size.
    let unresized = dir.path().join("unresized.safetensors");
    resave(&ckpt, &unresized, |meta| {
        meta.config_yaml =
            Config::from_yaml("downstream:\n  features:\n    resize: false\n", "test")
                .unwrap()
                .to_yaml()
    });
    let e = export(&request(&unresized, Format::Timm, &dir.path().join("u")))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unresized.safetensors")
            && e.contains("downstream.features.resize: false")
            && e.contains("--image-size"),
        "{e}"
    );
}
