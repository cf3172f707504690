//! One DINO iteration, in scDINO's order (main_dino.py `train_one_epoch`): teacher on the
//! global crops, student on all crops, loss (+ centre update), finite check, backward,
//! per-parameter clipping, last-layer freeze, AdamW step, teacher EMA.
use super::loss::{Collective, DinoLoss};
use super::optim::{clip_gradients, ema_update, AdamW};
use crate::config::Config;
use crate::model::{configs_for, MultiCropNet};
use tch::{nn, Device, Tensor};

/// Student and teacher with their variable stores. The teacher starts as a copy of the
/// student and never receives gradients.
pub struct Networks {
    pub student_vs: nn::VarStore,
    pub student: MultiCropNet,
    pub teacher_vs: nn::VarStore,
    pub teacher: MultiCropNet,
}

impl Networks {
    pub fn new(cfg: &Config, in_chans: usize, device: Device) -> Self {
        let student_vs = nn::VarStore::new(device);
        let (vit, head) = configs_for(cfg, in_chans, true);
        let student = MultiCropNet::new(&student_vs.root(), vit, head);
        let mut teacher_vs = nn::VarStore::new(device);
        let (vit_t, head_t) = configs_for(cfg, in_chans, false);
        let teacher = MultiCropNet::new(&teacher_vs.root(), vit_t, head_t);
        teacher_vs
            .copy(&student_vs)
            .expect("teacher and student share variable names");
        teacher_vs.freeze();
        Self {
            student_vs,
            student,
            teacher_vs,
            teacher,
        }
    }
}

/// The per-iteration values of the schedules.
#[derive(Debug, Clone, Copy)]
pub struct StepParams {
    pub lr: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    pub epoch: usize,
    /// True while `epoch < freeze_last_layer`: the head's last layer gets no update.
    pub freeze_last_layer: bool,
    /// Per-parameter gradient norm limit; 0 disables clipping.
    pub clip_grad: f64,
    /// Seeds libtorch's generator (drop path) so a resumed run draws what a straight one would.
    pub rng_seed: i64,
}

#[derive(Debug, thiserror::Error)]
#[error("loss is {loss} at epoch {epoch}, iteration {iteration}; stopping (the last checkpoint is kept)")]
pub struct NonFiniteLoss {
    pub loss: f64,
    pub epoch: usize,
    pub iteration: usize,
}

pub struct StepOutput {
    pub loss: f64,
    /// Gradient norms before clipping, one per parameter with a gradient.
    pub grad_norms: Vec<f64>,
}

/// `crops`: `[global1, global2, local1, ...]`, each `[B, C, H, W]`; `group` feeds the loss
/// centre update.
pub fn dino_step(
    nets: &Networks,
    optimizer: &mut AdamW,
    loss_fn: &mut DinoLoss,
    crops: &[Tensor],
    p: StepParams,
    iteration: usize,
    group: &mut Collective,
) -> Result<StepOutput, NonFiniteLoss> {
    tch::manual_seed(p.rng_seed);
    let teacher_out = tch::no_grad(|| nets.teacher.forward_t(&crops[..2], true));
    let student_out = nets.student.forward_t(crops, true);
    let loss = loss_fn.forward(&student_out, &teacher_out, p.epoch);
    loss_fn.update_center(&teacher_out, group);
    let loss_value = loss.double_value(&[]);
    if !loss_value.is_finite() {
        return Err(NonFiniteLoss {
            loss: loss_value,
            epoch: p.epoch,
            iteration,
        });
    }
    optimizer.zero_grad();
    loss.backward();
    let grad_norms = if p.clip_grad > 0.0 {
        clip_gradients(&optimizer.params, p.clip_grad)
    } else {
        vec![]
    };
    let frozen = |name: &str| p.freeze_last_layer && name.contains("last_layer");
    optimizer.step(p.lr, p.weight_decay, &frozen);
    ema_update(&nets.teacher_vs, &nets.student_vs, p.momentum);
    Ok(StepOutput {
        loss: loss_value,
        grad_norms,
    })
}
