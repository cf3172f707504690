//! `trainer data pack` end to end: pack, idempotent rerun, training from shards in
//! `shard_sequential` order with exact mid-epoch resume, and `trainer features` from the
//! shards identical to the tree's.
use super::util::{model_dir, ok, run, synth, tensor_digests, text, write_yaml};
use std::path::Path;

fn config(dir: &Path, data: &Path, name: &str, data_extra: &str) -> String {
    write_yaml(
        dir,
        name,
        &format!(
            "run:\n  name: {name}\n  output_dir: {out}\n  seed: 3\ndata:\n  dataset_dir: {data}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: [\"02\"]\n  num_workers: 2\n{data_extra}model:\n  name: m\n  arch: vit_tiny\n  out_dim: 128\naugment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 2\ntrain:\n  precision: fp32\n  num_gpus: 1\n  log_every: 1\n  epochs: 2\n  batch_size_per_gpu: 4\n  warmup_epochs: 1\n  lr: 0.05\ndownstream:\n  features:\n    resize_length: 32\n    batch_size_per_gpu: 4\n",
            out = dir.join("out").display(),
            data = data.display()
        ),
    )
}

#[test]
fn pack_then_train_shard_sequential_resume_and_features() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("data");
    synth(&data, 11, 2, 8);
    let tree = data.join("Training");
    let packed = d.join("packed");
    let folder_cfg = config(d, &tree, "folder", "");
    let pack = |extra: &[&str]| {
        let mut args = vec![
            "data",
            "pack",
            "--config",
            &folder_cfg,
            "--out",
            packed.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        run("trainer", &args)
    };
    let first = pack(&["--shard-samples", "3"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let summary = text(&first.stdout);
    assert!(
        summary.contains("packed 16 images into 6 shards") && summary.contains("6 shards written"),
        "{summary}"
    );
    assert!(text(&first.stderr).contains("images/s"));
    let again = pack(&["--shard-samples", "3"]);
    assert!(again.status.success());
    assert!(
        text(&again.stdout).contains("0 shards written, 6 verified and kept"),
        "{}",
        text(&again.stdout)
    );
    let other = pack(&["--shard-samples", "4"]);
    assert!(!other.status.success());
    assert!(
        text(&other.stderr).contains("other settings"),
        "{}",
        text(&other.stderr)
    );

    // shard_sequential on loose files is refused, naming the key.
    let bad = config(
        d,
        &tree,
        "bad",
        "  format: folder\n  order: shard_sequential\n",
    );
    let out = run("trainer", &["train", "--config", &bad]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("data.order"),
        "{}",
        text(&out.stderr)
    );

    // Training from shards, streaming order: a stop mid-epoch resumes bit for bit.
    let seq = "  order: shard_sequential\n  shuffle_buffer: 4\n";
    let straight = config(d, &packed, "straight", seq);
    ok(
        "trainer",
        &["train", "--config", &straight, "--threads", "1"],
    );
    let reference = tensor_digests(&model_dir(d, "straight").join("checkpoint.safetensors"));
    assert!(reference.len() > 100);
    let mid = config(d, &packed, "mid", seq);
    ok(
        "trainer",
        &[
            "train",
            "--config",
            &mid,
            "--threads",
            "1",
            "--max-steps",
            "2",
        ],
    );
    let resumed = run("trainer", &["train", "--config", &mid, "--threads", "1"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert!(text(&resumed.stderr).contains("resuming from"));
    assert_eq!(
        tensor_digests(&model_dir(d, "mid").join("checkpoint.safetensors")),
        reference
    );
    assert_eq!(
        std::fs::read_to_string(model_dir(d, "mid").join("log.txt")).unwrap(),
        std::fs::read_to_string(model_dir(d, "straight").join("log.txt")).unwrap()
    );

    // `trainer features` of one checkpoint: the shards give the tree's files, byte for byte.
    let ckpt = model_dir(d, "straight").join("checkpoint.safetensors");
    let shards_cfg = config(d, &packed, "fshards", "");
    for cfg in [&folder_cfg, &shards_cfg] {
        ok("trainer", &["mean-std", "--config", cfg]);
        ok(
            "trainer",
            &[
                "features",
                "--config",
                cfg,
                "--checkpoint",
                ckpt.to_str().unwrap(),
                "--threads",
                "1",
            ],
        );
    }
    let analyses = |name: &str| d.join("out").join(name).join("m_channel_APC_DAPI_analyses");
    let csv = std::fs::read_dir(analyses("folder").join("CLS_features"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with("_features.csv"))
        .expect("a features CSV");
    for f in [
        format!("CLS_features/{csv}"),
        "class_labels.csv".into(),
        "image_paths.csv".into(),
    ] {
        let a = std::fs::read(analyses("folder").join(&f)).unwrap();
        let b = std::fs::read(analyses("fshards").join(&f)).unwrap();
        assert!(!a.is_empty());
        assert_eq!(a, b, "{f}");
    }
    assert_eq!(
        std::fs::read(d.join("out/folder/mean_and_std_of_dataset.txt")).unwrap(),
        std::fs::read(d.join("out/fshards/mean_and_std_of_dataset.txt")).unwrap()
    );
    let paths = std::fs::read_to_string(analyses("fshards").join("image_paths.csv")).unwrap();
    assert!(paths.starts_with(tree.to_str().unwrap()), "{paths}");
}
