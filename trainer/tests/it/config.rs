//! Configuration: strictness, defaults, scDINO import.
use std::path::PathBuf;
use trainer::config::{scdino, ChannelCombination, Config, Precision};

fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn scdino_full_pipeline_imports_to_the_same_meaning() {
    let imp = scdino::import(&fixture("scdino_full_pipeline.yaml"), "full.yaml").unwrap();
    let c = &imp.config;
    assert!(imp.unmapped.is_empty(), "{:?}", imp.unmapped);
    assert_eq!(c.run.seed, 40);
    assert_eq!(c.data.channel_names, ["aTub", "BF", "DAPI", "Oct4", "PE"]);
    assert_eq!(
        c.channel_sets,
        vec![
            vec![0, 1, 2, 3, 4],
            vec![0],
            vec![1],
            vec![2],
            vec![3],
            vec![4]
        ]
    );
    assert_eq!(c.augment.global_crops_scale, (0.14, 1.0));
    assert_eq!(c.augment.local_crops_scale, (0.05, 0.14));
    assert_eq!(c.train.warmup_epochs, 5);
    assert_eq!(c.train.clip_grad, 3.0);
    assert_eq!(c.train.precision, Precision::Fp16);
    assert_eq!(c.train.checkpoint_every, 2);
    assert_eq!(c.downstream.knn.k, vec![5, 10, 50, 100, 200, 500]);
    assert_eq!(c.downstream.features.batch_size_per_gpu, 24);
    // The misspelled keys are mapped, and the user is told scDINO ignored them.
    assert!(imp.notes.iter().any(|n| n.contains("warump_epochs")));
    assert!(imp.notes.iter().any(|n| n.contains("techer_temp")));
    // An imported run holds out what scDINO held out, and is told so.
    assert_eq!(c.data.split, trainer::config::HeldOutSplit::Scdino);
    assert!(imp
        .notes
        .iter()
        .any(|n| n.starts_with("data.split: scdino")));
    // Our defaults are scDINO's yaml values: importing changes nothing else.
    let defaults = Config::from_yaml("data: {split: scdino}\n", "defaults").unwrap();
    assert_eq!(c.sections(), defaults.sections());
}

#[test]
fn scdino_aws_port_imports_and_reports_what_it_cannot_map() {
    let imp = scdino::import(&fixture("scdino_aws_pcluster.yaml"), "aws.yaml").unwrap();
    let c = &imp.config;
    assert_eq!(c.data.channel_names, ["aTub", "BF", "DAPI", "Oct4", "PE"]);
    assert_eq!(c.channel_sets, vec![vec![0, 1, 2, 3, 4]]);
    assert_eq!(
        c.data.channel_combinations,
        vec![ChannelCombination::Indices(vec![0, 1, 2, 3, 4])]
    );
    assert_eq!(c.train.warmup_epochs, 1);
    assert_eq!(c.train.epochs, 3);
    assert_eq!(c.data.num_workers, 16);
    // Absent crop scales: scDINO's argparse defaults are what the AWS runs used.
    assert_eq!(c.augment.global_crops_scale, (0.4, 1.0));
    assert_eq!(c.augment.local_crops_scale, (0.05, 0.4));
    let mut unmapped = imp.unmapped.clone();
    unmapped.sort();
    assert_eq!(unmapped.len(), 2, "{unmapped:?}");
    assert!(unmapped[0].starts_with("downstream_analyses.compute_cls_features.nnodes = 2"));
    assert!(unmapped[1].starts_with("train_scDINO.nnodes = 3"));
}

#[test]
fn import_reports_unknown_and_ill_typed_keys() {
    let yaml = "meta:\n  seed: 7\n  colour: blue\ntrain_scDINO:\n  epochs: many\n  hyperparameters:\n    arch: vit_huge\nextra_top: 1\n";
    let imp = scdino::import(yaml, "x.yaml").unwrap();
    let joined = imp.unmapped.join("\n");
    for key in [
        "meta.colour",
        "train_scDINO.epochs",
        "hyperparameters.arch",
        "extra_top",
    ] {
        assert!(joined.contains(key), "{key} not reported in:\n{joined}");
    }
    assert_eq!(imp.config.run.seed, 7);
}

/// scDINO's `sgd` and `lars` are not implemented: importing a run that used one is refused
/// (not turned into an AdamW run), naming the key and the value.
#[test]
fn import_refuses_an_optimizer_that_does_not_train_here() {
    let yaml =
        fixture("scdino_full_pipeline.yaml").replace("optimizer: \"adamw\"", "optimizer: \"sgd\"");
    assert!(yaml.contains("optimizer: \"sgd\""));
    let e = scdino::import(&yaml, "sgd.yaml").unwrap_err().to_string();
    assert!(
        e.contains("train.optimizer") && e.contains("sgd") && e.contains("only adamw"),
        "{e}"
    );
}

#[test]
fn imported_yaml_is_accepted_by_our_strict_loader() {
    for f in ["scdino_full_pipeline.yaml", "scdino_aws_pcluster.yaml"] {
        let imp = scdino::import(&fixture(f), f).unwrap();
        let again = Config::from_yaml(&imp.config.to_yaml(), "round trip").unwrap();
        assert_eq!(again, imp.config, "{f}");
    }
}

#[test]
fn scdino_yaml_fed_directly_is_rejected_with_key_and_line() {
    let err = Config::from_yaml(&fixture("scdino_full_pipeline.yaml"), "scdino.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("scdino.yaml"), "{err}");
    assert!(err.contains("unknown field `meta`"), "{err}");
    assert!(err.contains("line 3"), "{err}");
}

#[test]
fn shipped_configs_are_valid() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 3, "{n} configs in {}", dir.display());
    // configs/small-data.yaml is the measured recipe with DINOv2's four stabilisers.
    let c = Config::load(&dir.join("small-data.yaml")).unwrap();
    assert!(c.train.ibot.enabled() && c.train.koleo_weight > 0.0);
    assert_eq!(c.train.centering, trainer::config::Centering::SinkhornKnopp);
    assert_eq!(c.model.num_register_tokens, 4);
    // configs/tokens-small-data.yaml is that recipe for `tokens` with as many optimizer steps
    // as `bag` gets at 10 epochs (C steps per image): C × the epochs and the warm-up.
    let t = Config::load(&dir.join("tokens-small-data.yaml")).unwrap();
    let channels = t.data.channel_names.len();
    assert_eq!(t.model.channels, trainer::config::ChannelMode::Tokens);
    // With the channel tokens' DINO term, read with each channel's own pass (run 16).
    assert_eq!(
        t.downstream.features.tokens_pool,
        trainer::config::TokensPool::JointAndAlone
    );
    assert_eq!(t.train.channel_dino_weight, 1.0);
    // One channel-mixing block first, at the default channel scale, with half the steps on
    // one channel alone (runs 21 and 22).
    assert_eq!(
        (t.model.channel_mixing_blocks, t.model.channel_embed_std),
        (1, 0.02)
    );
    assert_eq!(t.train.single_channel_steps, 0.5);
    assert_eq!(
        (t.train.epochs, t.train.warmup_epochs),
        (10 * channels, channels * c.train.warmup_epochs)
    );
    assert_eq!(
        (
            t.train.lr,
            t.train.momentum_teacher,
            t.train.batch_size_per_gpu
        ),
        (
            c.train.lr,
            c.train.momentum_teacher,
            c.train.batch_size_per_gpu
        )
    );
    assert!(t.train.ibot.enabled() && t.train.koleo_weight == c.train.koleo_weight);
    assert_eq!(t.train.centering, c.train.centering);
    assert_eq!(t.model.num_register_tokens, c.model.num_register_tokens);
}

#[test]
fn train_device_takes_auto_cpu_cuda_and_names_a_bad_value() {
    use trainer::device::DeviceChoice;
    assert_eq!(
        Config::from_yaml("{}", "d.yaml").unwrap().train.device,
        DeviceChoice::Auto
    );
    for (text, want) in [("cpu", DeviceChoice::Cpu), ("cuda", DeviceChoice::Cuda)] {
        let cfg = Config::from_yaml(&format!("train:\n  device: {text}\n"), "d.yaml").unwrap();
        assert_eq!(cfg.train.device, want);
    }
    let err = Config::from_yaml("run:\n  seed: 1\ntrain:\n  device: gpu0\n", "d.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("d.yaml") && err.contains("line 4"), "{err}");
    assert!(err.contains("gpu0"), "{err}");
}

#[test]
fn object_store_cache_and_corrupt_keys_are_strict_and_checked() {
    let ok = Config::from_yaml(
        "data:\n  dataset_dir: s3://bkt/pbmc\n  object_store:\n    endpoint: http://127.0.0.1:9000\n    allow_http: true\n    max_concurrency: 8\n  cache:\n    dir: /local_scratch/c\n    max_bytes: 1000\n  on_corrupt: skip\n",
        "t",
    )
    .unwrap();
    assert_eq!(ok.data.object_store.max_concurrency, 8);
    assert_eq!(ok.data.cache.max_bytes, 1000);
    assert_eq!(ok.data.on_corrupt, trainer::config::OnCorrupt::Skip);
    // The defaults: no cache, fail on corrupt images, HTTPS only.
    let d = Config::from_yaml("", "t").unwrap();
    assert_eq!(d.data.cache.dir, None);
    assert_eq!(d.data.on_corrupt, trainer::config::OnCorrupt::Fail);
    assert!(!d.data.object_store.allow_http);
    for (yaml, needle) in [
        (
            "data:\n  object_store:\n    secret_access_key: x\n",
            "secret_access_key",
        ),
        ("data:\n  cache:\n    size: 3\n", "size"),
        ("data:\n  on_corrupt: ignore\n", "on_corrupt"),
        (
            "data:\n  object_store:\n    endpoint: http://h:1\n",
            "allow_http",
        ),
        (
            "data:\n  object_store:\n    endpoint: h:1\n",
            "data.object_store.endpoint",
        ),
        (
            "data:\n  object_store:\n    max_concurrency: 0\n",
            "data.object_store.max_concurrency",
        ),
        (
            "data:\n  object_store:\n    shard_chunk_bytes: 0\n",
            "data.object_store.shard_chunk_bytes",
        ),
        // The section's former name names the new one.
        (
            "data:\n  s3:\n    max_concurrency: 8\n",
            "`data.s3`: renamed to `data.object_store`",
        ),
        ("data:\n  dataset_dir: s3:///x\n", "bucket"),
        ("data:\n  dataset_dir: hdfs://b/x\n", "s3://"),
    ] {
        let e = Config::from_yaml(yaml, "t").unwrap_err().to_string();
        assert!(e.contains(needle), "{yaml}: {e}");
    }
}

/// `data.order: sites` is a screen's order: accepted with `data.screen`, refused without it
/// (naming the key and the alternatives), and refused with `bag`, whose items are channels.
#[test]
fn the_sites_order_needs_a_screen_and_no_bag() {
    let screen = "data:\n  dataset_dir: ld.csv\n  order: sites\n  screen:\n    objects: o.csv\n";
    let ok = Config::from_yaml(screen, "t").unwrap();
    assert_eq!(ok.data.order, trainer::config::SampleOrder::Sites);
    let e = Config::from_yaml("data:\n  order: sites\n", "t")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data.order") && e.contains("data.screen") && e.contains("exact"),
        "{e}"
    );
    let e = Config::from_yaml(&format!("{screen}model:\n  channels: bag\n"), "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.channels") && e.contains("sites"), "{e}");
}

/// `data.screen.cell_channels: own` needs CHAMMI's layout, an exact order and a channel-
/// adaptive model; each refusal names the key to change.
#[test]
fn own_cell_channels_need_chammi_an_exact_order_and_bag_or_tokens() {
    let own = |layout: &str, extra: &str, mode: &str| {
        Config::from_yaml(
            &format!(
                "data:\n  dataset_dir: t.csv\n{extra}  screen:\n    layout: {layout}\n    \
                 objects: o.csv\n    cell_channels: own\nmodel:\n  channels: {mode}\n"
            )
            .replace(
                "    objects: o.csv\n",
                if layout == "chammi" {
                    ""
                } else {
                    "    objects: o.csv\n"
                },
            ),
            "t",
        )
        .map_err(|e| e.to_string())
    };
    for mode in ["bag", "tokens"] {
        let cfg = own("chammi", "", mode).unwrap();
        let screen = cfg.data.screen.as_ref().unwrap();
        assert_eq!(screen.cell_channels, trainer::config::CellChannels::Own);
    }
    let e = own("chammi", "", "fixed").unwrap_err();
    assert!(
        e.contains("model.channels") && e.contains("bag") && e.contains("tokens"),
        "{e}"
    );
    let e = own("load_data", "", "tokens").unwrap_err();
    assert!(
        e.contains("data.screen.layout") && e.contains("chammi"),
        "{e}"
    );
    let e = own("chammi", "  order: sites\n", "tokens").unwrap_err();
    assert!(e.contains("data.order") && e.contains("exact"), "{e}");
}
