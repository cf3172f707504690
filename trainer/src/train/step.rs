//! One DINO iteration, in scDINO's order (main_dino.py `train_one_epoch`): teacher on the
//! global crops, student on all crops, loss (+ centre update), finite check, backward,
//! per-parameter clipping, last-layer freeze, AdamW step, teacher EMA; with fp16 the loss is
//! scaled and a step whose gradients overflow is skipped (GradScaler semantics).
use super::ibot::{mask_seed, patch_loss, IbotObjective};
use super::koleo::koleo_loss;
use super::loss::{sinkhorn_knopp, DinoLoss, TeacherTargets};
use super::optim::AdamW;
use crate::config::{Centering, Config, Precision};
use crate::dist::group::DistError;
use crate::dist::Collective;
use crate::model::{configs_for, ibot_head_config, IbotForward, ModelUnits, MultiCropNet};
use crate::precision::{autocast, LossScaler};
use tch::{nn, Device, Tensor};

/// DINOv2's `sinkhorn_knopp_teacher` iterations.
pub const SINKHORN_ITERATIONS: usize = 3;

/// What the parallel strategy (one process, DDP or FSDP; `super::strategy`) does at the points
/// of a step where the strategies differ. Declared here, with the step that calls it, so the
/// step knows no strategy. Every rank calls every method in the same order (several are
/// collectives).
pub trait StepHooks {
    /// The collectives the shared parts use: the loss centre, the global loss, the stop
    /// agreement and the collapse statistics.
    fn collective(&mut self) -> &mut dyn Collective;
    /// Before the teacher's forward (FSDP gathers the teacher's parameters).
    fn before_teacher(&mut self) -> Result<(), StepError> {
        Ok(())
    }
    /// Between the teacher's and the student's forward (FSDP frees the teacher, gathers the
    /// student and arms its backward hooks).
    fn before_student(&mut self) -> Result<(), StepError> {
        Ok(())
    }
    /// After the student's forward and the loss (FSDP reports a failure inside a hook).
    fn after_student(&mut self) -> Result<(), StepError> {
        Ok(())
    }
    /// From the (finite) loss to updated student and teacher: backward, gradients across
    /// ranks, fp16 unscaling, per-parameter clipping, AdamW (last layer frozen while
    /// `p.freeze_last_layer`), loss-scale update and teacher EMA. Returns the gradient norms
    /// before clipping and whether an fp16 overflow skipped the update.
    fn backward_and_update(
        &mut self,
        learner: &mut Learner,
        loss: &Tensor,
        p: &StepParams,
    ) -> Result<(Vec<f64>, bool), StepError>;
    /// After every step, also a failed one (FSDP frees what the step gathered).
    fn end_step(&mut self) -> Result<(), StepError> {
        Ok(())
    }
}

/// Student and teacher with their variable stores. The teacher starts as a copy of the
/// student and never receives gradients.
pub struct Networks {
    pub student_vs: nn::VarStore,
    pub student: MultiCropNet,
    pub teacher_vs: nn::VarStore,
    pub teacher: MultiCropNet,
    /// The student's declared structure (the teacher's has the same names): what the
    /// strategies bucket, shard and freeze by.
    pub units: ModelUnits,
}

impl Networks {
    pub fn new(cfg: &Config, in_chans: usize, device: Device) -> Self {
        let student_vs = nn::VarStore::new(device);
        let (vit, head) = configs_for(cfg, in_chans, true);
        let mut student = MultiCropNet::new(&student_vs.root(), vit, head);
        if let Some(ibot) = ibot_head_config(cfg, &vit, true) {
            student = student.with_ibot_head(&student_vs.root(), ibot);
        }
        let mut teacher_vs = nn::VarStore::new(device);
        let (vit_t, head_t) = configs_for(cfg, in_chans, false);
        let mut teacher = MultiCropNet::new(&teacher_vs.root(), vit_t, head_t);
        if let Some(ibot) = ibot_head_config(cfg, &vit_t, false) {
            teacher = teacher.with_ibot_head(&teacher_vs.root(), ibot);
        }
        teacher_vs
            .copy(&student_vs)
            .expect("teacher and student share variable names");
        teacher_vs.freeze();
        let units = student.units();
        Self {
            student_vs,
            student,
            teacher_vs,
            teacher,
            units,
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
    /// `model.channels: tokens`: the channels this step trains on (hierarchical channel
    /// sampling); None: every channel the crops hold.
    pub channels: Option<ChannelSubset>,
}

/// A set of at most 64 channel indices, ascending (`Copy`, so [`StepParams`] stays plain data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelSubset(u64);

impl ChannelSubset {
    pub fn from_indices(indices: &[i64]) -> Self {
        Self(indices.iter().fold(0u64, |m, &c| {
            assert!((0..64).contains(&c), "channel index {c} out of 0..64");
            m | (1 << c)
        }))
    }

    pub fn indices(&self) -> Vec<i64> {
        (0..64).filter(|c| self.0 >> c & 1 == 1).collect()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("loss is {loss} at epoch {epoch}, iteration {iteration}; stopping (the last checkpoint is kept)")]
pub struct NonFiniteLoss {
    pub loss: f64,
    pub epoch: usize,
    pub iteration: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    NonFinite(#[from] NonFiniteLoss),
    #[error("collective failed (another rank may have died): {0}")]
    Dist(#[from] DistError),
    /// FSDP's gathers, frees and reductions around the forward and backward.
    #[error(transparent)]
    Fsdp(#[from] super::strategy::fsdp_error::FsdpError),
}

/// The parts of a step's loss, each the mean over the ranks: what the progress line shows and
/// what the collapse detector reads (the DINO term alone is a cross-entropy whose teacher
/// entropy it can subtract).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossTerms {
    /// The DINO (CLS) term.
    pub dino: f64,
    /// KoLeo's term, weight included (`train.koleo_weight` > 0).
    pub koleo: Option<f64>,
    /// iBOT's masked-patch term, weight included (`train.ibot`).
    pub ibot: Option<f64>,
}

pub struct StepOutput {
    /// The total loss (the DINO term plus the stabilisers'), mean over the ranks.
    pub loss: f64,
    pub terms: LossTerms,
    /// Gradient norms before clipping, one per parameter with a gradient.
    pub grad_norms: Vec<f64>,
    /// fp16 only: the optimizer step was skipped because a gradient overflowed.
    pub skipped: bool,
    /// The teacher distribution the loss used, for collapse detection.
    pub teacher: TeacherTargets,
}

/// Everything one iteration updates: networks, optimizer state, loss centre and (fp16) the
/// loss scale.
pub struct Learner {
    pub nets: Networks,
    pub optimizer: AdamW,
    pub loss: DinoLoss,
    pub precision: Precision,
    /// Present for fp16 only.
    pub scaler: Option<LossScaler>,
    pub device: Device,
    /// `train.koleo_weight` (0: off, the default of [`Learner::new`]).
    pub koleo_weight: f64,
    /// `train.centering` (EMA, the default of [`Learner::new`]).
    pub centering: Centering,
    /// `train.ibot` (None: off, the default of [`Learner::new`]). The networks must have
    /// been built for it (mask token, and the separate head if asked for).
    pub ibot: Option<IbotObjective>,
}

impl Learner {
    pub fn new(nets: Networks, loss: DinoLoss, precision: Precision, device: Device) -> Self {
        let optimizer = AdamW::new(&nets.student_vs);
        Self {
            nets,
            optimizer,
            loss,
            precision,
            scaler: (precision == Precision::Fp16).then(LossScaler::default),
            device,
            koleo_weight: 0.0,
            centering: Centering::Ema,
            ibot: None,
        }
    }

    /// One iteration. `crops`: `[global1, global2, local1, ...]`, each `[B, C, H, W]`. The
    /// computation is the same for every strategy; `strategy` moves parameters around the
    /// forwards and does the backward and update (see [`StepHooks`]).
    pub fn step(
        &mut self,
        crops: &[Tensor],
        p: StepParams,
        iteration: usize,
        strategy: &mut dyn StepHooks,
    ) -> Result<StepOutput, StepError> {
        tch::manual_seed(p.rng_seed);
        let result = self.step_phases(crops, &p, iteration, strategy);
        // Also after a failure, so that a strategy never keeps a step's buffers.
        let end = strategy.end_step();
        let out = result?;
        end?;
        Ok(out)
    }

    fn step_phases(
        &mut self,
        crops: &[Tensor],
        p: &StepParams,
        iteration: usize,
        strategy: &mut dyn StepHooks,
    ) -> Result<StepOutput, StepError> {
        // Channel tokens: the step's channel subset, for the teacher and every crop alike.
        let subset = p.channels.map(|c| c.indices());
        let selected: Vec<Tensor>;
        let crops = match &subset {
            Some(idx) => {
                let index = Tensor::from_slice(idx).to_device(crops[0].device());
                selected = crops.iter().map(|c| c.index_select(1, &index)).collect();
                &selected[..]
            }
            None => crops,
        };
        let channels = subset.as_deref();
        let masks = self.ibot_masks(crops, p, strategy.collective().rank());
        strategy.before_teacher()?;
        let teacher = self.teacher_pass(crops, channels, masks.as_ref(), p.epoch, strategy)?;
        strategy.before_student()?;
        let loss = self.student_loss(crops, channels, masks.as_ref(), &teacher, p.epoch);
        strategy.after_student()?;
        let group = strategy.collective();
        let targets = self.update_centres(teacher, p.epoch, group)?;
        let (loss_value, terms) = global_terms(&loss, group)?;
        if !loss_value.is_finite() {
            return Err(NonFiniteLoss {
                loss: loss_value,
                epoch: p.epoch,
                iteration,
            }
            .into());
        }
        let (grad_norms, skipped) = strategy.backward_and_update(self, &loss.total, p)?;
        Ok(StepOutput {
            loss: loss_value,
            terms,
            grad_norms,
            skipped,
            teacher: targets,
        })
    }

    /// iBOT: which patch tokens of this rank's global crops the student sees masked
    /// (`[2·B, tokens]`), None without iBOT.
    fn ibot_masks(&self, crops: &[Tensor], p: &StepParams, rank: usize) -> Option<Tensor> {
        let ibot = self.ibot.as_ref()?;
        let (b, c, h, w) = crops[0].size4().expect("crops are [B, C, H, W]");
        let vit = self.nets.student.backbone.config();
        let grid = ((h / vit.patch_size) as usize, (w / vit.patch_size) as usize);
        let token_channels = if vit.channel_tokens { c as usize } else { 1 };
        let seed = mask_seed(p.rng_seed, rank);
        Some(
            ibot.token_masks(2 * b as usize, grid, token_channels, seed)
                .to_device(crops[0].device()),
        )
    }

    /// The teacher on the global crops and the targets the losses will use: the CLS logits
    /// (EMA-centred later) or their Sinkhorn-Knopp assignment, and with iBOT the masked
    /// patches' logits and targets.
    fn teacher_pass(
        &self,
        crops: &[Tensor],
        channels: Option<&[i64]>,
        masks: Option<&Tensor>,
        epoch: usize,
        strategy: &mut dyn StepHooks,
    ) -> Result<TeacherPass, DistError> {
        let nets = &self.nets;
        let (logits, patch_logits) = autocast(self.precision, self.device, || {
            tch::no_grad(|| match masks {
                Some(m) => {
                    let t = nets
                        .teacher
                        .forward_ibot_t(&crops[..2], m, false, channels, true);
                    (t.logits, Some(t.patch_logits))
                }
                None => (
                    nets.teacher.forward_channels_t(&crops[..2], channels, true),
                    None,
                ),
            })
        });
        // DINOv2's Sinkhorn-Knopp targets instead of the EMA centre (its sums all-reduced).
        let temp = self.loss.teacher_temp(epoch);
        let sk = |t: &Tensor, temp: f64, group: &mut dyn Collective| {
            sinkhorn_knopp(t, temp, SINKHORN_ITERATIONS, group)
        };
        let assigned = match self.centering {
            Centering::SinkhornKnopp => Some(sk(&logits, temp, strategy.collective())?),
            Centering::Ema => None,
        };
        // iBOT's targets for the masked patches, centred as the CLS targets are.
        let patch_targets = match (&self.ibot, &patch_logits) {
            (Some(ibot), Some(t)) => {
                let temp = ibot.teacher_temp.unwrap_or(temp);
                Some(match self.centering {
                    Centering::SinkhornKnopp => sk(t, temp, strategy.collective())?,
                    Centering::Ema => ibot.center.targets(t, temp),
                })
            }
            _ => None,
        };
        Ok(TeacherPass {
            logits,
            assigned,
            patch_logits,
            patch_targets,
        })
    }

    /// The student on every crop and the step's loss: the DINO term, plus iBOT's masked-patch
    /// term and KoLeo's, each weighted.
    fn student_loss(
        &self,
        crops: &[Tensor],
        channels: Option<&[i64]>,
        masks: Option<&Tensor>,
        teacher: &TeacherPass,
        epoch: usize,
    ) -> StepLoss {
        let (nets, loss_fn, ibot) = (&self.nets, &self.loss, self.ibot.as_ref());
        let (dino, cls, ibot_term) = autocast(self.precision, self.device, || {
            let (s, cls, ibot_term) = match (masks, &teacher.patch_targets, ibot) {
                (Some(m), Some(targets), Some(ibot)) => {
                    let IbotForward {
                        logits,
                        cls,
                        patch_logits,
                    } = nets.student.forward_ibot_t(crops, m, true, channels, true);
                    let term = patch_loss(&patch_logits, targets, m, ibot.student_temp);
                    (logits, cls, Some(term * ibot.weight))
                }
                _ => {
                    let (s, cls) = nets.student.forward_with_backbone_t(crops, channels, true);
                    (s, cls, None)
                }
            };
            let dino = match &teacher.assigned {
                Some(q) => loss_fn.forward_targets(&s, q),
                None => loss_fn.forward(&s, &teacher.logits, epoch),
            };
            (dino, cls, ibot_term)
        });
        // DINOv2's KoLeo on each global crop's CLS tokens, per rank, in fp32.
        let koleo = (self.koleo_weight > 0.0).then(|| {
            let b = crops[0].size()[0];
            (koleo_loss(&cls.narrow(0, 0, b)) + koleo_loss(&cls.narrow(0, b, b)))
                * self.koleo_weight
        });
        let total = match &ibot_term {
            Some(term) => dino.to_kind(tch::Kind::Float) + term,
            None => dino.shallow_clone(),
        };
        let total = match &koleo {
            Some(term) => total.to_kind(tch::Kind::Float) + term,
            None => total,
        };
        StepLoss {
            total,
            dino,
            koleo,
            ibot: ibot_term,
        }
    }

    /// Moves the EMA centres (the CLS centre; with iBOT the patch centre) past this step's
    /// teacher outputs, after the targets were taken; returns the CLS targets the loss used,
    /// for the collapse signals.
    fn update_centres(
        &mut self,
        teacher: TeacherPass,
        epoch: usize,
        group: &mut dyn Collective,
    ) -> Result<TeacherTargets, DistError> {
        if let (Some(ibot), Some(t), Centering::Ema) =
            (self.ibot.as_mut(), &teacher.patch_logits, self.centering)
        {
            ibot.center.update(&t.to_kind(tch::Kind::Float), group)?;
        }
        Ok(match teacher.assigned {
            Some(q) => TeacherTargets::Assigned(q),
            None => {
                let targets = self.loss.targets(&teacher.logits, epoch);
                self.loss
                    .update_center(&teacher.logits.to_kind(tch::Kind::Float), group)?;
                targets
            }
        })
    }
}

/// The teacher's side of a step.
struct TeacherPass {
    /// CLS logits of the global crops, `[2·B, K]`.
    logits: Tensor,
    /// Sinkhorn-Knopp targets of those (None: EMA centring).
    assigned: Option<Tensor>,
    /// iBOT: the masked patches' logits `[M, K']` and their targets.
    patch_logits: Option<Tensor>,
    patch_targets: Option<Tensor>,
}

/// The step's loss on this rank: the total the backward runs from, and its terms.
struct StepLoss {
    total: Tensor,
    dino: Tensor,
    koleo: Option<Tensor>,
    ibot: Option<Tensor>,
}

/// The loss and its terms averaged over the ranks. Every rank logs the same values and takes
/// the same finite/NaN decision, so none is left waiting in a collective. The terms travel in
/// the loss's own all-reduce (only when there is more than one).
fn global_terms(
    loss: &StepLoss,
    group: &mut dyn Collective,
) -> Result<(f64, LossTerms), DistError> {
    let mut parts = vec![&loss.total];
    if loss.koleo.is_some() || loss.ibot.is_some() {
        parts.push(&loss.dino);
        parts.extend(loss.koleo.iter());
        parts.extend(loss.ibot.iter());
    }
    let mut parts: Vec<Tensor> = parts
        .into_iter()
        .map(|t| t.detach().to_kind(tch::Kind::Double).reshape([1]))
        .collect();
    let mut global = match parts.len() {
        1 => parts.remove(0),
        _ => Tensor::cat(&parts, 0),
    };
    group.all_reduce_sum(&mut global)?;
    let world = group.world_size() as f64;
    let global: Vec<f64> = Vec::<f64>::try_from(global.to_device(Device::Cpu))
        .expect("the packed loss terms are f64")
        .into_iter()
        .map(|x| x / world)
        .collect();
    let mut rest = global[1..].iter().copied();
    let terms = LossTerms {
        dino: rest.next().unwrap_or(global[0]),
        koleo: loss.koleo.as_ref().and_then(|_| rest.next()),
        ibot: loss.ibot.as_ref().and_then(|_| rest.next()),
    };
    Ok((global[0], terms))
}
