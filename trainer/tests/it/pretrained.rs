//! A timm folder as `--checkpoint` of `trainer features`, `evaluate` and `embed`
//! (`tests/py/pretrained_oracle.py`): features equal timm's own (`create_model("local-dir:…", pretrained=True)`
//! with the input config timm resolves from the folder) for DINOv2's ViT-S/14 at 3 channels,
//! a ViT-S/16 at 5 and the 3-channel model on 5 channels with the mean patch embedding;
//! `trainer embed` gives the stage's rows; no dataset mean/std is needed; a channel count
//! that does not fit is refused naming both.
use super::util::{max_abs_diff, run_py_file, torch_rng_lock};
use std::path::Path;
use tch::Tensor;
use trainer::analysis::profiles;
use trainer::config::Config;
use trainer::data::{generate_synthetic, SynthOptions};
use trainer::embed::{run, EmbedOptions, OnError};
use trainer::pipeline::stages::{
    run_evaluate, run_features, tag_of_checkpoint, FeaturesRun, Target,
};

fn config(dir: &Path, combination: &str, features_extra: &str) -> Config {
    Config::from_yaml(
        &format!(
            "run: {{name: p, output_dir: {out}, seed: 3}}\ndata: {{dataset_dir: {data}, channel_names: [a, b, c, d, e], channel_combinations: [\"{combination}\"], num_workers: 1}}\nmodel: {{arch: vit_tiny, patch_size: 16}}\ndownstream: {{features: {{batch_size_per_gpu: 4{features_extra}}}}}\n",
            out = dir.join(format!("out-{combination}")).display(),
            data = dir.join("data/Training").display(),
        ),
        "test",
    )
    .unwrap()
}

/// timm's features of the rows of `set`.
fn timm_features(dir: &Path, folder: &Path, paths: &[String], sel: &str, adapt: &str) -> Tensor {
    let list = dir.join("paths.txt");
    std::fs::write(&list, paths.join("\n")).unwrap();
    let out = dir.join("timm_features.safetensors");
    run_py_file(
        "pretrained_oracle.py",
        &[
            "features",
            folder.to_str().unwrap(),
            list.to_str().unwrap(),
            sel,
            adapt,
            out.to_str().unwrap(),
        ],
    );
    Tensor::read_safetensors(&out).unwrap().remove(0).1
}

fn setup(dir: &Path) {
    generate_synthetic(&SynthOptions {
        out: dir.join("data"),
        seed: 2,
        classes: 2,
        per_class: 6,
        size: 20,
        channels: 5,
        ..SynthOptions::default()
    })
    .unwrap();
    run_py_file("pretrained_oracle.py", &["models", dir.to_str().unwrap()]);
}

#[test]
fn timm_folder_features_equal_timms_and_embed_gives_the_same_rows() {
    let _rng = torch_rng_lock();
    tch::set_num_threads(2);
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let cases = [
        ("dinov2", "012", "[0, 1, 2]", "null", ""),
        ("vits16", "01234", "[0, 1, 2, 3, 4]", "null", ""),
        (
            "dinov2",
            "01234",
            "[0, 1, 2, 3, 4]",
            "\"mean\"",
            ", use_mean_patch_embedding: true",
        ),
    ];
    for (name, combination, sel, adapt, extra) in cases {
        let folder = dir.path().join(name);
        let cfg = config(dir.path(), combination, extra);
        let t = Target::new(&cfg, 0).unwrap();
        let tag = tag_of_checkpoint(&folder).unwrap();
        assert_eq!(tag, format!("model_{name}"));
        // No `trainer mean-std` ran: a timm folder normalises with its own mean/std.
        let rows = run_features(&t, &folder, &tag, None).unwrap();
        let stage = profiles::read(&t.files.profiles(&tag)).unwrap();
        assert!(
            matches!(rows, FeaturesRun::Wrote(n) if n >= 2),
            "{name}: {rows:?} held-out rows"
        );
        let theirs = timm_features(dir.path(), &folder, &stage.paths, sel, adapt);
        let diff = max_abs_diff(&stage.features, &theirs);
        assert!(
            diff < 1e-5,
            "{name} on {combination}: |ours - timm| = {diff}"
        );
        let apart = max_abs_diff(&stage.features.get(0), &stage.features.get(1));
        assert!(apart > 1e-3, "{name}: rows are not all alike ({apart})");
        if name == "vits16" {
            embed_gives_the_stage_rows(dir.path(), &folder, &stage);
            let report = run_evaluate(&t, &folder, &tag).unwrap();
            assert!(!report.knn.is_empty());
            assert_eq!(report.n_train + report.n_queries, 12);
            let sha = trainer::analysis::pretrained::checkpoint_sha256(&folder).unwrap();
            assert_eq!(report.provenance.checkpoint_sha256, sha);
            assert_eq!(sha.len(), 64);
        }
    }
}

/// `trainer embed --checkpoint FOLDER` on the training images: the features stage's rows.
fn embed_gives_the_stage_rows(dir: &Path, folder: &Path, stage: &profiles::Profiles) {
    let out = dir.join("embedded.parquet");
    let opts = EmbedOptions {
        checkpoint: folder.to_path_buf(),
        images: dir.join("data/Training").display().to_string(),
        screen: None,
        out: out.clone(),
        list: None,
        metadata: None,
        path_pattern: None,
        channels: None,
        on_error: OnError::Fail,
        batch_size: Some(4),
        device: tch::Device::Cpu,
        bf16: false,
        shard: None,
        merge_only: false,
        part_size: 5,
        readers: 1,
    };
    let s = run(&opts).unwrap();
    assert_eq!((s.images, s.errors, s.merged), (12, 0, Some((12, 0))));
    let table = profiles::read_streamed(&out).unwrap();
    let column = |name: &str| {
        let i = table.columns.iter().position(|c| c.name() == name).unwrap();
        match &table.data[i] {
            profiles::OwnedColumn::Strings(v) => v.clone(),
            profiles::OwnedColumn::Ints(_) => panic!("{name} is not a string column"),
        }
    };
    assert!(column("Metadata_Channels").iter().all(|c| c == "0+1+2+3+4"));
    let paths = column("Metadata_ImagePath");
    let embedded = Tensor::from_slice(&table.values).reshape([table.rows as i64, table.dim as i64]);
    for (r, p) in stage.paths.iter().enumerate() {
        let row = paths.iter().position(|q| q == p).unwrap();
        let diff = max_abs_diff(&embedded.get(row as i64), &stage.features.get(r as i64));
        assert!(
            diff < 1e-6,
            "{p}: embed differs from the features stage by {diff}"
        );
    }
    let channels = EmbedOptions {
        channels: Some(vec!["a".into()]),
        out: dir.join("subset.parquet"),
        ..opts
    };
    let err = format!("{:#}", run(&channels).err().unwrap());
    assert!(
        err.contains("--channels a") && err.contains("timm folder"),
        "{err}"
    );
}

#[test]
fn timm_folder_of_another_channel_count_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let folder = dir.path().join("dinov2");
    let cfg = config(dir.path(), "0134", "");
    let t = Target::new(&cfg, 0).unwrap();
    let err = run_features(&t, &folder, "model_dinov2", None)
        .err()
        .unwrap()
        .to_string();
    for part in [
        folder.to_str().unwrap(),
        "takes 3 input channels",
        "[a, b, d, e] has 4",
        "use_mean_patch_embedding",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    // `trainer embed` has no run config: an image of 5 channels for the 3-channel folder is
    // refused naming the image, the folder and both counts, not a data.channel_names.
    let opts = EmbedOptions {
        checkpoint: folder.clone(),
        images: dir.path().join("data/Training").display().to_string(),
        screen: None,
        out: dir.path().join("embedded.parquet"),
        list: None,
        metadata: None,
        path_pattern: None,
        channels: None,
        on_error: OnError::Fail,
        batch_size: Some(4),
        device: tch::Device::Cpu,
        bf16: false,
        shard: None,
        merge_only: false,
        part_size: 5,
        readers: 1,
    };
    let err = format!("{:#}", run(&opts).err().unwrap());
    for part in [
        ".tiff has 5 channels",
        &format!("the timm model {} takes 3 input channels", folder.display()),
        "each image must have exactly 3",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    assert!(!err.contains("data.channel_names"), "{err}");
}
