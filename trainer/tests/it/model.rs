//! The Rust ViT-DINO against the PyTorch reference (tests/py/dino_reference.py).
use super::util::{max_abs_diff, run_py_file};
use std::collections::HashMap;
use tch::{nn, Device, Kind, Tensor};
use trainer::config::Arch;
use trainer::model::{
    count_parameters, load_safetensors_strict, HeadConfig, MultiCropNet, VitConfig,
};

struct Case {
    arch: &'static str,
    patch: usize,
    chans: usize,
    out_dim: i64,
    use_bn: bool,
    registers: usize,
}

fn arch(name: &str) -> Arch {
    match name {
        "vit_tiny" => Arch::VitTiny,
        "vit_small" => Arch::VitSmall,
        _ => Arch::VitBase,
    }
}

/// Builds both sides from the same PyTorch weights and compares every output.
fn check_parity(case: Case) {
    // Draws from (or initialises a model with) the process-wide generator.
    let _rng = super::util::torch_rng_lock();
    tch::set_num_threads(2);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("parity.safetensors");
    let out_s = out.to_str().unwrap();
    run_py_file(
        "model_parity.py",
        &[
            out_s,
            case.arch,
            &case.patch.to_string(),
            &case.chans.to_string(),
            &case.out_dim.to_string(),
            if case.use_bn { "1" } else { "0" },
            &case.registers.to_string(),
        ],
    );
    let mut vs = nn::VarStore::new(Device::Cpu);
    let vit = VitConfig::new(arch(case.arch), case.patch, case.chans)
        .with_drop_path(0.1)
        .with_registers(case.registers);
    let head = HeadConfig::new(vit.embed_dim, case.out_dim, case.use_bn, true);
    let net = MultiCropNet::new(&vs.root(), vit, head);
    load_safetensors_strict(
        &mut vs,
        &dir.path().join("parity.safetensors.weights.safetensors"),
    )
    .expect("PyTorch state dict loads by name");
    let t: HashMap<String, Tensor> = Tensor::read_safetensors(&out)
        .unwrap()
        .into_iter()
        .collect();
    let tol = 1e-4;
    tch::no_grad(|| {
        let cases = [
            ("cls224", net.backbone.forward_t(&t["in.x224"], false)),
            ("cls96", net.backbone.forward_t(&t["in.x96"], false)),
            ("cls_rect", net.backbone.forward_t(&t["in.x_rect"], false)),
            ("attn224", net.backbone.last_selfattention(&t["in.x224"])),
            (
                "attn_rect",
                net.backbone.last_selfattention(&t["in.x_rect"]),
            ),
            (
                "head224",
                net.forward_t(&[t["in.x224"].shallow_clone()], false),
            ),
            (
                "multicrop",
                net.forward_t(
                    &(0..5)
                        .map(|i| t[&format!("in.crop{i}")].shallow_clone())
                        .collect::<Vec<_>>(),
                    false,
                ),
            ),
        ];
        for (name, ours) in cases {
            let theirs = &t[&format!("out.{name}")];
            let err = max_abs_diff(&ours, theirs);
            assert!(
                err <= tol,
                "{} p{} {name}: max abs error {err:e} > {tol:e}",
                case.arch,
                case.patch
            );
        }
    });
}

#[test]
fn vit_tiny_p16_matches_pytorch() {
    check_parity(Case {
        arch: "vit_tiny",
        patch: 16,
        chans: 5,
        out_dim: 1000,
        use_bn: false,
        registers: 0,
    });
}

#[test]
fn vit_small_p16_matches_pytorch() {
    check_parity(Case {
        arch: "vit_small",
        patch: 16,
        chans: 5,
        out_dim: 4096,
        use_bn: false,
        registers: 0,
    });
}

#[test]
fn vit_tiny_p8_with_bn_head_matches_pytorch() {
    check_parity(Case {
        arch: "vit_tiny",
        patch: 8,
        chans: 3,
        out_dim: 512,
        use_bn: true,
        registers: 0,
    });
}

/// DINOv2's register tokens (4, as its `*_reg` models): the state dict with
/// `backbone.register_tokens` loads by name into our model, and CLS features, the head and the
/// last attention (register rows and columns left out) equal the reference with registers
/// inserted after the CLS token.
#[test]
fn vit_tiny_with_register_tokens_matches_dinov2() {
    check_parity(Case {
        arch: "vit_tiny",
        patch: 16,
        chans: 3,
        out_dim: 256,
        use_bn: false,
        registers: 4,
    });
}

#[test]
fn vit_small_parameter_count_and_names_match_scdino() {
    // Draws from (or initialises a model with) the process-wide generator.
    let _rng = super::util::torch_rng_lock();
    let vs = nn::VarStore::new(Device::Cpu);
    let vit = VitConfig::new(Arch::VitSmall, 16, 5);
    let head = HeadConfig::new(vit.embed_dim, 65536, false, true);
    let _net = MultiCropNet::new(&vs.root(), vit, head);
    assert_eq!(count_parameters(&vs, "backbone."), 21_862_272);
    // MLP 5,509,376 + weight_v 16,777,216 + weight_g 65,536.
    assert_eq!(count_parameters(&vs, "head."), 22_352_128);
    let vars = vs.variables();
    for (name, shape) in [
        ("backbone.cls_token", vec![1, 1, 384]),
        ("backbone.pos_embed", vec![1, 197, 384]),
        ("backbone.patch_embed.proj.weight", vec![384, 5, 16, 16]),
        ("backbone.blocks.11.attn.qkv.weight", vec![1152, 384]),
        ("backbone.blocks.0.mlp.fc2.weight", vec![384, 1536]),
        ("head.mlp.4.weight", vec![256, 2048]),
        ("head.last_layer.weight_g", vec![65536, 1]),
        ("head.last_layer.weight_v", vec![65536, 256]),
    ] {
        assert_eq!(vars[name].size(), shape, "{name}");
    }
    // Sizes of the other presets, from the reference table.
    for (arch, expect) in [(Arch::VitTiny, 5_622_720), (Arch::VitBase, 86_191_872)] {
        let vs = nn::VarStore::new(Device::Cpu);
        let _ = trainer::model::VisionTransformer::new(
            vs.root() / "backbone",
            VitConfig::new(arch, 16, 5),
        );
        assert_eq!(count_parameters(&vs, "backbone."), expect, "{arch:?}");
    }
}

fn std_of(t: &Tensor) -> f64 {
    t.to_kind(Kind::Double).std(true).double_value(&[])
}

#[test]
fn initialisation_follows_dino() {
    let _rng = super::util::torch_rng_lock();
    tch::manual_seed(7);
    let vs = nn::VarStore::new(Device::Cpu);
    let vit = VitConfig::new(Arch::VitSmall, 16, 5);
    let head = HeadConfig::new(vit.embed_dim, 8192, false, true);
    let _net = MultiCropNet::new(&vs.root(), vit, head);
    let v = vs.variables();
    // trunc_normal(std=.02) on Linear weights, cls_token and pos_embed.
    for name in [
        "backbone.blocks.3.attn.qkv.weight",
        "backbone.blocks.3.mlp.fc1.weight",
        "head.mlp.2.weight",
        "backbone.pos_embed",
    ] {
        let s = std_of(&v[name]);
        assert!((s - 0.02).abs() < 0.02 * 0.03, "{name}: std {s}");
    }
    for name in [
        "backbone.blocks.3.attn.qkv.bias",
        "head.mlp.0.bias",
        "backbone.norm.bias",
    ] {
        assert_eq!(v[name].abs().max().double_value(&[]), 0.0, "{name}");
    }
    assert_eq!(
        v["backbone.blocks.0.norm1.weight"].min().double_value(&[]),
        1.0
    );
    // PyTorch's default conv init: U(±1/√fan_in), fan_in = 5·16·16.
    let bound = 1.0 / 1280f64.sqrt();
    let w = &v["backbone.patch_embed.proj.weight"];
    assert!(w.abs().max().double_value(&[]) <= bound);
    let s = std_of(w);
    assert!(
        (s - bound / 3f64.sqrt()).abs() < 0.03 * bound,
        "conv std {s}"
    );
    // Weight-normalised last layer: v ~ U(±1/16), g = 1 and frozen.
    let wv = &v["head.last_layer.weight_v"];
    assert!(wv.abs().max().double_value(&[]) <= 1.0 / 16.0);
    assert!((std_of(wv) - (1.0 / 16.0) / 3f64.sqrt()).abs() < 0.002);
    assert_eq!(v["head.last_layer.weight_g"].min().double_value(&[]), 1.0);
    let trainable: Vec<String> = vs
        .trainable_variables()
        .iter()
        .map(|t| format!("{:?}", t.size()))
        .collect();
    assert_eq!(trainable.len(), v.len() - 1, "only weight_g is frozen");
}

#[test]
fn drop_path_only_acts_in_training() {
    let _rng = super::util::torch_rng_lock();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let vit = VitConfig::new(Arch::VitTiny, 16, 2).with_drop_path(0.5);
    let net = trainer::model::VisionTransformer::new(vs.root(), vit);
    let x = Tensor::randn([4, 2, 64, 64], (Kind::Float, Device::Cpu));
    tch::no_grad(|| {
        let a = net.forward_t(&x, false);
        let b = net.forward_t(&x, false);
        assert_eq!(max_abs_diff(&a, &b), 0.0);
        let c = net.forward_t(&x, true);
        assert!(max_abs_diff(&a, &c) > 1e-3, "drop path changed nothing");
    });
}

#[test]
fn loading_refuses_missing_or_misshaped_weights() {
    // Draws from (or initialises a model with) the process-wide generator.
    let _rng = super::util::torch_rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let vs = nn::VarStore::new(Device::Cpu);
    let _ = trainer::model::VisionTransformer::new(
        vs.root() / "backbone",
        VitConfig::new(Arch::VitTiny, 16, 5),
    );
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.retain(|(n, _)| n != "backbone.norm.bias");
    Tensor::write_safetensors(&named, &path).unwrap();
    let mut vs2 = nn::VarStore::new(Device::Cpu);
    let _ = trainer::model::VisionTransformer::new(
        vs2.root() / "backbone",
        VitConfig::new(Arch::VitTiny, 16, 5),
    );
    let err = load_safetensors_strict(&mut vs2, &path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("backbone.norm.bias"), "{err}");

    let mut vs3 = nn::VarStore::new(Device::Cpu);
    let _ = trainer::model::VisionTransformer::new(
        vs3.root() / "backbone",
        VitConfig::new(Arch::VitTiny, 16, 4),
    );
    named.push((
        "backbone.norm.bias".into(),
        Tensor::zeros([192], (Kind::Float, Device::Cpu)),
    ));
    Tensor::write_safetensors(&named, &path).unwrap();
    let err = load_safetensors_strict(&mut vs3, &path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("patch_embed.proj.weight") && err.contains("shape"),
        "{err}"
    );
}

/// `model.channels: tokens` (ChannelViT tokens) and `bag` (single-channel ViT, channels
/// through the batch) against the PyTorch references of tests/py/channel_reference.py, on the
/// same weights: CLS at the training grid, at another size, non-square, on a subset of the
/// channels, the last attention, the bag features (concatenated and mean) and the tokens
/// features with `tokens_pool: cls_and_channels` and `joint_and_alone` (all four channels, a
/// subset of two, one channel). The tokens state dict is ChannelViT's, name for name and shape
/// for shape.
#[test]
fn channel_adaptive_backbones_match_pytorch() {
    use trainer::config::{BagPool, ChannelMode, TokensPool};
    use trainer::model::channels::{for_mode, CombinationInput};
    use trainer::model::{bag_cls, VisionTransformer};
    let _rng = super::util::torch_rng_lock();
    tch::set_num_threads(2);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("channels.safetensors");
    let out_s = out.to_str().unwrap();
    run_py_file("channel_parity.py", &[out_s, "vit_tiny", "16", "4"]);
    let t: HashMap<String, Tensor> = Tensor::read_safetensors(&out)
        .unwrap()
        .into_iter()
        .collect();
    let mut vs = nn::VarStore::new(Device::Cpu);
    let tokens = VisionTransformer::new(
        vs.root(),
        VitConfig::new(Arch::VitTiny, 16, 4)
            .with_drop_path(0.1)
            .with_channel_tokens(),
    );
    load_safetensors_strict(
        &mut vs,
        &dir.path().join("channels.safetensors.tokens.safetensors"),
    )
    .expect("a ChannelViT state dict loads by name");
    let mut bag_vs = nn::VarStore::new(Device::Cpu);
    let bag = VisionTransformer::new(
        bag_vs.root(),
        VitConfig::new(Arch::VitTiny, 16, 1).with_drop_path(0.1),
    );
    load_safetensors_strict(
        &mut bag_vs,
        &dir.path().join("channels.safetensors.bag.safetensors"),
    )
    .unwrap();
    let subset: Vec<i64> = Vec::<i64>::try_from(&t["in.subset"]).unwrap();
    let tol = 1e-4;
    // The features stage's own function (the mode's kind), not a copy of its arithmetic.
    let pooled = |x: &Tensor, positions: Option<Vec<i64>>, tokens_pool: TokensPool| {
        let input = CombinationInput {
            positions,
            trained: 4,
            bag_pool: BagPool::Concat,
            tokens_pool,
        };
        let kind = for_mode(ChannelMode::Tokens);
        let k = x.size()[1] as usize;
        let f = kind.features(&tokens, x, &input);
        assert_eq!(f.size()[1], kind.feature_dim(192, k, &input));
        f
    };
    tch::no_grad(|| {
        let cls = bag_cls(&bag, &t["in.x96"]);
        let (concat, mean) = (cls.flatten(1, 2), cls.mean_dim(1, false, None));
        let cases = [
            ("tokens.cls224", tokens.forward_t(&t["in.x224"], false)),
            ("tokens.cls96", tokens.forward_t(&t["in.x96"], false)),
            ("tokens.cls_rect", tokens.forward_t(&t["in.x_rect"], false)),
            (
                "tokens.cls_sub",
                tokens.forward_channels_t(&t["in.x_sub"], Some(&subset), false),
            ),
            ("tokens.attn96", tokens.last_selfattention(&t["in.x96"])),
            (
                "tokens.attn_sub",
                tokens.last_selfattention_channels(&t["in.x_sub"], Some(&subset)),
            ),
            ("bag.concat96", concat),
            ("bag.mean96", mean),
            (
                "tokens.pool96",
                pooled(&t["in.x96"], None, TokensPool::ClsAndChannels),
            ),
            (
                "tokens.pool_sub",
                pooled(
                    &t["in.x_sub"],
                    Some(subset.clone()),
                    TokensPool::ClsAndChannels,
                ),
            ),
            (
                "tokens.joint_alone96",
                pooled(&t["in.x96"], None, TokensPool::JointAndAlone),
            ),
            (
                "tokens.joint_alone_sub",
                pooled(
                    &t["in.x_sub"],
                    Some(subset.clone()),
                    TokensPool::JointAndAlone,
                ),
            ),
            (
                "tokens.joint_alone_one",
                pooled(
                    &t["in.x_sub"].narrow(1, 1, 1),
                    Some(subset[1..].to_vec()),
                    TokensPool::JointAndAlone,
                ),
            ),
        ];
        for (name, ours) in cases {
            let err = max_abs_diff(&ours, &t[&format!("out.{name}")]);
            assert!(err <= tol, "{name}: max abs error {err:e} > {tol:e}");
        }
        // A subset is not the full input with channels zeroed: the tokens differ.
        let zeroed = Tensor::zeros([2, 4, 96, 96], (Kind::Float, Device::Cpu));
        for (k, &c) in subset.iter().enumerate() {
            zeroed
                .select(1, c)
                .copy_(&t["in.x_sub"].select(1, k as i64));
        }
        let full = tokens.forward_t(&zeroed, false);
        assert!(max_abs_diff(&full, &t["out.tokens.cls_sub"]) > 1e-3);
    });
    let vars = vs.variables();
    for (name, shape) in [
        ("patch_embed.proj.weight", vec![192, 1, 1, 16, 16]),
        ("patch_embed.proj.bias", vec![192]),
        ("patch_embed.channel_embed", vec![1, 192, 4, 1, 1]),
        ("pos_embed", vec![1, 197, 192]),
    ] {
        assert_eq!(vars[name].size(), shape, "{name}");
    }
}

/// `model.channel_mixing_blocks` and `model.channel_separate_blocks` against the PyTorch
/// reference (tests/py/channel_reference.py, whose masks are written token by token from the
/// definitions) on the same weights, in float64: the CLS output and every parameter's
/// gradient of sum(CLS · w), on 2 and 3 of 4 channels, with one mixing block, with two mixing
/// blocks and two register tokens, and with two separate blocks then one mixing block and two
/// registers; with every block mixing, and every block separate, the last attention (masked
/// as the blocks are). The same weights without the masks, or with the separate blocks read
/// as mixing ones, give another output, so the comparison sees each mask and their order.
#[test]
fn channel_mixing_and_separate_blocks_match_pytorch() {
    use trainer::model::VisionTransformer;
    let _rng = super::util::torch_rng_lock();
    tch::set_num_threads(2);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mixing.safetensors");
    let out_s = out.to_str().unwrap();
    run_py_file("channel_mixing_parity.py", &[out_s]);
    let t: HashMap<String, Tensor> = Tensor::read_safetensors(&out)
        .unwrap()
        .into_iter()
        .collect();
    let build = |case: &str, registers: usize, separate: i64, mixing: i64| {
        let mut vs = nn::VarStore::new(Device::Cpu);
        let cfg = VitConfig {
            channel_separate_blocks: separate,
            channel_mixing_blocks: mixing,
            ..VitConfig::new(Arch::VitTiny, 16, 4)
                .with_drop_path(0.1)
                .with_channel_tokens()
                .with_registers(registers)
        };
        let vit = VisionTransformer::new(vs.root(), cfg);
        vs.double();
        load_safetensors_strict(
            &mut vs,
            &dir.path()
                .join(format!("mixing.safetensors.{case}.safetensors")),
        )
        .expect("the reference's state dict loads by name");
        (vs, vit)
    };
    let tol = 1e-5;
    let mut worst: f64 = 0.0;
    for (case, registers, separate, mixing) in [
        ("mix1", 0, 0, 1),
        ("mix2reg", 2, 0, 2),
        ("sep2mix1reg", 2, 2, 1),
    ] {
        let (vs, vit) = build(case, registers, separate, mixing);
        for k in ["k2", "k3"] {
            let x = &t[&format!("in.x_{k}")];
            let channels = Vec::<i64>::try_from(&t[&format!("in.channels_{k}")]).unwrap();
            let cls = vit.forward_channels_t(x, Some(&channels), false);
            let err = max_abs_diff(&cls, &t[&format!("out.{case}.cls_{k}")]);
            assert!(
                err <= tol,
                "{case} {k} CLS: max abs error {err:e} > {tol:e}"
            );
            worst = worst.max(err);
            (&cls * &t["in.w"]).sum(Kind::Double).backward();
            let vars = vs.variables();
            let prefix = format!("grad.{case}.{k}.");
            let mut compared = 0;
            for (name, want) in t.iter().filter(|(n, _)| n.starts_with(&prefix)) {
                let name = &name[prefix.len()..];
                let err = max_abs_diff(&vars[name].grad(), want);
                assert!(
                    err <= tol,
                    "{case} {k} grad {name}: max abs error {err:e} > {tol:e}"
                );
                worst = worst.max(err);
                compared += 1;
            }
            // Every parameter has the reference's gradient to compare with.
            assert_eq!(compared, vars.len(), "{case} {k}: gradients compared");
            for (_, mut v) in vars {
                v.zero_grad();
            }
        }
    }
    // Every block mixing, every block separate: the CLS and the last attention, which must
    // apply the mask too.
    for (case, separate, mixing) in [("mixall", 0, 12), ("sepall", 12, 0)] {
        let (_vs, vit) = build("mix1", 0, separate, mixing);
        tch::no_grad(|| {
            for k in ["k2", "k3"] {
                let x = &t[&format!("in.x_{k}")];
                let channels = Vec::<i64>::try_from(&t[&format!("in.channels_{k}")]).unwrap();
                for (what, ours) in [
                    ("cls", vit.forward_channels_t(x, Some(&channels), false)),
                    ("attn", vit.last_selfattention_channels(x, Some(&channels))),
                ] {
                    let err = max_abs_diff(&ours, &t[&format!("out.{case}.{what}_{k}")]);
                    assert!(
                        err <= tol,
                        "{case} {k} {what}: max abs error {err:e} > {tol:e}"
                    );
                    worst = worst.max(err);
                }
            }
        });
    }
    tch::no_grad(|| {
        let channels = Vec::<i64>::try_from(&t["in.channels_k2"]).unwrap();
        let x = &t["in.x_k2"];
        // Without the mask the same weights compute something else.
        let (_vs, plain) = build("mix1", 0, 0, 0);
        let cls = plain.forward_channels_t(x, Some(&channels), false);
        assert!(max_abs_diff(&cls, &t["out.mix1.cls_k2"]) > 1e-3);
        // The separate blocks' mask is not the mixing one, and it comes first.
        for (separate, mixing) in [(0, 3), (0, 1), (1, 2)] {
            let (_vs, other) = build("sep2mix1reg", 2, separate, mixing);
            let cls = other.forward_channels_t(x, Some(&channels), false);
            assert!(
                max_abs_diff(&cls, &t["out.sep2mix1reg.cls_k2"]) > 1e-3,
                "separate {separate}, mixing {mixing} computes what 2 then 1 does"
            );
        }
    });
    println!("channel mixing vs PyTorch (float64): max abs error {worst:e}");
}

/// With every block separate, a channel's patch tokens are what the model computes from that
/// channel alone, whichever channels come with it (the CLS and registers gather every
/// channel, but no patch token reads them), while the CLS token does depend on the others;
/// with one block fewer separate, the last block mixes them and the patch tokens differ.
#[test]
fn separate_blocks_encode_each_channel_as_if_alone() {
    use trainer::model::VisionTransformer;
    let _rng = super::util::torch_rng_lock();
    let base = VitConfig::new(Arch::VitTiny, 8, 5)
        .with_channel_tokens()
        .with_registers(2);
    let build = |separate: i64| {
        tch::manual_seed(3);
        let vs = nn::VarStore::new(Device::Cpu);
        let vit = VisionTransformer::new(
            vs.root(),
            VitConfig {
                channel_separate_blocks: separate,
                ..base
            },
        );
        (vs, vit)
    };
    let ((_vs_all, all), (_vs_joint, last_joint)) = (build(12), build(11));
    let x = Tensor::randn([3, 5, 24, 32], (Kind::Float, Device::Cpu));
    let n = 3 * 4;
    tch::no_grad(|| {
        for (net, as_if_alone) in [(&all, true), (&last_joint, false)] {
            let (cls_pair, pair) =
                net.forward_features_t(&x.narrow(1, 1, 2), Some(&[1, 2]), None, false);
            let (cls_one, one) =
                net.forward_features_t(&x.narrow(1, 2, 1), Some(&[2]), None, false);
            let (_, five) = net.forward_features_t(&x, None, None, false);
            let err_pair = max_abs_diff(&pair.narrow(1, n, n), &one);
            let err_five = max_abs_diff(&five.narrow(1, 2 * n, n), &one);
            assert!(
                max_abs_diff(&cls_pair, &cls_one) > 1e-3,
                "the CLS sees every channel"
            );
            if as_if_alone {
                assert!(
                    err_pair < 1e-5 && err_five < 1e-5,
                    "{err_pair:e} {err_five:e}"
                );
            } else {
                assert!(
                    err_pair > 1e-3 && err_five > 1e-3,
                    "{err_pair:e} {err_five:e}"
                );
            }
        }
    });
}

/// A batch of no images (the last, empty chunk of a split, or an empty shard) goes through
/// separate and mixing blocks to an empty feature and empty attention, as through plain
/// blocks: the masks are built from the model's own tokens, not from the batch.
#[test]
fn restricted_blocks_take_an_empty_batch() {
    use trainer::model::VisionTransformer;
    let _rng = super::util::torch_rng_lock();
    tch::manual_seed(4);
    let vs = nn::VarStore::new(Device::Cpu);
    let vit = VisionTransformer::new(
        vs.root(),
        VitConfig {
            channel_separate_blocks: 2,
            channel_mixing_blocks: 1,
            ..VitConfig::new(Arch::VitTiny, 8, 3)
                .with_channel_tokens()
                .with_registers(2)
        },
    );
    let x = Tensor::zeros([0, 2, 24, 32], (Kind::Float, Device::Cpu));
    tch::no_grad(|| {
        let cls = vit.forward_channels_t(&x, Some(&[0, 2]), false);
        assert_eq!(cls.size(), [0, 192]);
        let (cls, patches) = vit.forward_features_t(&x, Some(&[0, 2]), None, false);
        assert_eq!(
            (cls.size(), patches.size()),
            (vec![0, 192], vec![0, 24, 192])
        );
        let attn = vit.last_selfattention_channels(&x, Some(&[0, 2]));
        assert_eq!(attn.size()[0], 0);
    });
}

/// `model.channel_embed_std` scales the orthogonal channel embeddings (each row of norm
/// std·√D), and the default is the 0.02 of before, draw for draw.
#[test]
fn channel_embed_std_scales_the_initial_channel_embeddings() {
    let _rng = super::util::torch_rng_lock();
    let embed = |std: Option<f64>| {
        tch::manual_seed(5);
        let vs = nn::VarStore::new(Device::Cpu);
        let mut cfg = VitConfig::new(Arch::VitSmall, 16, 5).with_channel_tokens();
        if let Some(std) = std {
            cfg.channel_embed_std = std;
        }
        let _ = trainer::model::VisionTransformer::new(vs.root(), cfg);
        let v = vs.variables();
        (
            v["patch_embed.channel_embed"]
                .reshape([384, 5])
                .transpose(0, 1),
            v,
        )
    };
    let (e, _) = embed(Some(1.0));
    let gram = e.matmul(&e.transpose(0, 1));
    let eye = Tensor::eye(5, (Kind::Float, Device::Cpu)) * 384.0;
    assert!(
        max_abs_diff(&gram, &eye) < 1e-3,
        "channel embeddings are not orthogonal rows of norm² 384: {gram}"
    );
    let row_std = e.std_dim(1, true, false);
    assert!(max_abs_diff(&row_std, &Tensor::ones([5], (Kind::Float, Device::Cpu))) < 0.01);
    // The default draws exactly what an explicit 0.02 does, and every other tensor is the
    // same draw as at std 1.0 (the scale is the only change).
    let (default, dv) = embed(None);
    let (explicit, _) = embed(Some(0.02));
    assert_eq!(max_abs_diff(&default, &explicit), 0.0);
    assert!(max_abs_diff(&(&default * 50.0), &e) < 1e-5);
    let (_, v1) = embed(Some(1.0));
    for (name, x) in &dv {
        if name != "patch_embed.channel_embed" {
            assert_eq!(max_abs_diff(x, &v1[name]), 0.0, "{name}");
        }
    }
}

/// The channel embeddings start orthogonal (DiChaViT), each as long as a trunc-normal(0.02)
/// row on average; the shared projection keeps PyTorch's conv init with fan-in P·P.
#[test]
fn channel_tokens_initialisation() {
    let _rng = super::util::torch_rng_lock();
    tch::manual_seed(5);
    let vs = nn::VarStore::new(Device::Cpu);
    let _ = trainer::model::VisionTransformer::new(
        vs.root(),
        VitConfig::new(Arch::VitSmall, 16, 5).with_channel_tokens(),
    );
    let v = vs.variables();
    let e = v["patch_embed.channel_embed"]
        .reshape([384, 5])
        .transpose(0, 1);
    let gram = e.matmul(&e.transpose(0, 1));
    let want = 0.02f64.powi(2) * 384.0;
    let eye = Tensor::eye(5, (Kind::Float, Device::Cpu)) * want;
    assert!(
        max_abs_diff(&gram, &eye) < 1e-6,
        "channel embeddings are not orthogonal rows of norm² {want}: {gram}"
    );
    let bound = 1.0 / 256f64.sqrt();
    let w = &v["patch_embed.proj.weight"];
    assert!(w.abs().max().double_value(&[]) <= bound);
    assert!((std_of(w) - bound / 3f64.sqrt()).abs() < 0.03 * bound);
}

/// The selftest's "sdpa backend" row names the kernel PyTorch's own dispatcher
/// (`torch._fused_sdp_choice`) picks for the same shapes and dtypes; on a GPU the row makes
/// the same call with the GPU's tensors.
#[test]
fn selftest_names_the_sdpa_kernel_pytorch_picks() {
    let ours = trainer::selftest::sdpa_backends(Device::Cpu).unwrap();
    let theirs = super::util::run_python(
        r#"
import torch
from torch.nn.attention import SDPBackend as B
names = {int(getattr(B, n).value): n.lower() for n in
         ["MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "OVERRIDEABLE"]}
out = []
for label, dt in [("fp32", torch.float32), ("bf16", torch.bfloat16)]:
    q = torch.zeros(64, 6, 197, 64, dtype=dt)
    out.append(f"{label} {names.get(torch._fused_sdp_choice(q, q, q), 'none usable')}")
print("Cpu: " + ", ".join(out))
"#,
        &[],
    );
    assert_eq!(ours, theirs.trim());
}

/// The model declares its structure for the strategies (`MultiCropNet::units`): every
/// variable that is not a buffer is declared exactly once, the units come in forward order
/// (embeddings, blocks, final norm, head) with each unit's parameters in forward order, and
/// the head's last layer is named; for every token layout and head variant. The expected
/// order is spelled out for a 2-block model: it is also the order DDP's buckets and FSDP's
/// shard files were laid out in before the model declared it (by name rules in `distributed/`), so
/// shards written by earlier versions still resume.
#[test]
fn the_model_declares_every_parameter_once_in_forward_order() {
    use trainer::model::UnitKind;
    for (tokens, in_chans) in [(false, 3), (true, 3), (false, 1)] {
        for (use_bn, norm_last, nlayers) in [(false, true, 3), (true, false, 3), (false, false, 1)]
        {
            let vs = nn::VarStore::new(Device::Cpu);
            let mut vit = VitConfig::new(Arch::VitTiny, 16, in_chans);
            vit.depth = 2;
            if tokens {
                vit = vit.with_channel_tokens();
            }
            let mut head = HeadConfig::new(vit.embed_dim, 64, use_bn, norm_last);
            head.nlayers = nlayers;
            head.hidden_dim = 32;
            head.bottleneck_dim = 16;
            let net = MultiCropNet::new(&vs.root(), vit, head);
            let units = net.units();
            let declared: Vec<String> = units.forward_order().map(str::to_string).collect();
            let case =
                format!("tokens {tokens}, bn {use_bn}, norm_last {norm_last}, {nlayers} layers");

            let mut expected: Vec<String> = vec![
                "backbone.patch_embed.proj.weight".into(),
                "backbone.patch_embed.proj.bias".into(),
            ];
            if tokens {
                expected.push("backbone.patch_embed.channel_embed".into());
            }
            expected.extend(["backbone.cls_token".into(), "backbone.pos_embed".into()]);
            for b in 0..2 {
                for leaf in [
                    "norm1.weight",
                    "norm1.bias",
                    "attn.qkv.weight",
                    "attn.qkv.bias",
                    "attn.proj.weight",
                    "attn.proj.bias",
                    "norm2.weight",
                    "norm2.bias",
                    "mlp.fc1.weight",
                    "mlp.fc1.bias",
                    "mlp.fc2.weight",
                    "mlp.fc2.bias",
                ] {
                    expected.push(format!("backbone.blocks.{b}.{leaf}"));
                }
            }
            expected.extend(["backbone.norm.weight".into(), "backbone.norm.bias".into()]);
            let mlp: Vec<String> = match (nlayers, use_bn) {
                (1, _) => vec!["head.mlp".into()],
                (_, false) => vec![
                    "head.mlp.0".into(),
                    "head.mlp.2".into(),
                    "head.mlp.4".into(),
                ],
                (_, true) => vec![
                    "head.mlp.0".into(),
                    "head.mlp.1".into(),
                    "head.mlp.3".into(),
                    "head.mlp.4".into(),
                    "head.mlp.6".into(),
                ],
            };
            for m in mlp {
                expected.extend([format!("{m}.weight"), format!("{m}.bias")]);
            }
            expected.extend([
                "head.last_layer.weight_g".into(),
                "head.last_layer.weight_v".into(),
            ]);
            assert_eq!(declared, expected, "{case}");

            // Every non-buffer variable of the store, no more, no less.
            let mut stored: Vec<String> = vs
                .variables()
                .into_keys()
                .filter(|n| !n.ends_with("running_mean") && !n.ends_with("running_var"))
                .collect();
            stored.sort();
            let mut sorted = declared.clone();
            sorted.sort();
            assert_eq!(sorted, stored, "{case}");

            let kinds: Vec<UnitKind> = units.units().iter().map(|u| u.kind).collect();
            assert_eq!(
                kinds,
                [
                    UnitKind::Embeddings,
                    UnitKind::Block(0),
                    UnitKind::Block(1),
                    UnitKind::Norm,
                    UnitKind::Head
                ],
                "{case}"
            );
            let blocks: Vec<&str> = units.blocks().map(|u| u.name.as_str()).collect();
            assert_eq!(blocks, ["backbone.blocks.0", "backbone.blocks.1"], "{case}");
            assert!(units.is_last_layer("head.last_layer.weight_v"));
            assert!(units.is_last_layer("head.last_layer.weight_g"));
            assert!(
                !units.is_last_layer("head.mlp.0.weight")
                    && !units.is_last_layer("head.mlp.weight")
            );

            // Sorting a subset (the trainable ones, shuffled) follows the declaration; a name
            // no layer declared is refused by name.
            let mut subset: Vec<String> = declared.iter().rev().step_by(2).cloned().collect();
            units.sort_forward(&mut subset).unwrap();
            let want: Vec<String> = declared
                .iter()
                .filter(|n| subset.contains(n))
                .cloned()
                .collect();
            assert_eq!(subset, want, "{case}");
            let mut bad = vec!["backbone.register_tokens".to_string()];
            let e = units.sort_forward(&mut bad).unwrap_err();
            assert!(e.to_string().contains("backbone.register_tokens"), "{e}");
        }
    }
    // DINOv2's register tokens are declared with the embeddings, after the position embedding.
    let vs = nn::VarStore::new(Device::Cpu);
    let mut vit = VitConfig::new(Arch::VitTiny, 16, 3).with_registers(4);
    vit.depth = 1;
    let net = MultiCropNet::new(&vs.root(), vit, HeadConfig::new(192, 64, false, true));
    let declared: Vec<String> = net.units().forward_order().map(str::to_string).collect();
    assert_eq!(
        declared[2..5],
        [
            "backbone.cls_token",
            "backbone.pos_embed",
            "backbone.register_tokens"
        ]
    );
    assert_eq!(declared.len(), vs.variables().len());
}
