//! DINO loss: cross-entropy between the sharpened, centred teacher distribution on the two
//! global crops and the student distribution on every other crop (scDINO `DINOLoss`).
use super::loss_term::{LossTerm, StepContext, StudentOutputs, TeacherOutputs, TermInfo};
use crate::config::{Centering, Config};
use crate::distributed::group::DistError;
use crate::distributed::Collective;
use tch::{Kind, Tensor};

/// DINOv2's `sinkhorn_knopp_teacher` iterations.
pub const SINKHORN_ITERATIONS: usize = 3;

/// The teacher targets of one step: `softmax((teacher − center) / temp)` (EMA centring), or
/// the Sinkhorn-Knopp assignment itself.
pub enum TeacherTargets {
    Centred {
        teacher: Tensor,
        center: Tensor,
        temp: f64,
    },
    /// `[2·B, K]` rows of probabilities.
    Assigned(Tensor),
}

impl TeacherTargets {
    /// The collapse signals of this process's rows, as tensors on the step's device (no sync).
    pub fn stats(&self) -> TeacherStats {
        tch::no_grad(|| {
            let (logits, rows) = match self {
                TeacherTargets::Centred {
                    teacher,
                    center,
                    temp,
                } => (
                    (teacher.to_kind(Kind::Float) - center) / *temp,
                    teacher.size()[0],
                ),
                // log q, with 0·log 0 = 0 below through the clamp.
                TeacherTargets::Assigned(q) => (q.clamp_min(1e-30).log(), q.size()[0]),
            };
            let log_p = logits.log_softmax(-1, Kind::Float);
            let entropy = -(log_p.exp() * &log_p).sum_dim_intlist(-1, false, Kind::Float);
            let out_dim = logits.size()[1];
            let usage = logits
                .argmax(-1, false)
                .bincount::<Tensor>(None, out_dim)
                .to_kind(Kind::Float);
            TeacherStats {
                entropy_sum: entropy.sum(Kind::Double).reshape([1]),
                usage,
                rows,
            }
        })
    }
}

/// One step's teacher-side collapse signals on this process, as tensors.
pub struct TeacherStats {
    /// Σ over rows of the entropy (nats) of the centred, sharpened teacher distribution, `[1]`.
    pub entropy_sum: Tensor,
    /// How many rows had each prototype as their argmax, `[out_dim]`.
    pub usage: Tensor,
    /// Teacher rows (2 global crops × batch) on this process.
    pub rows: i64,
}

pub struct DinoLoss {
    /// Running mean of teacher outputs, `[1, out_dim]`; subtracted before the softmax so no
    /// prototype dominates (collapse prevention).
    pub center: Tensor,
    student_temp: f64,
    center_momentum: f64,
    ncrops: i64,
    teacher_temps: Vec<f64>,
}

impl DinoLoss {
    pub fn new(out_dim: i64, ncrops: usize, teacher_temps: Vec<f64>, device: tch::Device) -> Self {
        Self {
            center: Tensor::zeros([1, out_dim], (Kind::Float, device)),
            student_temp: 0.1,
            center_momentum: 0.9,
            ncrops: ncrops as i64,
            teacher_temps,
        }
    }

    /// The teacher temperature of `epoch` (the last one past the schedule's end).
    pub fn teacher_temp(&self, epoch: usize) -> f64 {
        let last = self.teacher_temps.len().saturating_sub(1);
        self.teacher_temps[epoch.min(last)]
    }

    /// `student`: `[ncrops·B, K]`, `teacher`: `[2·B, K]` (detached) → scalar loss.
    /// Does not touch the centre; call [`DinoLoss::update_center`] after it.
    pub fn forward(&self, student: &Tensor, teacher: &Tensor, epoch: usize) -> Tensor {
        let temp = self.teacher_temp(epoch);
        let targets = ((teacher - &self.center) / temp).softmax(-1, Kind::Float);
        self.forward_targets(student, &targets)
    }

    /// The loss against given teacher targets `[2·B, K]` (probabilities; e.g. the
    /// Sinkhorn-Knopp assignment).
    pub fn forward_targets(&self, student: &Tensor, targets: &Tensor) -> Tensor {
        let student_out = (student / self.student_temp).chunk(self.ncrops, 0);
        let teacher_out = targets.detach().chunk(2, 0);
        let mut total: Option<Tensor> = None;
        let mut terms = 0;
        for (iq, q) in teacher_out.iter().enumerate() {
            for (v, s) in student_out.iter().enumerate() {
                if v == iq {
                    continue;
                }
                let loss = (-q * s.log_softmax(-1, Kind::Float))
                    .sum_dim_intlist(-1, false, Kind::Float)
                    .mean(Kind::Float);
                total = Some(match total {
                    None => loss,
                    Some(t) => t + loss,
                });
                terms += 1;
            }
        }
        total.expect("at least one loss term (ncrops ≥ 2)") / terms as f64
    }

    /// The teacher side of this step's loss, kept for collapse detection: handles to the
    /// teacher output and to the centre before its update (the update makes a new tensor), so
    /// nothing is computed unless the step is logged ([`TeacherTargets::stats`]).
    pub fn targets(&self, teacher: &Tensor, epoch: usize) -> TeacherTargets {
        TeacherTargets::Centred {
            teacher: teacher.shallow_clone(),
            center: self.center.shallow_clone(),
            temp: self.teacher_temp(epoch),
        }
    }

    /// EMA of the mean teacher output over all processes of `group`.
    pub fn update_center(
        &mut self,
        teacher: &Tensor,
        group: &mut dyn Collective,
    ) -> Result<(), DistError> {
        tch::no_grad(|| {
            let mut batch_center = teacher.sum_dim_intlist(0, true, Kind::Float);
            group.all_reduce_sum(&mut batch_center)?;
            let rows = teacher.size()[0] as f64 * group.world_size() as f64;
            let batch_center = batch_center / rows;
            self.center =
                &self.center * self.center_momentum + batch_center * (1.0 - self.center_momentum);
            Ok(())
        })
    }
}

/// The DINO (CLS) term of the step's loss: [`DinoLoss`] against the teacher's EMA-centred
/// softmax or (`train.centering: sinkhorn_knopp`) its Sinkhorn-Knopp assignment. Its teacher
/// targets are what the collapse detector reads.
pub struct DinoTerm {
    pub loss: DinoLoss,
    pub centering: Centering,
    /// This step's Sinkhorn-Knopp targets, between [`LossTerm::targets`] and the update.
    assigned: Option<Tensor>,
    /// The teacher targets of the last update, until the step takes them.
    collapse_targets: Option<TeacherTargets>,
}

impl DinoTerm {
    pub const INFO: TermInfo = TermInfo {
        name: "dino",
        label: "DINO",
        help: "DINO (CLS) term of the last iteration's loss",
    };

    pub fn new(loss: DinoLoss, centering: Centering) -> Self {
        Self {
            loss,
            centering,
            assigned: None,
            collapse_targets: None,
        }
    }

    /// `model.out_dim` prototypes, the crops of `augment`, the teacher temperature schedule
    /// and the centring of `train`.
    pub fn from_config(cfg: &Config, device: tch::Device) -> Self {
        let t = &cfg.train;
        let temps = super::schedule::teacher_temp_schedule(
            t.warmup_teacher_temp,
            t.teacher_temp,
            t.warmup_teacher_temp_epochs,
            t.epochs,
        );
        let ncrops = 2 + cfg.augment.local_crops_number;
        let loss = DinoLoss::new(cfg.model.out_dim as i64, ncrops, temps, device);
        Self::new(loss, t.centering)
    }

    /// The teacher targets of the last step's loss (once).
    pub fn take_collapse_targets(&mut self) -> Option<TeacherTargets> {
        self.collapse_targets.take()
    }
}

impl LossTerm for DinoTerm {
    fn uncapturable(&self) -> Option<&'static str> {
        (self.centering == Centering::SinkhornKnopp)
            .then_some("Sinkhorn-Knopp centring is not part of the captured step yet")
    }
    fn info(&self) -> &'static TermInfo {
        &Self::INFO
    }

    fn targets(
        &mut self,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
        group: &mut dyn Collective,
    ) -> Result<(), DistError> {
        self.assigned = match self.centering {
            Centering::SinkhornKnopp => Some(sinkhorn_knopp(
                &teacher.logits,
                ctx.teacher_temp,
                SINKHORN_ITERATIONS,
                group,
            )?),
            Centering::Ema => None,
        };
        Ok(())
    }

    fn value(
        &self,
        student: &StudentOutputs,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
    ) -> Tensor {
        match &self.assigned {
            Some(q) => self.loss.forward_targets(&student.logits, q),
            None => self
                .loss
                .forward(&student.logits, &teacher.logits, ctx.epoch),
        }
    }

    /// Keeps the targets the loss used (before the centre moves), then moves the EMA centre.
    fn update(
        &mut self,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
        group: &mut dyn Collective,
    ) -> Result<(), DistError> {
        self.collapse_targets = Some(match self.assigned.take() {
            Some(q) => TeacherTargets::Assigned(q),
            None => {
                let targets = self.loss.targets(&teacher.logits, ctx.epoch);
                self.loss
                    .update_center(&teacher.logits.to_kind(Kind::Float), group)?;
                targets
            }
        });
        Ok(())
    }

    fn state(&self) -> Vec<(&'static str, Tensor)> {
        vec![("dino_loss.center", self.loss.center.shallow_clone())]
    }
}

/// DINOv2's `sinkhorn_knopp_teacher` (`dinov2/loss/dino_clstoken_loss.py`): the teacher
/// outputs `[rows, K]` of this rank become an assignment `[rows, K]` whose columns
/// (prototypes) carry equal mass over the global batch and whose rows sum to 1, in fp32, with
/// the total and the per-prototype sums all-reduced over `group`'s ranks. On one process the
/// all-reduce is the identity (DINOv2 crashed there without a process group, dinov2 #360).
pub fn sinkhorn_knopp(
    teacher: &Tensor,
    temp: f64,
    iterations: usize,
    group: &mut dyn Collective,
) -> Result<Tensor, DistError> {
    tch::no_grad(|| {
        // Q is K × B, as in the paper.
        let mut q = (teacher.to_kind(Kind::Float) / temp).exp().tr();
        let b = q.size()[1] as f64 * group.world_size() as f64;
        let k = q.size()[0] as f64;
        let mut sum = q.sum(Kind::Float).reshape([1]);
        group.all_reduce_sum(&mut sum)?;
        q /= sum;
        for _ in 0..iterations {
            let mut rows = q.sum_dim_intlist(1, true, Kind::Float);
            group.all_reduce_sum(&mut rows)?;
            q = q / rows / k;
            let cols = q.sum_dim_intlist(0, true, Kind::Float);
            q = q / cols / b;
        }
        Ok((q * b).tr())
    })
}
