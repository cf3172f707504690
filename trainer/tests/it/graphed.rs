//! `train.cuda_graphs`: the static step a CUDA graph captures (device-tensor schedules, centre
//! updated in place, outputs read after the step) against the eager step. On the CPU it runs
//! without capture, so its arithmetic is checked here; the capture itself is checked on a GPU
//! by scripts/device-check.sh.
use super::util::{max_abs_diff, torch_rng_lock};
use tch::{Device, Kind, Tensor};
use trainer::config::Config;
use trainer::train::graphed::{unsupported, GraphedStep};
use trainer::train::step::{Learner, StepParams};
use trainer::train::strategy::SingleProcess;

/// A ViT-tiny on 4 channels and 32/16 px crops; `train` is the `train:` block (fp32 unless it
/// names a precision).
fn config(train: &str) -> Config {
    let precision = if train.contains("precision") {
        ""
    } else {
        "  precision: fp32\n"
    };
    Config::from_yaml(
        &format!("data:\n  channel_names: [a, b, c, d]\n  channel_combinations: [\"0123\"]\nmodel:\n  arch: vit_tiny\n  out_dim: 256\naugment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 2\ntrain:\n{precision}{train}"),
        "test",
    )
    .unwrap()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// Six steps, the last layer frozen for the first two (a change of the step's kernels, which
/// on a GPU means a new capture), drop path on, clipping on: the losses, gradient norms,
/// collapse signals, weights, AdamW state and loss centre of the static step stay within float
/// rounding of the eager step's (the device-tensor AdamW divides by the step size where the
/// eager one multiplies, PyTorch's capturable op order).
#[test]
fn static_step_trains_like_the_eager_step_on_the_cpu() {
    let _rng = torch_rng_lock();
    let cfg = config("");
    let mut eager = Learner::from_config(&cfg, 4, Device::Cpu).unwrap();
    let mut graphed = Learner::from_config(&cfg, 4, Device::Cpu).unwrap();
    let mut step = GraphedStep::new(Device::Cpu);
    let mut single = SingleProcess::default();
    tch::manual_seed(7);
    for it in 0..6 {
        let crops: Vec<Tensor> = [32, 32, 16, 16]
            .iter()
            .map(|&s| Tensor::randn([3, 4, s, s], (Kind::Float, Device::Cpu)))
            .collect();
        let p = StepParams {
            lr: 1e-3 * (it + 1) as f64,
            weight_decay: 0.04 + 0.01 * it as f64,
            momentum: 0.99 + 0.001 * it as f64,
            epoch: 0,
            freeze_last_layer: it < 2,
            clip_grad: 3.0,
            rng_seed: 100 + it as i64,
            channels: None,
            teacher_channels: None,
        };
        let a = eager.step(&crops, p, it, &mut single).unwrap();
        let b = step.step(&mut graphed, &crops, p, it).unwrap();
        assert!(!step.replaying(), "a CPU never captures");
        assert!(
            rel(b.loss, a.loss) < 1e-5,
            "step {it}: {} vs {}",
            b.loss,
            a.loss
        );
        assert_eq!(a.grad_norms.len(), b.grad_norms.len());
        for (x, y) in a.grad_norms.iter().zip(&b.grad_norms) {
            assert!(rel(*y, *x) < 1e-4, "step {it}: norm {y} vs {x}");
        }
        let (sa, sb) = (a.teacher.stats(), b.teacher.stats());
        assert!(
            max_abs_diff(&sa.entropy_sum, &sb.entropy_sum) < 1e-3,
            "step {it}"
        );
        assert_eq!(a.terms.0.len(), b.terms.0.len());
    }
    let diff = |x: &tch::nn::VarStore, y: &tch::nn::VarStore| {
        let (x, y) = (x.variables(), y.variables());
        x.iter()
            .map(|(k, v)| max_abs_diff(v, &y[k]))
            .fold(0.0, f64::max)
    };
    let student = diff(&eager.nets.student_vs, &graphed.nets.student_vs);
    let teacher = diff(&eager.nets.teacher_vs, &graphed.nets.teacher_vs);
    // Adam turns a gradient at rounding level into a step of about lr, so a few weights may
    // differ by a small fraction of lr (1e-3..6e-3 here); the update itself is checked to
    // rounding in `device_adamw_and_ema_equal_the_scalar_ones_to_rounding`.
    assert!(student < 1e-4 && teacher < 1e-5, "{student} {teacher}");
    // Weights moved: the comparison is not between two untouched copies.
    let init = Learner::from_config(&cfg, 4, Device::Cpu).unwrap();
    assert!(diff(&init.nets.student_vs, &graphed.nets.student_vs) > 1e-3);
    for (x, y) in eager.optimizer.params.iter().zip(&graphed.optimizer.params) {
        assert_eq!((&x.name, x.step), (&y.name, y.step));
        assert!(
            max_abs_diff(&x.exp_avg_sq, &y.exp_avg_sq) < 1e-7,
            "{}",
            x.name
        );
    }
    // The last layer was frozen for two steps: four updates.
    assert!(graphed.optimizer.params.iter().any(|q| q.step == 4));
    assert!(graphed.optimizer.params.iter().any(|q| q.step == 6));
    let centre = |l: &Learner| l.terms.dino().loss.center.shallow_clone();
    assert!(max_abs_diff(&centre(&eager), &centre(&graphed)) < 1e-6);
}

/// One AdamW update and one EMA with the values in device tensors against the host-scalar
/// versions the eager step uses, same inputs: equal to float rounding (a wrong weight decay or
/// bias correction would be off by about lr·wd·|θ| = 4e-5 here).
#[test]
fn device_adamw_and_ema_equal_the_scalar_ones_to_rounding() {
    use trainer::foreach::{ema, ema_from_device, AdamwDeviceValues, AdamwGroup};
    let _rng = torch_rng_lock();
    tch::manual_seed(3);
    let opts = (Kind::Float, Device::Cpu);
    let shapes: [&[i64]; 3] = [&[8, 5], &[5], &[3, 4, 2]];
    let make = || -> Vec<[Tensor; 4]> {
        shapes
            .iter()
            .map(|s| {
                [
                    Tensor::randn(*s, opts),
                    Tensor::randn(*s, opts) * 0.1,
                    Tensor::randn(*s, opts) * 0.01,
                    Tensor::rand(*s, opts) * 1e-4,
                ]
            })
            .collect()
    };
    let a = make();
    let b: Vec<[Tensor; 4]> = a.iter().map(|t| t.each_ref().map(Tensor::copy)).collect();
    let group = |ts: &[[Tensor; 4]]| {
        let mut g = AdamwGroup::default();
        for (i, [p, grad, m, v]) in ts.iter().enumerate() {
            let step = 3 + i as u64;
            g.push(
                p.shallow_clone(),
                grad.shallow_clone(),
                m.shallow_clone(),
                v.shallow_clone(),
                step,
            );
        }
        g
    };
    let (lr, wd) = (1e-3, 0.04);
    let (ga, gb) = (group(&a), group(&b));
    tch::no_grad(|| ga.update(lr, wd));
    let (steps, bc2) = gb.bias_corrections(lr);
    let decay = Tensor::from_slice(&[(1.0 - lr * wd) as f32]).reshape([]);
    tch::no_grad(|| {
        gb.update_from_device(&AdamwDeviceValues {
            decay: &decay,
            step_size: &Tensor::from_slice(&steps),
            bc2_sqrt: &Tensor::from_slice(&bc2),
        })
    });
    for (x, y) in a.iter().zip(&b) {
        for k in 0..4 {
            let d = max_abs_diff(&x[k], &y[k]);
            assert!(d < 1e-6, "tensor {k}: {d}");
        }
        // The update happened (by about lr per element).
        assert!(max_abs_diff(&x[0], &(&x[0] * 0.0)) > 0.0);
    }
    let moved = a.iter().map(|x| x[0].shallow_clone()).collect::<Vec<_>>();
    let before = make()
        .into_iter()
        .map(|x| x[0].shallow_clone())
        .collect::<Vec<_>>();
    let ea: Vec<Tensor> = before.iter().map(Tensor::copy).collect();
    let eb: Vec<Tensor> = before.iter().map(Tensor::copy).collect();
    let m = 0.996;
    tch::no_grad(|| {
        ema(&ea, &moved, m);
        ema_from_device(
            &eb,
            &moved,
            &Tensor::from_slice(&[m as f32]).reshape([]),
            &Tensor::from_slice(&[(1.0 - m) as f32]).reshape([]),
        );
    });
    for (x, y) in ea.iter().zip(&eb) {
        assert_eq!(max_abs_diff(x, y), 0.0, "EMA rounds as the scalar version");
    }
}

/// The one reason a run gives for training without graphs, in the order a user fixes them.
#[test]
fn unsupported_names_why_a_step_is_not_captured() {
    let cuda = Device::Cuda(0);
    let plain = config("");
    assert!(unsupported(&plain, Device::Cpu, 1).unwrap().contains("CPU"));
    let built = trainer::cuda_graph::built_with_cuda();
    assert_eq!(unsupported(&plain, cuda, 1).is_none(), built);
    if !built {
        assert!(unsupported(&plain, cuda, 1)
            .unwrap()
            .contains("`cuda` feature"));
    }
    for (extra, why) in [
        ("  precision: fp16\n", "fp16 loss scaling"),
        ("  koleo_weight: 0.1\n", "KoLeo"),
        ("  centering: sinkhorn_knopp\n", "Sinkhorn-Knopp"),
    ] {
        let cfg = config(extra);
        let got = trainer::train::graphed::unsupported_step(&cfg, 1);
        assert!(got.is_some_and(|r| r.contains(why)), "{extra}: {got:?}");
    }
    let mut sections = plain.sections();
    sections.augment.global_crop_size = 96;
    sections.train.ibot.weight = 1.0;
    let cfg = Config::from_sections(sections, "test").unwrap();
    let got = trainer::train::graphed::unsupported_step(&cfg, 1);
    assert!(got.is_some_and(|r| r.contains("iBOT")), "{got:?}");
    // The channel mode answers for itself (each term and mode is asked, none is named here).
    for (mode, why) in [
        ("bag", "model.channels: bag"),
        ("tokens", "model.channels: tokens"),
    ] {
        let mut sections = plain.sections();
        sections.model.channels = serde_json::from_value(mode.into()).unwrap();
        let cfg = Config::from_sections(sections, "test").unwrap();
        let got = trainer::train::graphed::unsupported_step(&cfg, 1);
        assert!(got.is_some_and(|r| r.contains(why)), "{mode}: {got:?}");
    }
    let got = trainer::train::graphed::unsupported_step(&plain, 2);
    assert!(got.is_some_and(|r| r.contains("several ranks")), "{got:?}");
    assert_eq!(trainer::train::graphed::unsupported_step(&plain, 1), None);
}
