//! iBOT's masked-patch loss against DINOv2's definition (tests/py/ibot_reference.py) on fixed
//! inputs: the loss and its gradient, the centred teacher targets, the centre update and the
//! Sinkhorn-Knopp targets of the masked patches.
use super::util::{max_abs_diff, run_python};
use std::collections::HashMap;
use tch::{nn, Device, Kind, Tensor};
use trainer::distributed::Single;
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

/// The student's masked input (DINOv2's `prepare_tokens_with_masks`) and the normed CLS and
/// patch tokens against the reference backbone with a mask token, with and without registers:
/// masked patches become the mask token before positions are added; registers stay out of the
/// patch tokens.
#[test]
fn masked_backbone_matches_the_reference() {
    use trainer::config::Arch;
    use trainer::model::{load_safetensors_strict, VisionTransformer, VitConfig};
    let _rng = super::util::torch_rng_lock();
    for registers in [0usize, 2] {
        let dir = tempfile::tempdir().unwrap();
        let weights = dir.path().join("w.safetensors");
        let out = dir.path().join("out.safetensors");
        run_python(
            r#"
import sys, torch
from safetensors.torch import save_file
from dino_reference import VisionTransformer
torch.manual_seed(0)
registers = int(sys.argv[3])
vit = VisionTransformer("vit_tiny", 16, 3, num_register_tokens=registers, mask_token=True).eval()
with torch.no_grad():
    vit.mask_token.normal_(0, 0.5)
    if registers:
        vit.register_tokens.normal_(0, 0.5)
x = torch.randn(3, 3, 64, 64)
masks = torch.rand(3, 16) < 0.4
masks[2] = False
with torch.no_grad():
    cls, patches = vit.forward_features(x, masks)
    cls0, patches0 = vit.forward_features(x)
save_file({k: v.contiguous() for k, v in vit.state_dict().items()}, sys.argv[1])
save_file({"x": x, "masks": masks.to(torch.uint8), "cls": cls.contiguous(), "patches": patches.contiguous(),
           "cls0": cls0.contiguous(), "patches0": patches0.contiguous()}, sys.argv[2])
"#,
            &[
                weights.to_str().unwrap(),
                out.to_str().unwrap(),
                &registers.to_string(),
            ],
        );
        let mut vs = nn::VarStore::new(Device::Cpu);
        let cfg = VitConfig::new(Arch::VitTiny, 16, 3)
            .with_registers(registers)
            .with_mask_token();
        let vit = VisionTransformer::new(vs.root(), cfg);
        load_safetensors_strict(&mut vs, &weights).expect("the reference's names load");
        let t: HashMap<String, Tensor> = Tensor::read_safetensors(&out)
            .unwrap()
            .into_iter()
            .collect();
        let masks = t["masks"].to_kind(Kind::Bool);
        let (cls, patches) =
            tch::no_grad(|| vit.forward_features_t(&t["x"], None, Some(&masks), false));
        let (cls0, patches0) = tch::no_grad(|| vit.forward_features_t(&t["x"], None, None, false));
        assert_eq!(patches.size(), [3, 16, 192]);
        for (name, ours) in [
            ("cls", &cls),
            ("patches", &patches),
            ("cls0", &cls0),
            ("patches0", &patches0),
        ] {
            let d = max_abs_diff(ours, &t[name]);
            assert!(d < 1e-4, "registers {registers}, {name}: {d}");
        }
        // The masks matter: a masked image's tokens differ from its unmasked ones, the
        // unmasked image's do not.
        assert!(max_abs_diff(&cls.get(0), &cls0.get(0)) > 1e-3);
        assert!(max_abs_diff(&cls.get(2), &cls0.get(2)) < 1e-6);
    }
}
