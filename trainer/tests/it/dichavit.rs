//! DiChaViT's pieces for `model.channels: tokens` against a PyTorch transcription of the
//! published code (`tests/py/dichavit_reference.py`): the channel and token diversification
//! terms (values and gradients on the same patch embedding and crops, within 1e-5) and the
//! diverse channel sampler (its probabilities, and the distribution of its subsets against
//! the exact one of `torch.multinomial` without replacement).
use crate::util::{max_abs_diff, py_dir, run_py_file, torch_rng_lock};
use std::collections::HashMap;
use tch::{nn, Kind, Tensor};
use trainer::config::Arch;
use trainer::model::{VisionTransformer, VitConfig};
use trainer::train::channels::{channel_cosines, diverse_probabilities, diverse_sample};
use trainer::train::dichavit::{ChannelDiversityTerm, TokenDiversityTerm};
use trainer::train::loss_term::{LossTerm, StepContext, StudentOutputs, TeacherOutputs, TokenStep};

fn read(path: &std::path::Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

/// One recipe on one patch embedding: both terms' values and gradients against the reference.
fn check_terms(cdl: ChannelDiversityTerm, tdl: TokenDiversityTerm) {
    let dir = tempfile::tempdir().unwrap();
    let (vs, vit, global) = {
        let _rng = torch_rng_lock();
        tch::manual_seed(48);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        // Five channels known, a step on three of them; 8 px crops of 4 px patches.
        let cfg = VitConfig::new(Arch::VitTiny, 4, 5)
            .with_channel_tokens()
            .with_channel_proxies();
        let vit = VisionTransformer::new(vs.root() / "backbone", cfg);
        let global = [
            Tensor::randn([3, 3, 8, 8], (Kind::Float, tch::Device::Cpu)),
            Tensor::randn([3, 3, 8, 8], (Kind::Float, tch::Device::Cpu)),
        ];
        (vs, vit, global)
    };
    let channels = [0i64, 2, 3];
    let embed = vit.channel_patch_embed().expect("channel tokens");
    let ctx = StepContext {
        epoch: 0,
        teacher_temp: 0.04,
        batch: 3,
        masks: None,
        tokens: Some(TokenStep {
            embed,
            global: &global,
            channels: &channels,
        }),
    };
    let none = || Tensor::zeros([1], (Kind::Float, tch::Device::Cpu));
    let student = StudentOutputs {
        logits: none(),
        cls: none(),
        patch_logits: None,
        channel_logits: None,
    };
    let teacher = TeacherOutputs {
        logits: none(),
        patch_logits: None,
        channel_logits: None,
    };
    let (c, t) = (
        cdl.value(&student, &teacher, &ctx),
        tdl.value(&student, &teacher, &ctx),
    );
    (&c + &t).backward();

    let vars = vs.variables();
    let var = |n: &str| vars[&format!("backbone.patch_embed.{n}")].shallow_clone();
    let input = dir.path().join("in.safetensors");
    let x = Tensor::cat(&global, 0);
    let names = [
        "proj.weight",
        "proj.bias",
        "channel_embed",
        "channel_emb_proxies",
    ];
    let mut tensors: Vec<(String, Tensor)> = names
        .iter()
        .map(|n| (n.to_string(), var(n).detach()))
        .collect();
    tensors.push(("x".into(), x));
    Tensor::write_safetensors(&tensors, &input).unwrap();
    let recipe = serde_json::json!({
        "channels": channels, "temperature": cdl.temperature, "cdl_weight": cdl.weight,
        "tdl_weight": tdl.weight, "gamma_s": tdl.gamma_s, "gamma_d": tdl.gamma_d,
        "reverse": tdl.reverse_pos_pairs,
    });
    std::fs::write(dir.path().join("in.safetensors.json"), recipe.to_string()).unwrap();
    let out = dir.path().join("out.safetensors");
    run_py_file(
        "dichavit_reference.py",
        &["losses", input.to_str().unwrap(), out.to_str().unwrap()],
    );
    let theirs = read(&out);
    let value = |t: &Tensor| t.double_value(&[]);
    let (dc, dt) = (
        (value(&c) - theirs["cdl"].double_value(&[0])).abs(),
        (value(&t) - theirs["tdl"].double_value(&[0])).abs(),
    );
    assert!(
        dc < 1e-5 && dt < 1e-5,
        "CDL {} / TDL {}: off by {dc:e} / {dt:e}",
        value(&c),
        value(&t)
    );
    // Not a vacuous comparison: both terms and every gradient are far from zero.
    assert!(value(&c).abs() > 1e-4 && value(&t).abs() > 1e-4);
    for (term, name) in [
        ("cdl", "channel_embed"),
        ("cdl", "channel_emb_proxies"),
        ("tdl", "proj.weight"),
        ("tdl", "proj.bias"),
    ] {
        let ours = var(name).grad();
        let reference = &theirs[&format!("{term}.{name}")];
        let d = max_abs_diff(&ours, reference);
        let scale = reference.abs().max().double_value(&[]);
        assert!(scale > 1e-6, "{term} gives {name} no gradient");
        assert!(
            d < 1e-5,
            "{term}: gradient of {name} off by {d:e} (largest {scale:e})"
        );
    }
    // Channels the step left out (1, 4) get no gradient from the channel loss.
    let g = var("channel_emb_proxies").grad();
    assert_eq!(g.get(1).abs().max().double_value(&[]), 0.0);
}

#[test]
fn diversification_terms_match_dichavit() {
    // The published CHAMMI recipe, then JUMP-CP's with the same-channel term unreversed.
    check_terms(
        ChannelDiversityTerm {
            weight: 0.1,
            temperature: 0.07,
        },
        TokenDiversityTerm {
            weight: 1.0,
            gamma_s: 0.5,
            gamma_d: 2.0,
            reverse_pos_pairs: true,
        },
    );
    check_terms(
        ChannelDiversityTerm {
            weight: 0.001,
            temperature: 0.11111,
        },
        TokenDiversityTerm {
            weight: 0.001,
            gamma_s: 1.0,
            gamma_d: 4.0,
            reverse_pos_pairs: false,
        },
    );
}

/// The sampler's probabilities are DiChaViT's, and the subsets it draws follow the exact
/// distribution of DiChaViT's draw (k, anchor, `torch.multinomial` without replacement,
/// anchor forced in), for a peaked (t = 0.1, CHAMMI) and a flat (t = 1000, JUMP-CP) recipe.
#[test]
fn diverse_sampling_draws_as_dichavit() {
    let dir = tempfile::tempdir().unwrap();
    let embeddings = {
        let _rng = torch_rng_lock();
        tch::manual_seed(7);
        Tensor::randn([4, 8], (Kind::Float, tch::Device::Cpu))
    };
    let cosines = channel_cosines(&embeddings);
    for temperature in [0.1, 1000.0] {
        let input = dir.path().join("in.safetensors");
        Tensor::write_safetensors(&[("embeddings", &embeddings)], &input).unwrap();
        std::fs::write(
            dir.path().join("in.safetensors.json"),
            serde_json::json!({ "temperature": temperature }).to_string(),
        )
        .unwrap();
        let out = dir.path().join("out.safetensors");
        run_py_file(
            "dichavit_reference.py",
            &["sampling", input.to_str().unwrap(), out.to_str().unwrap()],
        );
        let theirs = read(&out);
        for (anchor, row) in cosines.iter().enumerate() {
            let ours = Tensor::from_slice(&diverse_probabilities(row, temperature));
            let d = max_abs_diff(&ours, &theirs["probabilities"].get(anchor as i64));
            assert!(
                d < 1e-6,
                "t {temperature}, anchor {anchor}: probabilities off by {d:e}"
            );
        }
        let n = 40_000usize;
        let mut counts: HashMap<i64, usize> = HashMap::new();
        for it in 0..n {
            let s = diverse_sample(3, it, &cosines, temperature);
            *counts.entry(s.iter().map(|c| 1i64 << c).sum()).or_default() += 1;
        }
        let masks = Vec::<i64>::try_from(&theirs["subset_masks"]).unwrap();
        let probs = Vec::<f64>::try_from(&theirs["subset_probabilities"]).unwrap();
        assert!(
            counts.keys().all(|m| masks.contains(m)),
            "a subset DiChaViT never draws"
        );
        for (m, p) in masks.iter().zip(&probs) {
            let f = counts.get(m).copied().unwrap_or(0) as f64 / n as f64;
            // Five standard errors of a frequency over n draws.
            let bound = 5.0 * (p * (1.0 - p) / n as f64).sqrt() + 1e-4;
            assert!(
                (f - p).abs() < bound,
                "t {temperature}, subset {m:#b}: {f} drawn, {p} exact"
            );
        }
    }
}

/// The draw depends on the seed, the iteration and the embeddings only: the same again, a
/// subset (non-empty, ascending, distinct channels) per step, and another seed draws others.
#[test]
fn diverse_sampling_is_seeded() {
    let cosines = channel_cosines(&Tensor::eye(5, (Kind::Float, tch::Device::Cpu)));
    let draws = |seed| {
        (0..100)
            .map(|it| diverse_sample(seed, it, &cosines, 0.1))
            .collect::<Vec<_>>()
    };
    let a = draws(11);
    assert_eq!(a, draws(11));
    assert_ne!(a, draws(12));
    for s in &a {
        assert!(!s.is_empty() && s.len() <= 5);
        assert!(
            s.windows(2).all(|w| w[0] < w[1]) && s.iter().all(|c| (0..5).contains(c)),
            "{s:?}"
        );
    }
    assert!(py_dir().join("dichavit_reference.py").exists());
}

/// A run's learner as `model.dichavit` asks: off, nothing changes (no proxies, the DINO term
/// alone, hierarchical sampling); on, the proxies exist in student and teacher, both terms
/// are in the loss, and each step's channels are the diverse draw over the student's channel
/// embeddings.
#[test]
fn a_run_gets_the_pieces_its_config_asks_for() {
    use trainer::config::Config;
    use trainer::model::channels::hierarchical_sample;
    use trainer::train::channels::step_channels;
    use trainer::train::step::Learner;
    let base = "data:\n  channel_names: [a, b, c]\n  channel_combinations: [\"012\"]\nmodel:\n  arch: vit_tiny\n  patch_size: 4\n  out_dim: 64\n  channels: tokens\n";
    let on = "  dichavit:\n    channel_loss_weight: 0.1\n    token_loss_weight: 1\n    sampling: diverse\n";
    let proxies = "backbone.patch_embed.channel_emb_proxies";
    let _rng = torch_rng_lock();
    for dichavit in [false, true] {
        let on = if dichavit { on } else { "" };
        let text = format!("{base}{on}train:\n  precision: fp32\n");
        let cfg = Config::from_yaml(&text, "t").unwrap();
        let learner = Learner::from_config(&cfg, 3, tch::Device::Cpu).unwrap();
        let nets = &learner.nets;
        assert_eq!(nets.student_vs.variables().contains_key(proxies), dichavit);
        assert_eq!(nets.teacher_vs.variables().contains_key(proxies), dichavit);
        let names: Vec<&str> = learner.terms.iter().map(|t| t.info().name).collect();
        let expected = if dichavit {
            vec!["dino", "channel_diversity", "token_diversity"]
        } else {
            vec!["dino"]
        };
        assert_eq!(names, expected);
        let backbone = &nets.student.backbone;
        let cosines =
            channel_cosines(&backbone.channel_patch_embed().unwrap().channel_embeddings());
        for it in 0..20 {
            let expected = if dichavit {
                diverse_sample(cfg.run.seed, it, &cosines, 0.1)
            } else {
                hierarchical_sample(cfg.run.seed, it, 3)
            };
            assert_eq!(step_channels(&cfg, it, 3, backbone, None), Some(expected));
            // A batch of cells holding channels 0 and 2 only (`cell_channels: own`): the
            // same draw over those two, named by their model positions.
            let among = [0usize, 2];
            let over_two = if dichavit {
                let sub: Vec<Vec<f64>> = among
                    .iter()
                    .map(|&a| among.iter().map(|&b| cosines[a][b]).collect())
                    .collect();
                diverse_sample(cfg.run.seed, it, &sub, 0.1)
            } else {
                hierarchical_sample(cfg.run.seed, it, 2)
            };
            let mapped: Vec<i64> = over_two.iter().map(|&c| among[c as usize] as i64).collect();
            assert_eq!(
                step_channels(&cfg, it, 3, backbone, Some(&among)),
                Some(mapped)
            );
            // Every channel held: exactly the draw over all of them.
            assert_eq!(
                step_channels(&cfg, it, 3, backbone, Some(&[0, 1, 2])),
                step_channels(&cfg, it, 3, backbone, None)
            );
        }
    }
}
