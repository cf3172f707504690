//! `model.init`: channel adaptation against timm's `adapt_input_conv`; a timm source (made by
//! timm, `tests/py/timm_oracle.py`) and another run's checkpoint load into the student, the
//! teacher equal to it; layouts and tensors that do not fit are refused naming the key, the
//! tensor and the file, or listed with `strict: false`; what the source fixes of `model:` (the
//! architecture, patch, registers, LayerScale, position layout and grid) is taken from it where
//! the file does not write it; the model keeps the source's position grid, so its positions
//! are resampled once (from the source's grid to each input's) and a run exported at the
//! source's size before any step gives the source's tensors bit for bit; a real `trainer train`
//! starts from `model.init` once and a resumed run does not.
use super::util::{max_abs_diff, run_py_file, run_python, torch_rng_lock};
use std::path::Path;
use std::process::Command;
use tch::{Device, Kind, Tensor};
use trainer::checkpoint::{self, CheckpointMeta, EpochTotals};
use trainer::config::{Arch, ChannelAdapt, CheckpointKey, Config, ConfigError, PosEmbed};
use trainer::export::Source;
use trainer::model::backbone::BackboneWeights;
use trainer::model::{timm, VisionTransformer};
use trainer::train::init::{adapt_patch_embed, apply};
use trainer::train::init_layout::config_from_yaml;
use trainer::train::step::Networks;

#[test]
fn repeat_is_timms_adapt_input_conv_and_mean_the_mean_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let w = Tensor::randn([8, 3, 4, 4], (Kind::Float, Device::Cpu));
    let path = dir.path().join("w.safetensors");
    Tensor::write_safetensors(&[("w", &w)], &path).unwrap();
    let out = dir.path().join("timm.safetensors");
    run_python(
        "import sys\nfrom safetensors.torch import load_file, save_file\nfrom timm.models._manipulate import adapt_input_conv\nw = load_file(sys.argv[1])['w']\nsave_file({f'c{c}': adapt_input_conv(c, w.clone()).contiguous() for c in (1, 2, 3, 5)}, sys.argv[2])\n",
        &[path.to_str().unwrap(), out.to_str().unwrap()],
    );
    let timm: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(&out)
        .unwrap()
        .into_iter()
        .collect();
    for c in [1, 2, 3, 5] {
        let ours = adapt_patch_embed(&w, c, ChannelAdapt::Repeat);
        assert_eq!(ours.size(), [8, c, 4, 4]);
        let d = max_abs_diff(&ours, &timm[&format!("c{c}")]);
        assert!(d == 0.0, "C = {c}: |ours - timm| = {d}");
        let mean = adapt_patch_embed(&w, c, ChannelAdapt::Mean);
        let want = if c == 3 {
            w.shallow_clone()
        } else {
            (w.mean_dim(1, true, Kind::Float) * (3.0 / c as f64)).repeat([1, c, 1, 1])
        };
        assert!(max_abs_diff(&mean, &want) < 1e-6, "mean, C = {c}");
        // The mean kernel keeps the sum over the input channels.
        let sum = |t: &Tensor| t.sum_dim_intlist(1, false, Kind::Float);
        assert!(max_abs_diff(&sum(&mean), &sum(&w)) < 1e-5, "C = {c}");
    }
}

/// A config built in code (every key as written, nothing read from the source).
fn config(init: &str, extra: &str) -> Config {
    // vit_tiny unless `extra` names another architecture.
    let arch = if extra.contains("arch:") {
        ""
    } else {
        "  arch: vit_tiny\n"
    };
    Config::from_yaml(&yaml_of(init, &format!("{arch}{extra}")), "test.yaml").unwrap()
}

/// 5 channels, `model:` with `extra` (from line 5) and `init:` `init`.
fn yaml_of(init: &str, extra: &str) -> String {
    format!("data:\n  channel_names: [a, b, c, d, e]\n  channel_combinations: [\"01234\"]\nmodel:\n{extra}  out_dim: 64\n  init:\n{init}")
}

/// `model:`'s layout keys of `cfg`.
fn layout(cfg: &Config) -> (Arch, usize, usize, bool, PosEmbed) {
    let m = &cfg.model;
    (
        m.arch,
        m.patch_size,
        m.num_register_tokens,
        m.layer_scale.is_some(),
        m.pos_embed,
    )
}

/// The checkpoint a run of `cfg` on the file channels `channels` writes for `nets` before its
/// first step: both networks, the trainer's fingerprint and resolved config.
fn save_unstepped(cfg: &Config, nets: &Networks, channels: &[usize], path: &Path) {
    let mut tensors = Vec::new();
    for (prefix, vs) in [("student", &nets.student_vs), ("teacher", &nets.teacher_vs)] {
        for (name, t) in vs.variables() {
            tensors.push((format!("{prefix}.{name}"), t));
        }
    }
    let k = channels.len();
    let meta = CheckpointMeta {
        format: checkpoint::FORMAT.into(),
        epoch: 0,
        epoch_batch: 0,
        iteration: 0,
        seed: cfg.run.seed,
        fingerprint: trainer::train::run::fingerprint(cfg, channels),
        config_yaml: cfg.to_yaml(),
        mean: vec![0.5; k],
        std: vec![0.25; k],
        epoch_totals: EpochTotals::default(),
        loss_scaler: None,
        dataset: None,
    };
    checkpoint::save(path, &tensors, &meta).unwrap();
}

/// The teacher backbone `trainer export` holds for `side`-px inputs of the checkpoint `path`,
/// by our (PyTorch) names.
fn exported(path: &Path, side: usize) -> std::collections::BTreeMap<String, Tensor> {
    Source::load(path, CheckpointKey::Teacher, Some(side))
        .unwrap()
        .tensors()
        .into_iter()
        .collect()
}

fn assert_teacher_is_student(nets: &Networks) {
    let teacher = nets.teacher_vs.variables();
    for (name, t) in nets.student_vs.variables() {
        assert!(
            t.equal(&teacher[&name]),
            "teacher {name} differs from the student"
        );
    }
}

#[test]
fn timm_init_loads_the_source_and_refuses_what_does_not_fit() {
    let _rng = torch_rng_lock();
    let dir = tempfile::tempdir().unwrap();
    run_py_file("timm_oracle.py", &[dir.path().to_str().unwrap()]);
    let folder = dir.path().join("tiny");
    let init = format!("    from: {}\n    format: timm\n", folder.display());
    // The file writes no layout key: the trainer takes the source's (ViT-Ti/16, 4 registers,
    // LayerScale, timm's no_embed_class) from config.json and the safetensors header.
    let cfg = config_from_yaml(&yaml_of(&init, ""), "test.yaml").unwrap();
    assert_eq!(
        layout(&cfg),
        (Arch::VitTiny, 16, 4, true, PosEmbed::TimmNoClass)
    );
    // Its 2×2 grid of positions (32 px) too.
    assert_eq!(cfg.model.img_size, Some(32));
    let nets = Networks::new(&cfg, 5, Device::Cpu);
    let report = apply(&cfg, &cfg.model.init, &nets).unwrap();
    assert!(report.skipped.is_empty());
    // What the log line says of the channels.
    assert_eq!(
        report.channels.as_deref(),
        Some("3 → 5 channels with model.init.channels: repeat")
    );
    let source: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(folder.join("model.safetensors"))
            .unwrap()
            .into_iter()
            .collect();
    let student = nets.student_vs.variables();
    for (name, t) in &source {
        let ours = match name.as_str() {
            "reg_token" => "backbone.register_tokens".to_string(),
            n => format!("backbone.{n}"),
        };
        let s = &student[&ours];
        match name.as_str() {
            "patch_embed.proj.weight" => {
                let want = adapt_patch_embed(t, 5, ChannelAdapt::Repeat);
                assert!(s.equal(&want), "{name} is the repeat adaptation");
            }
            // The source's 2×2 grid as it is, not resampled to 224 px's 14×14.
            "pos_embed" => {
                assert_eq!(s.size(), [1, 4, 192]);
                assert!(s.equal(t), "{name} loaded as it is");
            }
            _ => assert!(s.equal(t), "{name} loaded as it is"),
        }
    }
    assert_teacher_is_student(&nets);
    // So at every input size the student's positions are the folder's own network's (timm's
    // resampling from its grid, tested against timm in it/timm.rs), resampled once.
    let folder_vs = tch::nn::VarStore::new(Device::Cpu);
    let m = timm::read(&folder).unwrap();
    let own = VisionTransformer::new(folder_vs.root() / "backbone", m.cfg);
    m.load_into(&folder_vs, "backbone.").unwrap();
    for side in [32, 48, 224] {
        let ours = nets.student.backbone.pos_embed_for(side, side);
        let theirs = own.pos_embed_for(side, side);
        assert!(ours.equal(&theirs), "positions at {side} px differ");
    }
    // Exported at the source's 32 px before any step: the source's tensors, bit for bit
    // (the patch embedding aside, adapted to the run's 5 channels).
    let ckpt = dir.path().join("from_timm.safetensors");
    save_unstepped(&cfg, &nets, &[0, 1, 2, 3, 4], &ckpt);
    let out = exported(&ckpt, 32);
    assert_eq!(out.len(), source.len());
    for (name, t) in &source {
        let ours = match name.as_str() {
            "reg_token" => "register_tokens",
            n => n,
        };
        if name != "patch_embed.proj.weight" {
            assert!(
                out[ours].equal(t),
                "the export's {ours} is not the source's"
            );
        }
    }

    // A layout key the file writes otherwise: refused when the file is read, naming the key,
    // its line and both values.
    for (extra, key, want) in [
        (
            "  patch_size: 8\n",
            "model.patch_size",
            "is 8, but model.init.from",
        ),
        (
            "  arch: vit_small\n",
            "model.arch",
            "is vit_small, but model.init.from",
        ),
        (
            "  layer_scale: null\n",
            "model.layer_scale",
            "is unset (no LayerScale), but",
        ),
        (
            "  pos_embed: timm\n",
            "model.pos_embed",
            "is timm, but model.init.from",
        ),
    ] {
        match config_from_yaml(&yaml_of(&init, extra), "test.yaml").unwrap_err() {
            ConfigError::Invalid {
                key: k,
                line,
                message,
                ..
            } => {
                assert_eq!((k.as_str(), line), (key, Some(5)), "{message}");
                assert!(
                    message.contains(want) && message.contains(folder.to_str().unwrap()),
                    "{message}"
                );
            }
            other => panic!("{other}"),
        }
    }
    // A config built in code that contradicts the source: refused when the run starts.
    let cfg = config(
        &init,
        "  pos_embed: timm_no_class\n  num_register_tokens: 4\n",
    );
    let nets = Networks::new(&cfg, 5, Device::Cpu);
    let err = apply(&cfg, &cfg.model.init, &nets).unwrap_err().to_string();
    assert!(
        err.contains("`model.layer_scale` is unset (no LayerScale), but the source has set")
            && err.contains("tiny"),
        "{err}"
    );
    let cfg = config(&init, "  layer_scale: 1.0e-5\n  num_register_tokens: 4\n");
    let nets = Networks::new(&cfg, 5, Device::Cpu);
    let err = apply(&cfg, &cfg.model.init, &nets).unwrap_err().to_string();
    assert!(
        err.contains("`model.pos_embed` is dino, but the source has timm_no_class"),
        "{err}"
    );
    let cfg = config(&init, "  arch: vit_small\n  layer_scale: 1.0e-5\n  pos_embed: timm_no_class\n  num_register_tokens: 4\n");
    let nets = Networks::new(&cfg, 5, Device::Cpu);
    let err = apply(&cfg, &cfg.model.init, &nets).unwrap_err().to_string();
    assert!(
        err.contains("`model.arch` is vit_small, but the source has vit_tiny"),
        "{err}"
    );
    // Its grid too: a model at the default 224 px is not the source.
    let cfg = config(
        &init,
        "  layer_scale: 1.0e-5\n  pos_embed: timm_no_class\n  num_register_tokens: 4\n",
    );
    let nets = Networks::new(&cfg, 5, Device::Cpu);
    let err = apply(&cfg, &cfg.model.init, &nets).unwrap_err().to_string();
    assert!(
        err.contains("`model.img_size` is unset (224), but the source has 32"),
        "{err}"
    );
}

/// `trainer train` for at most `steps` steps on `config`; returns stderr.
fn train(config: &Path, steps: &str) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["train", "--config", config.to_str().unwrap()])
        .args(["--threads", "1", "--max-steps", steps])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{stderr}");
    stderr + &String::from_utf8_lossy(&o.stdout)
}

#[test]
fn run_init_is_that_runs_backbone_and_only_starts_a_new_run() {
    use trainer::data::{generate_synthetic, SynthOptions};
    use trainer::train::run::model_dir;
    let dir = tempfile::tempdir().unwrap();
    generate_synthetic(&SynthOptions {
        out: dir.path().join("data"),
        seed: 4,
        classes: 2,
        per_class: 8,
        ..SynthOptions::default()
    })
    .unwrap();
    let yaml = |name: &str, model: &str| {
        format!(
            "run:\n  name: {name}\n  output_dir: {out}\n  seed: 5\ndata:\n  dataset_dir: {data}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: [\"24\"]\n  num_workers: 1\nmodel:\n  arch: vit_tiny\n  out_dim: 64\n{model}train:\n  epochs: 1\n  batch_size_per_gpu: 4\n  warmup_epochs: 0\n  precision: fp32\n  lr: 0.05\naugment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 2\n",
            out = dir.path().join("out").display(),
            data = dir.path().join("data/Training").display()
        )
    };
    let first = dir.path().join("first.yaml");
    // Patch 8, a register and a grid of positions for 64 px (8×8, resampled to the 32- and
    // 16-px crops), so a run that starts from it must take all three from it.
    std::fs::write(
        &first,
        yaml(
            "first",
            "  patch_size: 8\n  num_register_tokens: 1\n  img_size: 64\n",
        ),
    )
    .unwrap();
    train(&first, "2");
    let source = model_dir(&Config::load(&first).unwrap(), &[2, 4]).join("checkpoint.safetensors");
    let trained = BackboneWeights::load(&source, CheckpointKey::Teacher).unwrap();
    assert_eq!(trained.tensors["pos_embed"].size(), [1, 65, 192]);

    // In process: the student's backbone (and with head: true its head) is the run's teacher.
    let init = format!(
        "  init:\n    from: {}\n    format: run\n    head: true\n",
        source.display()
    );
    // The file writes neither: both come from the checkpoint's model record.
    let cfg = config_from_yaml(&yaml("second", &init), "second.yaml").unwrap();
    assert_eq!(layout(&cfg), (Arch::VitTiny, 8, 1, false, PosEmbed::Dino));
    assert_eq!(cfg.model.img_size, Some(64));
    let nets = Networks::new(&cfg, 2, Device::Cpu);
    apply(&cfg, &cfg.model.init, &nets).unwrap();
    let student = nets.student_vs.variables();
    for (name, t) in &trained.tensors {
        assert!(
            student[&format!("backbone.{name}")].equal(&t.to_kind(Kind::Float)),
            "{name}"
        );
    }
    let ck = trainer::checkpoint::load(&source).unwrap();
    for (name, t) in &ck.tensors {
        if let Some(head) = name.strip_prefix("teacher.head.") {
            assert!(student[&format!("head.{head}")].equal(t), "head.{head}");
        }
    }
    assert_teacher_is_student(&nets);
    // Exported at the source's 64 px before any step: the source run's teacher, bit for bit.
    let ckpt = dir.path().join("from_run.safetensors");
    save_unstepped(&cfg, &nets, &[2, 4], &ckpt);
    let out = exported(&ckpt, 64);
    assert_eq!(out.len(), trained.tensors.len());
    for (name, t) in &trained.tensors {
        assert!(
            out[name].equal(t),
            "the export's {name} is not the source's"
        );
    }

    // A model the checkpoint does not fit: a file that asks for LayerScale is refused when
    // read; a config built in code when the run starts, naming the tensor and the file; with
    // strict: false the file's LayerScale stands and its tensors are skipped and listed.
    let bad = format!(
        "  layer_scale: 1.0e-5\n  init:\n    from: {}\n    format: run\n",
        source.display()
    );
    let err = config_from_yaml(&yaml("third", &bad), "third.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "third.yaml:13: `model.layer_scale`: is set (LayerScale), but model.init.from"
        ) && err.contains("has unset (no LayerScale)"),
        "{err}"
    );
    let in_code = format!("  patch_size: 8\n  num_register_tokens: 1\n  img_size: 64\n{bad}");
    let cfg = Config::from_yaml(&yaml("third", &in_code), "third.yaml").unwrap();
    let nets = Networks::new(&cfg, 2, Device::Cpu);
    let err = apply(&cfg, &cfg.model.init, &nets).unwrap_err().to_string();
    assert!(
        err.contains("blocks.0.ls1.gamma")
            && err.contains("checkpoint.safetensors")
            && err.contains("model.init"),
        "{err}"
    );
    let lax = bad.clone() + "    strict: false\n";
    let cfg = config_from_yaml(&yaml("third", &lax), "third.yaml").unwrap();
    assert_eq!(layout(&cfg), (Arch::VitTiny, 8, 1, true, PosEmbed::Dino));
    let nets = Networks::new(&cfg, 2, Device::Cpu);
    let report = apply(&cfg, &cfg.model.init, &nets).unwrap();
    assert_eq!(report.skipped.len(), 24, "{:?}", report.skipped);

    // A real run starts from it once; run again, it resumes and does not re-initialise.
    let second = dir.path().join("second.yaml");
    let init = format!("  init:\n    from: {}\n    format: run\n", source.display());
    std::fs::write(&second, yaml("second", &init)).unwrap();
    let log = train(&second, "1");
    assert!(
        log.contains("model.init: ") && log.contains("the teacher starts equal to the student"),
        "{log}"
    );
    let log = train(&second, "2");
    assert!(
        !log.contains("model.init: "),
        "a resumed run was initialised again: {log}"
    );
}

#[test]
fn model_init_keys_are_validated() {
    let base = "data:\n  channel_names: [a]\n  channel_combinations: [\"0\"]\nmodel:\n  init:\n";
    let err = Config::from_yaml(
        &format!("{base}    from: x\n    format: timm\n    head: true\n"),
        "c.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("c.yaml:") && err.contains("model.init.head"),
        "{err}"
    );
    let err = Config::from_yaml(&format!("{base}    from: x\n    format: onnx\n"), "c.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("format") && err.contains("onnx"), "{err}");
    let err = Config::from_yaml(
        &format!("{base}    from: x\n    format: timm\n    colour: 1\n"),
        "c.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("colour"), "{err}");
    let err = Config::from_yaml(
        &format!("{base}    from: \"\"\n    format: timm\n"),
        "c.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("model.init.from"), "{err}");
}

#[test]
fn pth_init_loads_the_backbone_with_mean_adaptation() {
    let _rng = torch_rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let pth = dir.path().join("bare.pth");
    run_py_file(
        "pth_oracle.py",
        &["bare", pth.to_str().unwrap(), "3", "7", "float32"],
    );
    let init = format!(
        "    from: {}\n    format: pth\n    channels: mean\n",
        pth.display()
    );
    let cfg = config(&init, "");
    let nets = Networks::new(&cfg, 5, Device::Cpu);
    let report = apply(&cfg, &cfg.model.init, &nets).unwrap();
    assert_eq!(
        report.channels.as_deref(),
        Some("3 → 5 channels with model.init.channels: mean")
    );
    let source = BackboneWeights::load(&pth, CheckpointKey::Teacher).unwrap();
    assert_eq!(report.loaded, source.tensors.len());
    let student = nets.student_vs.variables();
    for (name, t) in &source.tensors {
        let s = &student[&format!("backbone.{name}")];
        let want = match name.as_str() {
            "patch_embed.proj.weight" => adapt_patch_embed(t, 5, ChannelAdapt::Mean),
            _ => t.shallow_clone(),
        };
        assert!(s.equal(&want), "{name}");
    }
    assert_teacher_is_student(&nets);

    // The same .pth imported as one of our checkpoints has no model record: as a `run`
    // source its layout comes from its tensors, and it loads as the .pth did.
    let imported = dir.path().join("imported.safetensors");
    source.save(&imported, CheckpointKey::Teacher).unwrap();
    let run = format!("    from: {}\n    format: run\n", imported.display());
    let cfg = config_from_yaml(&yaml_of(&run, ""), "test.yaml").unwrap();
    assert_eq!(layout(&cfg), (Arch::VitTiny, 16, 0, false, PosEmbed::Dino));
    let nets = Networks::new(&cfg, 5, Device::Cpu);
    let report = apply(&cfg, &cfg.model.init, &nets).unwrap();
    assert_eq!(report.loaded, source.tensors.len());

    // Only an absent record means "read the tensors": a record that is there but names no
    // network this project has is refused, not silently replaced by the shapes.
    let ck = trainer::checkpoint::load(&imported).unwrap();
    let mut meta = ck.meta.clone();
    meta.fingerprint =
        r#"{"arch": "vit_huge", "patch_size": 16, "channel_names": ["a"]}"#.to_string();
    let tensors: Vec<(String, Tensor)> = ck
        .tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    let damaged = dir.path().join("damaged.safetensors");
    trainer::checkpoint::save(&damaged, &tensors, &meta).unwrap();
    let run = format!("    from: {}\n    format: run\n", damaged.display());
    let err = config_from_yaml(&yaml_of(&run, ""), "test.yaml")
        .expect_err("a malformed model record is refused")
        .to_string();
    assert!(
        err.contains("damaged.safetensors") && err.contains("`arch` is malformed"),
        "{err}"
    );
}

/// DINOv2's own `.pth` (`tests/py/dinov2_oracle.py`: DINOv2's `DinoVisionTransformer` with its
/// `interpolate_pos_encoding` copied from the dinov2 repository) as `model.init format: pth`:
/// an original model (class position, `interpolate_offset=0.1`, chunked blocks, a training
/// checkpoint's `teacher`) with `pos_embed: dino`, a register model (`interpolate_offset=0`,
/// antialiased, a bare hub state dict) with `pos_embed: timm`. The model keeps the source's
/// 3×3 grid (42 px); its positions resampled once to 224 px's 16×16 are DINOv2's, and so are
/// the CLS features at 224 px; the other resampling gives other positions. Exported at 42 px
/// before any step, the run gives the file's tensors back bit for bit.
#[test]
fn dinov2_pth_init_gives_dinov2s_positions_and_features() {
    let _rng = torch_rng_lock();
    let dir = tempfile::tempdir().unwrap();
    run_py_file("dinov2_oracle.py", &[dir.path().to_str().unwrap()]);
    // The file writes only the resampling (a .pth does not record it); the architecture,
    // patch 14, registers and LayerScale come from the file's tensors.
    let config = |name: &str, registers: usize, pos_embed: &str| {
        let cfg = config_from_yaml(
            &format!("data:\n  channel_names: [a, b, c]\n  channel_combinations: [\"012\"]\nmodel:\n  pos_embed: {pos_embed}\n  out_dim: 64\n  init:\n    from: {}\n    format: pth\n", dir.path().join(format!("{name}.pth")).display()),
            "test.yaml",
        )
        .unwrap();
        let pos: PosEmbed = serde_json::from_value(pos_embed.into()).unwrap();
        assert_eq!(layout(&cfg), (Arch::VitTiny, 14, registers, true, pos));
        cfg
    };
    for (name, registers, pos_embed, other) in
        [("v1", 0, "dino", "timm"), ("reg", 4, "timm", "dino")]
    {
        let want: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(dir.path().join(format!("{name}.safetensors")))
                .unwrap()
                .into_iter()
                .collect();
        let cfg = config(name, registers, pos_embed);
        assert_eq!(cfg.model.img_size, Some(42), "{name}");
        let nets = Networks::new(&cfg, 3, Device::Cpu);
        let report = apply(&cfg, &cfg.model.init, &nets).unwrap();
        assert!(report.skipped.is_empty(), "{name}: {:?}", report.skipped);
        // 12 blocks × 14 tensors, patch embedding (2), cls, pos, norm (2), the registers
        // (DINOv2's mask_token has no place in a model without iBOT).
        assert_eq!(
            report.loaded,
            12 * 14 + 6 + usize::from(registers > 0),
            "{name}"
        );
        let pos = nets.student.backbone.pos_embed_for(224, 224);
        let diff = max_abs_diff(&pos, &want["pos"]);
        assert!(
            diff < 1e-6,
            "{name}: positions differ from DINOv2's by {diff}"
        );
        let file = BackboneWeights::load(
            &dir.path().join(format!("{name}.pth")),
            CheckpointKey::Teacher,
        )
        .unwrap();
        let ckpt = dir.path().join(format!("{name}_run.safetensors"));
        save_unstepped(&cfg, &nets, &[0, 1, 2], &ckpt);
        let out = exported(&ckpt, 42);
        assert_eq!(
            out.len(),
            file.tensors.len() - 1,
            "{name}: all but mask_token"
        );
        for (t, theirs) in file.tensors.iter().filter(|(t, _)| *t != "mask_token") {
            assert!(
                out[t].equal(theirs),
                "{name}: the export's {t} is not the file's"
            );
        }
        let ours = tch::no_grad(|| nets.student.backbone.forward_t(&want["x"], false));
        let diff = max_abs_diff(&ours, &want["y"]);
        assert!(diff < 1e-5, "{name}: |ours - DINOv2| = {diff}");
        assert!(
            want["y"].abs().max().double_value(&[]) > 0.1,
            "features are not trivial"
        );
        assert_teacher_is_student(&nets);
        let cfg = config(name, registers, other);
        let nets = Networks::new(&cfg, 3, Device::Cpu);
        apply(&cfg, &cfg.model.init, &nets).unwrap();
        let apart = max_abs_diff(&nets.student.backbone.pos_embed_for(224, 224), &want["pos"]);
        assert!(
            apart > 1e-4,
            "{name}: pos_embed: {other} resamples alike ({apart})"
        );
    }
    // Reading the config reads the file's pickle, not its tensors (every command reads the
    // config; a ViT-L .pth is over a GB): with every tensor record dropped from the archive the
    // layout is still the file's, and only the start of training, which needs the weights,
    // fails naming a missing record.
    let hollow = dir.path().join("hollow.pth");
    run_python(
        "import sys, zipfile\nsrc, dst = zipfile.ZipFile(sys.argv[1]), zipfile.ZipFile(sys.argv[2], 'w')\nkept = [i for i in src.infolist() if '/data/' not in i.filename]\nassert len(kept) < len(src.infolist())\nfor i in kept: dst.writestr(i, src.read(i))\ndst.close()\n",
        &[dir.path().join("reg.pth").to_str().unwrap(), hollow.to_str().unwrap()],
    );
    let cfg = config_from_yaml(
        &format!("data:\n  channel_names: [a, b, c]\n  channel_combinations: [\"012\"]\nmodel:\n  pos_embed: timm\n  out_dim: 64\n  init:\n    from: {}\n    format: pth\n", hollow.display()),
        "test.yaml",
    )
    .unwrap();
    assert_eq!(layout(&cfg), (Arch::VitTiny, 14, 4, true, PosEmbed::Timm));
    let nets = Networks::new(&cfg, 3, Device::Cpu);
    let err = apply(&cfg, &cfg.model.init, &nets)
        .expect_err("a .pth without its tensor records cannot initialise a network")
        .to_string();
    assert!(
        err.contains("hollow.pth") && err.contains("has no record"),
        "{err}"
    );
}

/// The sum of |x| over a network's variables in name order, as the trainer's rank checksum.
fn checksum(vs: &tch::nn::VarStore) -> f64 {
    let mut vars: Vec<_> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars.iter()
        .map(|(_, t)| t.abs().sum(Kind::Double).double_value(&[]))
        .sum()
}

/// DDP and FSDP over 2 real processes (`trainer launch`, Gloo on 127.0.0.1) start from
/// `model.init`: every rank's student at the start (after rank 0's broadcast and FSDP's
/// sharding) has the checksum of the student this process builds and initialises from the
/// same source (a bare DINO `.pth` of 3 channels, repeat-adapted to the run's 2), which a
/// student left at its own initialisation does not have.
#[test]
fn ddp_and_fsdp_ranks_all_start_from_model_init() {
    use trainer::train::step::Learner;
    let _rng = torch_rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let pth = dir.path().join("bare.pth");
    run_py_file(
        "pth_oracle.py",
        &["bare", pth.to_str().unwrap(), "3", "7", "float32"],
    );
    trainer::data::generate_synthetic(&trainer::data::SynthOptions {
        out: dir.path().join("data"),
        seed: 4,
        classes: 2,
        per_class: 5,
        size: 24,
        channels: 3,
        ..Default::default()
    })
    .unwrap();
    for (strategy, port) in [("ddp", "29851"), ("fsdp", "29853")] {
        let yaml = format!(
            "run:\n  name: {strategy}\n  output_dir: {out}\n  seed: 3\ndata:\n  dataset_dir: {data}\n  channel_names: [a, b, c]\n  channel_combinations: [\"02\"]\n  num_workers: 1\nmodel:\n  arch: vit_tiny\n  out_dim: 64\n  init:\n    from: {pth}\n    format: pth\ntrain:\n  epochs: 1\n  batch_size_per_gpu: 4\n  warmup_epochs: 0\n  precision: fp32\n  strategy: {strategy}\n  dist_timeout_seconds: 60\naugment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 1\n",
            out = dir.path().join("out").display(),
            data = dir.path().join("data/Training").display(),
            pth = pth.display(),
        );
        let path = dir.path().join(format!("{strategy}.yaml"));
        std::fs::write(&path, &yaml).unwrap();
        let cfg = Config::from_yaml(&yaml, "test.yaml").unwrap();
        let learner = Learner::from_config(&cfg, 2, Device::Cpu).unwrap();
        let fresh = checksum(&learner.nets.student_vs);
        apply(&cfg, &cfg.model.init, &learner.nets).unwrap();
        let want = checksum(&learner.nets.student_vs);
        assert!((fresh - want).abs() > 1e-3 * want, "{fresh} vs {want}");
        let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
            .args(["launch", "--nproc", "2", "--master-port", port, "--"])
            .args(["train", "--config", path.to_str().unwrap()])
            .args(["--threads", "1", "--max-steps", "1"])
            .env("OMP_NUM_THREADS", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{strategy}: {stderr}");
        let sums: Vec<(String, f64)> = stderr
            .lines()
            .filter_map(|l| {
                let (rank, rest) = l.split_once("student checksum at the start ")?;
                let value = rest.split_whitespace().next()?.parse().ok()?;
                Some((rank[..rank.find(']')? + 1].to_string(), value))
            })
            .collect();
        assert_eq!(sums.len(), 2, "{strategy}: {stderr}");
        assert_ne!(sums[0].0, sums[1].0, "{strategy}: one line per rank");
        for (rank, sum) in sums {
            assert!(
                (sum - want).abs() <= 1e-9 * want,
                "{strategy} {rank}: starts from checksum {sum}, model.init gives {want}"
            );
        }
    }
}
