//! iBOT's masked-patch loss against DINOv2's definition (tests/py/ibot_reference.py) on fixed
//! inputs: the loss and its gradient, the centred teacher targets, the centre update and the
//! Sinkhorn-Knopp targets of the masked patches.
use super::util::{max_abs_diff, run_python};
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};
use trainer::dist::Single;
use trainer::train::ibot::{collate_masks, patch_loss, MaskingGenerator, PatchCenter};
use trainer::train::loss::sinkhorn_knopp;

#[test]
fn patch_loss_targets_and_centre_match_dinov2() {
    let (b, k) = (6usize, 40i64);
    let masks = collate_masks(
        &MaskingGenerator::new(4, 4),
        b,
        0.5,
        (0.1, 0.5),
        &mut scdino_base::rng::SplitMix64::new(5),
    );
    let m = masks.sum(Kind::Int64).int64_value(&[]);
    assert!(m > 0, "no patch masked");
    // Deterministic logits without the process-wide generator.
    let logits = |rows: i64, salt: i64| {
        let v: Vec<f32> = (0..rows * k)
            .map(|i| (((i * 7919 + salt * 104_729) % 1013) as f32 / 1013.0 - 0.5) * 6.0)
            .collect();
        Tensor::from_slice(&v).reshape([rows, k])
    };
    let student = logits(m, 1);
    let teacher = logits(m, 2);
    // A centre that is not zero: one update from other logits first.
    let warm = logits(9, 3);
    let mut centre = PatchCenter::new(k, 0.9, Device::Cpu);
    let mut group = Single;
    centre.update(&warm, &mut group).unwrap();
    let (student_temp, teacher_temp) = (0.1, 0.04);
    let targets = centre.targets(&teacher, teacher_temp);
    let input = student.copy().set_requires_grad(true);
    let loss = patch_loss(&input, &targets, &masks, student_temp);
    loss.backward();
    let sk = sinkhorn_knopp(&teacher, teacher_temp, 3, &mut group).unwrap();
    centre.update(&teacher, &mut group).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.safetensors");
    let out = dir.path().join("out.safetensors");
    Tensor::write_safetensors(
        &[
            ("student", &student),
            ("teacher", &teacher),
            ("warm", &warm),
            ("masks", &masks.to_kind(Kind::Uint8)),
        ],
        &inp,
    )
    .unwrap();
    run_python(
        r#"
import sys, torch
from safetensors.torch import load_file, save_file
from ibot_reference import iBOTPatchLoss
d = load_file(sys.argv[1])
masks = d["masks"].bool()
loss_fn = iBOTPatchLoss(d["student"].shape[1], student_temp=0.1, center_momentum=0.9)
loss_fn.update_center(d["warm"].unsqueeze(0))
t = loss_fn.softmax_center_teacher(d["teacher"].unsqueeze(0), 0.04).squeeze(0)  # as ssl_meta_arch: [1, M, K]
s = d["student"].clone().requires_grad_(True)
loss = loss_fn.forward_masked(s, t, masks)
loss.backward()
sk = loss_fn.sinkhorn_knopp_teacher(d["teacher"], 0.04, torch.tensor(float(masks.sum())))
loss_fn.update_center(d["teacher"].unsqueeze(0))
save_file({"loss": loss.detach().reshape(1), "grad": s.grad, "targets": t.contiguous(),
           "sk": sk.contiguous(), "center": loss_fn.center.reshape(1, -1).contiguous()}, sys.argv[2])
"#,
        &[inp.to_str().unwrap(), out.to_str().unwrap()],
    );
    let t: HashMap<String, Tensor> = Tensor::read_safetensors(&out)
        .unwrap()
        .into_iter()
        .collect();
    let dl = (loss.double_value(&[]) - t["loss"].double_value(&[0])).abs();
    assert!(dl < 1e-5, "loss differs by {dl}");
    assert!(max_abs_diff(&input.grad(), &t["grad"]) < 1e-5);
    assert!(max_abs_diff(&targets, &t["targets"]) < 1e-6);
    assert!(max_abs_diff(&sk, &t["sk"]) < 1e-6);
    assert!(max_abs_diff(&centre.center, &t["center"]) < 1e-6);
    // An image without masked patches adds nothing; with every image masked alike the loss is
    // the plain mean over patches.
    let all = Tensor::ones([2, 3], (Kind::Bool, Device::Cpu));
    let s6 = logits(6, 4);
    let t6 = logits(6, 5).softmax(-1, Kind::Float);
    let mean = -(&t6 * (&s6 / 0.1).log_softmax(-1, Kind::Float))
        .sum_dim_intlist(-1, false, Kind::Float)
        .mean(Kind::Float);
    let ours = patch_loss(&s6, &t6, &all, 0.1);
    assert!((ours.double_value(&[]) - mean.double_value(&[])).abs() < 1e-5);
}
