//! `model.channels: bag | tokens`: one model trained on every channel serves every channel
//! combination, and the inputs that cannot work are refused with what and why.
use std::path::Path;
use trainer::analysis::features;
use trainer::config::Config;
use trainer::data::mean_std::MeanStd;
use trainer::data::{generate_synthetic, SynthOptions};
use trainer::layout::RunLayout;
use trainer::train::run::{train, TrainError, TrainOptions, TrainOutcome};

fn data(dir: &Path) {
    generate_synthetic(&SynthOptions {
        out: dir.join("data"),
        seed: 4,
        classes: 3,
        per_class: 10,
        size: 32,
        channels: 3,
        ..SynthOptions::default()
    })
    .unwrap();
}

/// The lock on libtorch's generator (these tests train), 2 threads, and a folder holding
/// [`data`].
fn setup() -> (std::sync::MutexGuard<'static, ()>, tempfile::TempDir) {
    let rng = super::util::torch_rng_lock();
    tch::set_num_threads(2);
    let dir = tempfile::tempdir().unwrap();
    data(dir.path());
    (rng, dir)
}

fn config(dir: &Path, name: &str, mode: &str, names: &str, combinations: &str) -> Config {
    config_with(dir, name, mode, names, combinations, "")
}

/// [`config`] with `features` added to `downstream.features` (e.g. `, missing_channels: zeros`).
fn config_with(
    dir: &Path,
    name: &str,
    mode: &str,
    names: &str,
    combinations: &str,
    features: &str,
) -> Config {
    Config::from_yaml(
        &config_yaml(dir, name, mode, names, combinations, features, ""),
        "test",
    )
    .unwrap()
}

/// The YAML of [`config_with`], with `downstream` keys added after `features` (e.g.
/// `, attention: {image_size: 32}`).
fn config_yaml(
    dir: &Path,
    name: &str,
    mode: &str,
    names: &str,
    combinations: &str,
    features: &str,
    downstream: &str,
) -> String {
    format!(
        "run: {{name: {name}, output_dir: {out}, seed: 2}}\ndata: {{dataset_dir: {data}, channel_names: [{names}], channel_combinations: [{combinations}], num_workers: 1}}\nmodel: {{name: m, arch: vit_tiny, patch_size: 8, out_dim: 64, channels: {mode}}}\ntrain: {{epochs: 1, batch_size_per_gpu: 4, precision: fp32, warmup_epochs: 0, lr: 0.01}}\naugment: {{global_crop_size: 16, local_crop_size: 8, local_crops_number: 1}}\ndownstream: {{features: {{resize_length: 16{features}}}{downstream}}}\n",
        out = dir.join("out").display(),
        data = dir.join("data/Training").display(),
    )
}

/// Trains once (the first combination's call trains the one model on all channels, the other
/// combinations find it done), then embeds every combination from that checkpoint: `tokens`
/// gives D features whatever the combination, `bag` k·D (D with `bag_pool: mean`, which every
/// analysis then reads), every row of unit length, and a single channel or a pair (never seen
/// as a whole in training) gives features of its own.
#[test]
fn one_adaptive_model_trains_once_and_embeds_every_combination() {
    let (_rng, dir) = setup();
    for mode in ["tokens", "bag"] {
        let cfg = config(dir.path(), mode, mode, "a, b, c", "\"012\", \"0\", \"12\"");
        assert_eq!(
            train(&cfg, &TrainOptions::default()).unwrap(),
            TrainOutcome::Finished
        );
        let layout = RunLayout::new(&cfg);
        let model = layout.model(&cfg, &[0, 1, 2]);
        assert!(model
            .dir()
            .ends_with(format!("scDINO_ViTs/m_{mode}_channel_a_b_c")));
        let ck = model.latest_checkpoint();
        let before = std::fs::read(&ck).unwrap();
        for combination in [1, 2] {
            let again = TrainOptions {
                combination,
                ..TrainOptions::default()
            };
            assert_eq!(train(&cfg, &again).unwrap(), TrainOutcome::Finished);
            assert_eq!(
                layout.model(&cfg, &cfg.channel_sets[combination]).dir(),
                model.dir()
            );
        }
        assert_eq!(std::fs::read(&ck).unwrap(), before, "{mode}: trained twice");
        let ms = MeanStd::read(&layout.mean_std()).unwrap();
        let mut sets = Vec::new();
        for (combination, k) in [(0usize, 3i64), (1, 1), (2, 2)] {
            let set = features::extract(&cfg, combination, &ck, &ms).unwrap();
            let dim = if mode == "bag" { 192 * k } else { 192 };
            assert_eq!(
                set.features.size()[1],
                dim,
                "{mode} combination {combination}"
            );
            let norms = set.features.norm_scalaropt_dim(2.0, [1], false);
            assert!(
                (norms - 1.0).abs().max().double_value(&[]) < 1e-5,
                "{mode}: rows are not unit length"
            );
            let analyses = layout.model(&cfg, &cfg.channel_sets[combination]);
            assert!(analyses.analyses().ends_with(format!(
                "m_{mode}_channel_{}_analyses",
                ["a_b_c", "a", "b_c"][combination]
            )));
            sets.push(set.features);
        }
        if mode == "tokens" {
            assert!((&sets[0] - &sets[1]).abs().max().double_value(&[]) > 1e-3);
            // `downstream.features.tokens_pool: cls_and_channels`: (k+1)·D, the CLS part
            // being the `cls` feature (each part was normalised, then the row); the channel
            // parts against PyTorch: model.rs `channel_adaptive_backbones_match_pytorch`.
            let pooled = config_with(
                dir.path(),
                mode,
                mode,
                "a, b, c",
                "\"012\", \"0\", \"12\"",
                ", tokens_pool: cls_and_channels",
            );
            let mut pooled_sets = Vec::new();
            for (combination, k) in [(0usize, 3i64), (1, 1), (2, 2)] {
                let set = features::extract(&pooled, combination, &ck, &ms).unwrap();
                pooled_sets.push(set.features.copy());
                assert_eq!(set.features.size()[1], 192 * (k + 1));
                let cls = set.features.narrow(1, 0, 192) * ((k + 1) as f64).sqrt();
                let diff = (cls - &sets[combination]).abs().max().double_value(&[]);
                assert!(diff < 1e-5, "combination {combination}: {diff}");
                for c in 1..=k {
                    let part = set.features.narrow(1, c * 192, 192);
                    let norm =
                        part.norm().double_value(&[]) / (set.features.size()[0] as f64).sqrt();
                    assert!(
                        (norm - 1.0 / ((k + 1) as f64).sqrt()).abs() < 1e-5,
                        "{norm}"
                    );
                    assert!(
                        (&part - set.features.narrow(1, 0, 192))
                            .abs()
                            .max()
                            .double_value(&[])
                            > 1e-3
                    );
                }
            }
            // `tokens_pool: joint_and_alone`: the joint view is the combination's
            // cls_and_channels feature, channel a's own view in "a+b+c" is the feature of "a"
            // alone, a single channel's feature is its cls_and_channels one; the own views of
            // "b+c" are not the joint pass's channel parts (another pass). Against PyTorch:
            // model.rs `channel_adaptive_backbones_match_pytorch`.
            let joint_alone = config_with(
                dir.path(),
                mode,
                mode,
                "a, b, c",
                "\"012\", \"0\", \"12\"",
                ", tokens_pool: joint_and_alone",
            );
            let max_diff = |a: &tch::Tensor, b: &tch::Tensor| (a - b).abs().max().double_value(&[]);
            for (combination, k) in [(0usize, 3i64), (1, 1), (2, 2)] {
                let set = features::extract(&joint_alone, combination, &ck, &ms).unwrap();
                let f = &set.features;
                if k == 1 {
                    assert_eq!(f.size()[1], 192 * 2);
                    assert!(max_diff(f, &pooled_sets[combination]) < 1e-6);
                    continue;
                }
                assert_eq!(f.size()[1], 192 * (3 * k + 1));
                let views = (k + 1) as f64;
                let joint = f.narrow(1, 0, 192 * (k + 1)) * views.sqrt();
                let d = max_diff(&joint, &pooled_sets[combination]);
                assert!(d < 1e-5, "combination {combination}: joint view {d}");
                for c in 0..k {
                    let own = f.narrow(1, 192 * (k + 1 + 2 * c), 2 * 192) * views.sqrt();
                    let norms = own.norm_scalaropt_dim(2.0, [1], false);
                    assert!((norms - 1.0).abs().max().double_value(&[]) < 1e-5);
                    if combination == 0 && c == 0 {
                        let d = max_diff(&own, &pooled_sets[1]);
                        assert!(d < 1e-5, "a's own view against \"a\" alone: {d}");
                    }
                    // The channel's part in its own pass against its part in the joint pass,
                    // both at unit length.
                    let own_part = own.narrow(1, 192, 192) * 2f64.sqrt();
                    let joint_part = joint.narrow(1, 192 * (1 + c), 192) * views.sqrt();
                    assert!(max_diff(&own_part, &joint_part) > 1e-3);
                }
            }
        } else {
            // BoC: the single-channel part of the concatenation is that channel's feature.
            let a_part = sets[0].narrow(1, 0, 192) * 3f64.sqrt();
            assert!((a_part - &sets[1]).abs().max().double_value(&[]) < 1e-4);
            // `downstream.features.bag_pool: mean`: the features stage writes, as the
            // combination's features, the normalised mean of the channels' own features (D,
            // not k·D), which the all-channel concatenation holds part by part (so "b+c"'s
            // file is checked against another extraction); the kNN and evaluate stages read
            // those.
            use trainer::pipeline::stages::{
                run_evaluate, run_features, run_knn, tag_of_checkpoint, Target,
            };
            let pooled = config_with(
                dir.path(),
                mode,
                mode,
                "a, b, c",
                "\"012\", \"0\", \"12\"",
                ", bag_pool: mean",
            );
            let tag = tag_of_checkpoint(&ck).unwrap();
            for (combination, parts) in [(0usize, vec![0i64, 1, 2]), (2, vec![1, 2])] {
                let concat_target = Target::new(&cfg, combination).unwrap();
                run_features(&concat_target, &ck, &tag, None).unwrap();
                let concat = features::read_bundle(&concat_target.files.bundle(&tag)).unwrap();
                assert_eq!(concat.features.size()[1], 192 * parts.len() as i64);
                let target = Target::new(&pooled, combination).unwrap();
                assert_eq!(target.files.dir(), concat_target.files.dir());
                run_features(&target, &ck, &tag, None).unwrap();
                let files = &target.files;
                let mean = features::read_bundle(&files.bundle(&tag)).unwrap();
                assert_eq!(mean.labels, concat.labels);
                assert_eq!(mean.paths, concat.paths);
                assert_eq!(mean.features.size(), [concat.features.size()[0], 192]);
                let sum = parts
                    .iter()
                    .map(|&c| sets[0].narrow(1, c * 192, 192))
                    .reduce(|x, y| x + y)
                    .unwrap();
                let expected = &sum / sum.norm_scalaropt_dim(2.0, [1], true);
                let diff = (&mean.features - expected).abs().max().double_value(&[]);
                assert!(diff < 1e-5, "combination {combination}: {diff}");
                let csv = std::fs::read_to_string(files.features_csv(&tag)).unwrap();
                assert_eq!(csv.lines().count(), mean.labels.len());
                assert_eq!(csv.lines().next().unwrap().split(',').count(), 192);
                // The checkpoint tags of CLS_features/ stay the checkpoints'.
                assert_eq!(target.feature_tags(), std::slice::from_ref(&tag));
                let knn = run_knn(&target, &tag).unwrap();
                assert_eq!((knn.dim, knn.n_samples), (192, mean.labels.len()));
                // evaluate embeds its own training images the same way, and takes the
                // held-out queries from the features stage.
                run_evaluate(&target, &ck, &tag).unwrap();
                let evaluated = |side: &str| {
                    let path = files
                        .evaluation_dir()
                        .join(format!("{tag}_{side}_features.safetensors"));
                    features::read_bundle(&path).unwrap().features
                };
                let (train_rows, queries) = (evaluated("train"), evaluated("queries"));
                assert_eq!(train_rows.size()[1], 192);
                assert_eq!(queries.size(), mean.features.size());
                assert!((&queries - &mean.features).abs().max().double_value(&[]) < 1e-6);
            }
        }
    }
}

/// A combination naming a channel the checkpoint never saw is an error naming the channel and
/// the checkpoint; a `fixed` checkpoint asked for another combination says which channels it
/// takes; a checkpoint of one mode read as another is refused with both.
#[test]
fn checkpoints_refuse_what_they_cannot_embed() {
    let (_rng, dir) = setup();
    let cfg = config(dir.path(), "r", "tokens", "a, b, c", "\"012\"");
    train(&cfg, &TrainOptions::default()).unwrap();
    let layout = RunLayout::new(&cfg);
    let ck = layout.model(&cfg, &[0, 1, 2]).latest_checkpoint();
    let ms = MeanStd::read(&layout.mean_std()).unwrap();
    let renamed = config(dir.path(), "r", "tokens", "a, b, x", "\"02\"");
    let e = features::extract(&renamed, 0, &ck, &ms)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("channel x was never seen"), "{e}");
    assert!(e.contains(&ck.display().to_string()), "{e}");
    assert!(e.contains("trained on a, b, c"), "{e}");
    let as_bag = config(dir.path(), "r", "bag", "a, b, c", "\"012\"");
    let e = features::extract(&as_bag, 0, &ck, &ms)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("was trained with model.channels: tokens, the config says bag"),
        "{e}"
    );

    let fixed = config(dir.path(), "f", "fixed", "a, b, c", "\"01\", \"0\"");
    train(&fixed, &TrainOptions::default()).unwrap();
    let fixed_ck = RunLayout::new(&fixed)
        .model(&fixed, &[0, 1])
        .latest_checkpoint();
    let fixed_ms = MeanStd::read(&RunLayout::new(&fixed).mean_std()).unwrap();
    let e = features::extract(&fixed, 1, &fixed_ck, &fixed_ms)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("is a model.channels: fixed model trained on [a, b]; it takes exactly those channels, not [a]"),
        "{e}"
    );
    assert!(e.contains("missing_channels: zeros"), "{e}");

    // `missing_channels: zeros`: the [a, b] model embeds [a] (or [b]) as it embeds the image
    // with the other channel zeroed after normalisation.
    use tch::{Device, Kind, Tensor};
    use trainer::config::CheckpointKey;
    use trainer::model::backbone::BackboneWeights;
    let zeros = config_with(
        dir.path(),
        "f",
        "fixed",
        "a, b, c",
        "\"01\", \"0\"",
        ", missing_channels: zeros",
    );
    let w = BackboneWeights::load(&fixed_ck, CheckpointKey::Teacher).unwrap();
    let (_vs, both) = features::load_embedder(&fixed, &w, &[0, 1], Device::Cpu).unwrap();
    let x = Tensor::randn([3, 2, 16, 16], (Kind::Float, Device::Cpu));
    for (kept, dropped) in [(0i64, 1i64), (1, 0)] {
        let (_vs, one) =
            features::load_embedder(&zeros, &w, &[kept as usize], Device::Cpu).unwrap();
        let filled = x.copy();
        let _ = filled.narrow(1, dropped, 1).zero_();
        let diff = (one.embed(&x.narrow(1, kept, 1)) - both.embed(&filled))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-6, "channel {kept}: {diff}");
    }
    let set = features::extract(&zeros, 1, &fixed_ck, &fixed_ms).unwrap();
    assert_eq!(set.features.size()[1], 192);
    // A channel the model never had is still refused, by name.
    let other = config_with(
        dir.path(),
        "f",
        "fixed",
        "a, b, c",
        "\"01\", \"2\"",
        ", missing_channels: zeros",
    );
    let e = features::extract(&other, 1, &fixed_ck, &fixed_ms)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("channel c was never seen"), "{e}");
}

/// `train.teacher_channels: all` reaches the run's steps: the same seed and data trained with
/// the teacher on every channel ends at other weights than with the teacher on the step's
/// subset (the student's draws are the same), and both checkpoints embed every combination.
#[test]
fn an_all_channel_teacher_changes_what_tokens_trains() {
    let (_rng, dir) = setup();
    let weights = |teacher: &str| {
        let cfg = config(dir.path(), teacher, "tokens", "a, b, c", "\"012\", \"1\"");
        let mut sections = cfg.sections();
        sections.train.teacher_channels = match teacher {
            "all" => trainer::config::TeacherChannels::All,
            _ => trainer::config::TeacherChannels::Step,
        };
        let cfg = Config::from_sections(sections, "test").unwrap();
        assert_eq!(
            train(&cfg, &TrainOptions::default()).unwrap(),
            TrainOutcome::Finished
        );
        let layout = RunLayout::new(&cfg);
        let ck = layout.model(&cfg, &[0, 1, 2]).latest_checkpoint();
        let ms = MeanStd::read(&layout.mean_std()).unwrap();
        for combination in [0, 1] {
            let set = features::extract(&cfg, combination, &ck, &ms).unwrap();
            assert_eq!(set.features.size()[1], 192, "{teacher} {combination}");
        }
        let t: std::collections::HashMap<String, tch::Tensor> = tch::Tensor::read_safetensors(&ck)
            .unwrap()
            .into_iter()
            .collect();
        t
    };
    let (step, all) = (weights("step"), weights("all"));
    let name = step
        .keys()
        .find(|k| k.contains("blocks.0.attn.qkv.weight") && k.contains("student"))
        .unwrap_or_else(|| {
            panic!(
                "no student block 0 qkv in {:?}",
                step.keys().take(8).collect::<Vec<_>>()
            )
        })
        .clone();
    let diff = (&step[&name] - &all[&name]).abs().max().double_value(&[]);
    assert!(
        diff > 1e-6,
        "{name}: the teacher's channels changed nothing ({diff})"
    );
}

/// A two-epoch `tokens` run on a, b, c with `edit` applied to its `train` section, stopped
/// after each of `stops` steps and then finished: its last checkpoint's student, teacher and
/// centre tensors by name.
fn train_tokens_run(
    dir: &Path,
    name: &str,
    stops: &[usize],
    edit: impl FnOnce(&mut trainer::config::TrainSection),
) -> std::collections::HashMap<String, tch::Tensor> {
    let cfg = config(dir, name, "tokens", "a, b, c", "\"012\"");
    let mut sections = cfg.sections();
    edit(&mut sections.train);
    sections.train.epochs = 2;
    let cfg = Config::from_sections(sections, "test").unwrap();
    for &step in stops {
        let opts = TrainOptions {
            max_steps: Some(step),
            ..TrainOptions::default()
        };
        assert_eq!(train(&cfg, &opts).unwrap(), TrainOutcome::StepLimit);
    }
    assert_eq!(
        train(&cfg, &TrainOptions::default()).unwrap(),
        TrainOutcome::Finished
    );
    let ck = RunLayout::new(&cfg)
        .model(&cfg, &[0, 1, 2])
        .latest_checkpoint();
    tch::Tensor::read_safetensors(&ck)
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.contains("student") || k.contains("teacher") || k.contains("center"))
        .collect()
}

/// `resumed` holds `straight`'s tensors bit for bit, and the student's first block differs
/// from the run `without` what changed (`what`).
fn assert_resumed_and_changed(
    straight: &std::collections::HashMap<String, tch::Tensor>,
    resumed: &std::collections::HashMap<String, tch::Tensor>,
    without: &std::collections::HashMap<String, tch::Tensor>,
    what: &str,
) {
    assert_eq!(straight.len(), resumed.len());
    for (name, t) in straight {
        assert!(t.equal(&resumed[name]), "{name} differs after the resume");
    }
    let qkv = straight
        .keys()
        .find(|k| k.contains("blocks.0.attn.qkv.weight") && k.contains("student"))
        .unwrap();
    let diff = (&straight[qkv] - &without[qkv])
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff > 1e-6, "{qkv}: {what} changed nothing ({diff})");
}

/// `train.channel_dino_weight` reaches a whole run: its EMA centre is checkpointed (moved off
/// zero), a run stopped mid-epoch and resumed ends at the straight run's weights and centres
/// bit for bit, and the same run without the term ends elsewhere.
#[test]
fn the_channel_dino_term_trains_checkpoints_and_resumes() {
    let (_rng, dir) = setup();
    let run = |name: &str, weight: f64, stops: &[usize]| {
        train_tokens_run(dir.path(), name, stops, |train| {
            train.channel_dino_weight = weight
        })
    };
    let straight = run("straight", 1.0, &[]);
    let resumed = run("resumed", 1.0, &[3]);
    let without = run("without", 0.0, &[]);
    let centre = straight
        .iter()
        .find(|(k, _)| k.ends_with("channel_dino_loss.center"))
        .unwrap_or_else(|| panic!("no channel DINO centre in {:?}", straight.keys()));
    assert!(
        centre.1.abs().max().double_value(&[]) > 1e-4,
        "{}",
        centre.0
    );
    assert!(!without.keys().any(|k| k.contains("channel_dino")));
    assert_resumed_and_changed(&straight, &resumed, &without, "the term");
}

/// `train.single_channel_steps`: a step the draw sends alone trains on that one channel (named
/// by its model position when the batch's cells hold only some), every other step on what the
/// sampler — hierarchical or diverse — draws without the key; a whole run with it resumes to
/// the straight run's weights bit for bit and ends elsewhere than the run without it.
#[test]
fn single_channel_steps_train_one_channel_alone_and_resume() {
    use trainer::train::channels::{single_channel_step, step_channels};
    use trainer::train::step::Learner;
    let (_rng, dir) = setup();
    for sampling in ["hierarchical", "diverse"] {
        let text = |fraction: f64| {
            format!("data:\n  channel_names: [a, b, c]\n  channel_combinations: [\"012\"]\nmodel:\n  arch: vit_tiny\n  patch_size: 4\n  out_dim: 64\n  channels: tokens\n  dichavit:\n    sampling: {sampling}\ntrain:\n  precision: fp32\n  single_channel_steps: {fraction}\n")
        };
        let cfg = Config::from_yaml(&text(0.5), "t").unwrap();
        let plain = Config::from_yaml(&text(0.0), "t").unwrap();
        let learner = Learner::from_config(&cfg, 3, tch::Device::Cpu).unwrap();
        let backbone = &learner.nets.student.backbone;
        let (mut alone, mut drawn) = (0, 0);
        for it in 0..60 {
            for among in [None, Some(&[0usize, 2][..])] {
                let n = among.map_or(3, <[usize]>::len);
                let got = step_channels(&cfg, it, 3, backbone, among);
                match single_channel_step(cfg.run.seed, it, n, 0.5) {
                    Some(c) => {
                        let model = among.map_or(c, |set| set[c as usize] as i64);
                        assert_eq!(got, Some(vec![model]), "{sampling} {it} {among:?}");
                        alone += 1;
                    }
                    None => {
                        assert_eq!(got, step_channels(&plain, it, 3, backbone, among));
                        drawn += 1;
                    }
                }
            }
        }
        assert!(
            alone > 20 && drawn > 20,
            "{sampling}: {alone} alone, {drawn} drawn"
        );
    }
    let run = |name: &str, fraction: f64, stops: &[usize]| {
        train_tokens_run(dir.path(), name, stops, |train| {
            train.single_channel_steps = fraction
        })
    };
    let straight = run("alone_straight", 0.5, &[]);
    let resumed = run("alone_resumed", 0.5, &[3]);
    let without = run("alone_without", 0.0, &[]);
    assert_resumed_and_changed(&straight, &resumed, &without, "the single-channel steps");
}

/// A checkpoint of one mode found where a run of another resumes (a folder copied or renamed
/// by hand) is refused, naming both.
#[test]
fn resume_refuses_another_channel_mode() {
    let (_rng, dir) = setup();
    let tokens = config(dir.path(), "s", "tokens", "a, b, c", "\"012\"");
    train(&tokens, &TrainOptions::default()).unwrap();
    let bag = config(dir.path(), "s", "bag", "a, b, c", "\"012\"");
    let from = RunLayout::new(&tokens)
        .model(&tokens, &[0, 1, 2])
        .dir()
        .to_path_buf();
    let to = RunLayout::new(&bag)
        .model(&bag, &[0, 1, 2])
        .dir()
        .to_path_buf();
    std::fs::rename(&from, &to).unwrap();
    let e = train(&bag, &TrainOptions::default()).err().unwrap();
    let text = e.to_string();
    assert!(matches!(e, TrainError::Resume { .. }), "{text}");
    assert!(
        text.contains("\"model_channels\":\"tokens\"")
            && text.contains("\"model_channels\":\"bag\""),
        "{text}"
    );
}

/// A `tokens` checkpoint trained with `model.channel_separate_blocks: 2` and
/// `model.channel_mixing_blocks: 1` records both in its fingerprint, so a run of the same
/// name without either mask refuses to resume from it, naming the key (the weights would
/// compute something else without the mask).
#[test]
fn resume_refuses_other_channel_separate_and_mixing_blocks() {
    let (_rng, dir) = setup();
    let blocks = |separate: usize, mixing: usize| {
        let cfg = config(dir.path(), "s", "tokens", "a, b, c", "\"012\"");
        let mut sections = cfg.sections();
        sections.model.channel_separate_blocks = separate;
        sections.model.channel_mixing_blocks = mixing;
        sections.model.channel_embed_std = 1.0;
        Config::from_sections(sections, "test").unwrap()
    };
    let cfg = blocks(2, 1);
    train(&cfg, &TrainOptions::default()).unwrap();
    // What export and `model.init: {format: run}` read back from the checkpoint.
    let ck = RunLayout::new(&cfg)
        .model(&cfg, &[0, 1, 2])
        .latest_checkpoint();
    let meta = trainer::checkpoint::read_meta(&ck).unwrap();
    let record = trainer::export::ModelRecord::from_fingerprint(&meta.fingerprint, &ck).unwrap();
    let vit = record.vit_config();
    assert_eq!(
        (vit.channel_separate_blocks, vit.channel_mixing_blocks),
        (2, 1)
    );
    let described = record.describe();
    assert!(
        described.contains("channel_separate_blocks: 2")
            && described.contains("channel_mixing_blocks: 1"),
        "{described}"
    );
    for (other, key) in [
        (blocks(0, 1), "\"channel_separate_blocks\":2"),
        (blocks(2, 0), "\"channel_mixing_blocks\":1"),
    ] {
        let e = train(&other, &TrainOptions::default()).err().unwrap();
        let text = e.to_string();
        assert!(matches!(e, TrainError::Resume { .. }), "{text}");
        assert!(text.contains(key), "{text}");
    }
}

/// `trainer pipeline` with one `tokens` model: trained once, every combination analysed from
/// its checkpoint, and the run's combination table lists each combination with its kNN,
/// probe top-1 and macro-F1 (read back from the JSON and present in the HTML).
#[test]
fn the_pipeline_analyses_every_combination_and_tabulates_them() {
    use trainer::pipeline::{run_pipeline, PipelineOptions, PipelineOutcome, Stage};
    let (_rng, dir) = setup();
    let cfg = config(
        dir.path(),
        "p",
        "tokens",
        "a, b, c",
        "\"012\", \"1\", \"02\"",
    );
    let outcome = run_pipeline(&cfg, &PipelineOptions::default()).unwrap();
    let PipelineOutcome::Finished(runs) = outcome else {
        panic!("the pipeline stopped early");
    };
    let trained = runs
        .iter()
        .filter(|r| r.stage == Stage::Train && r.ran)
        .count();
    assert_eq!(trained, 1, "one training for three combinations");
    let layout = RunLayout::new(&cfg);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(layout.combinations_json(&cfg)).unwrap())
            .unwrap();
    assert_eq!(json["model_channels"], "tokens");
    let rows = json["rows"].as_array().unwrap();
    let combos: Vec<&str> = rows
        .iter()
        .map(|r| r["combination"].as_str().unwrap())
        .collect();
    assert_eq!(combos, ["a+b+c", "b", "a+c"]);
    for r in rows {
        assert_eq!(r["tag"], "epoch0");
        let top1 = r["probe_top1_percent"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&top1), "{r}");
        assert!(!r["knn_top1_percent"].as_array().unwrap().is_empty(), "{r}");
    }
    let html = std::fs::read_to_string(layout.combinations_html(&cfg)).unwrap();
    for c in combos {
        assert!(
            html.contains(&format!("<td>{c}</td>")),
            "{c} missing:\n{html}"
        );
    }
    assert!(html.contains("one checkpoint for every combination"));
}

/// `downstream.attention.beside`: a `tokens` run's report shows, under each of its images,
/// the per-channel maps a `bag` run of the same data and seed drew of the same image (the
/// very PNGs, embedded), says so where the other run has no such combination, and names the
/// file when a listed config cannot be read.
#[test]
fn the_report_shows_another_runs_attention_maps_beside() {
    use trainer::pipeline::stages::report::write_report;
    use trainer::pipeline::stages::Target;
    use trainer::pipeline::{run_pipeline, PipelineOptions};
    let (_rng, dir) = setup();
    let small = ", attention: {image_size: 32, images_per_class: 2}";
    let bag_yaml = config_yaml(
        dir.path(),
        "pb",
        "bag",
        "a, b, c",
        "\"012\", \"1\"",
        "",
        small,
    );
    let bag_path = dir.path().join("bag run.yaml");
    std::fs::write(&bag_path, &bag_yaml).unwrap();
    let bag = Config::load(&bag_path).unwrap();
    run_pipeline(&bag, &PipelineOptions::default()).unwrap();
    let tokens_yaml = config_yaml(
        dir.path(),
        "pt",
        "tokens",
        "a, b, c",
        "\"012\", \"02\"",
        "",
        &format!(
            ", attention: {{image_size: 32, images_per_class: 2, beside: ['{}']}}",
            bag_path.display()
        ),
    );
    let tokens = Config::from_yaml(&tokens_yaml, "tokens").unwrap();
    run_pipeline(&tokens, &PipelineOptions::default()).unwrap();

    let t = Target::new(&tokens, 0).unwrap();
    let html = std::fs::read_to_string(t.files.report_html()).unwrap();
    let b = Target::new(&bag, 0).unwrap();
    let bag_dir = b.files.attention_dir("epoch0");
    let bag_maps: Vec<trainer::analysis::attention::AttentionImage> = serde_json::from_str(
        &std::fs::read_to_string(b.files.attention_manifest("epoch0")).unwrap(),
    )
    .unwrap();
    let own: Vec<trainer::analysis::attention::AttentionImage> = serde_json::from_str(
        &std::fs::read_to_string(t.files.attention_manifest("epoch0")).unwrap(),
    )
    .unwrap();
    // The same held-out images (up to two per class), at the features' 16 px and the maps' 32 px.
    assert_eq!(own.len(), bag_maps.len());
    assert!(own.len() >= 6, "{own:?}");
    assert_eq!(own.iter().filter(|i| i.size == 32).count() * 2, own.len());
    assert!(
        html.contains(&format!(
            "Beside: {} (pb), m_bag_channel_a_b_c, epoch0: its maps of the same images",
            bag_path.display()
        )),
        "{html}"
    );
    let b64 = |path: &Path| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap())
    };
    for img in &own {
        let other = bag_maps
            .iter()
            .find(|o| (&o.class, &o.file, o.size) == (&img.class, &img.file, img.size))
            .unwrap_or_else(|| panic!("bag picked other images than tokens: {img:?}"));
        let maps: Vec<&String> = other.head_pngs.iter().collect();
        assert_eq!(maps.len(), 3, "{other:?}");
        // Each bag channel's share is of its own pass, the tokens channels' of one softmax
        // over every channel's patches (and the CLS itself): each above 0, together at most 1.
        assert_eq!((img.map_shares.len(), other.map_shares.len()), (3, 3));
        for &s in &other.map_shares {
            assert!(s > 0.0 && s <= 1.0 + 1e-6, "bag {:?}", other.map_shares);
        }
        let sum: f64 = img.map_shares.iter().sum();
        assert!(
            img.map_shares.iter().all(|&s| s > 0.0) && sum <= 1.0 + 1e-6,
            "tokens {:?}",
            img.map_shares
        );
        for (rel, s) in img.head_pngs.iter().zip(&img.map_shares) {
            let stem = Path::new(rel).file_stem().unwrap().to_string_lossy();
            let caption = format!("<figcaption>{stem} · {:.1} %</figcaption>", 100.0 * s);
            assert!(html.contains(&caption), "{caption} not in the report");
        }
        for rel in maps {
            assert!(
                rel.ends_with(".png") && rel.contains("attn-channel_"),
                "{rel}"
            );
            assert!(
                html.contains(&b64(&bag_dir.join(rel))),
                "{rel} not in the report"
            );
        }
    }
    // Under each image this run's maps come first, then the bag's, before the next image.
    let first = html
        .find("<em>this run, m_tokens_channel_a_b_c, epoch0</em>")
        .expect("this run's maps are labelled");
    let rest = &html[first..];
    let bag_at = rest.find("m_bag_channel_a_b_c, epoch0</em>").unwrap();
    let next_image = rest.find("<h4>").unwrap_or(rest.len());
    assert!(bag_at < next_image, "{rest}");

    // a + c: the bag run has no such combination.
    let t02 = Target::new(&tokens, 1).unwrap();
    let html = std::fs::read_to_string(t02.files.report_html()).unwrap();
    assert!(
        html.contains("(pb): it has no channel combination a + c."),
        "{html}"
    );
    assert!(!html.contains("m_bag_channel"), "{html}");

    // A listed config that cannot be read fails the report, naming the file.
    let missing = dir.path().join("no such run.yaml");
    let broken = Config::from_yaml(
        &tokens_yaml.replace(
            &bag_path.display().to_string(),
            &missing.display().to_string(),
        ),
        "broken",
    )
    .unwrap();
    let t = Target::new(&broken, 0).unwrap();
    let err = write_report(&t, t.dataset().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("downstream.attention.beside") && err.contains(&missing.display().to_string()),
        "{err}"
    );
}

/// `scripts/colocalisation.py` (issue 48 run 17's task) draws what its docs promise, read back
/// through the trainer's own TIFF reader: every channel lights exactly `--spots` cells of
/// `--cell` px at intensities in [0.5, 1]; the class's two channels light the same cells, the
/// third (and in `none` every channel) cells of its own; the layout the trainer's folders want
/// (4 class folders under Training/ and Test/Donor01/Control/).
#[test]
fn the_colocalisation_task_is_drawn_as_documented() {
    use std::collections::BTreeSet;
    let dir = tempfile::tempdir().unwrap();
    let script =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/colocalisation.py");
    let out = std::process::Command::new(crate::util::python())
        .arg(&script)
        .args(["--out", dir.path().to_str().unwrap(), "--per-class", "5"])
        .args([
            "--test-per-class",
            "2",
            "--size",
            "24",
            "--cell",
            "3",
            "--spots",
            "7",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let classes: [(&str, Option<(usize, usize)>); 4] = [
        ("none", None),
        ("a_b", Some((0, 1))),
        ("a_c", Some((0, 2))),
        ("b_c", Some((1, 2))),
    ];
    let mut seen = 0;
    for (split, per) in [("Training", 5), ("Test/Donor01/Control", 2)] {
        for (class, pair) in classes {
            let folder = dir.path().join(split).join(class);
            let files: Vec<_> = std::fs::read_dir(&folder)
                .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
                .map(|e| e.unwrap().path())
                .collect();
            assert_eq!(files.len(), per, "{}", folder.display());
            for f in files {
                let img = trainer::data::tiff_reader::read_tiff(&f).unwrap();
                assert_eq!((img.channels, img.height, img.width), (3, 24, 24));
                // Each channel's lit cells (8 × 8 cells of 3 px), each cell uniformly lit.
                let cells: Vec<BTreeSet<(usize, usize)>> = (0..3)
                    .map(|c| {
                        let mut lit = BTreeSet::new();
                        for (cy, cx) in (0..8).flat_map(|y| (0..8).map(move |x| (y, x))) {
                            let v: Vec<f32> = (0..9)
                                .map(|k| img.get(c, cy * 3 + k / 3, cx * 3 + k % 3))
                                .collect();
                            assert!(
                                v.iter().all(|&p| p == v[0]),
                                "{}: a cell of channel {c} is not uniform",
                                f.display()
                            );
                            if v[0] > 0.0 {
                                // 64000 × [0.5, 1], as written (uint16).
                                assert!(
                                    (31999.0..=64000.0).contains(&v[0]),
                                    "{}: {}",
                                    f.display(),
                                    v[0]
                                );
                                lit.insert((cy, cx));
                            }
                        }
                        assert_eq!(lit.len(), 7, "{}: channel {c}", f.display());
                        lit
                    })
                    .collect();
                for (i, j) in [(0, 1), (0, 2), (1, 2)] {
                    if pair == Some((i, j)) {
                        assert_eq!(
                            cells[i],
                            cells[j],
                            "{}: {i} and {j} colocalise",
                            f.display()
                        );
                    } else {
                        assert!(
                            cells[i].is_disjoint(&cells[j]),
                            "{}: {i} and {j}",
                            f.display()
                        );
                    }
                }
                seen += 1;
            }
        }
    }
    assert_eq!(seen, 28);
}
