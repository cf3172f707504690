//! One DINO iteration, in scDINO's order (main_dino.py `train_one_epoch`): teacher on the
//! global crops, student on all crops, loss (+ centre update), finite check, backward,
//! per-parameter clipping, last-layer freeze, AdamW step, teacher EMA; with fp16 the loss is
//! scaled and a step whose gradients overflow is skipped (GradScaler semantics).
use super::loss::TeacherTargets;
use super::loss_terms::{
    LossTerms, MaskRequest, StepContext, StudentOutputs, TeacherOutputs, TermValues, TokenStep,
};
use super::optim::AdamW;
use crate::config::{Config, Precision};
use crate::distributed::group::DistError;
use crate::distributed::Collective;
use crate::model::{
    configs_for, ibot_head_config, CropsForward, IbotForward, ModelUnits, MultiCropNet,
};
use crate::precision::{autocast, LossScaler};
use tch::{nn, Device, Tensor};

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
        if cfg.train.channel_dino_weight > 0.0 {
            student = student.with_channel_tokens_out();
        }
        if let Some(ibot) = ibot_head_config(cfg, &vit, true) {
            student = student.with_ibot_head(&student_vs.root(), ibot);
        }
        let mut teacher_vs = nn::VarStore::new(device);
        let (vit_t, head_t) = configs_for(cfg, in_chans, false);
        let mut teacher = MultiCropNet::new(&teacher_vs.root(), vit_t, head_t);
        if cfg.train.channel_dino_weight > 0.0 {
            teacher = teacher.with_channel_tokens_out();
        }
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
    /// `train.teacher_channels: all`: the channels the teacher sees, a superset of
    /// `channels`; None: the student's.
    pub teacher_channels: Option<ChannelSubset>,
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

/// The channels `idx` (ascending) of each crop (`[B, C, H, W]` → `[B, |idx|, H, W]`); the
/// crops themselves, not a copy, when `idx` is every channel (an all-channel teacher).
fn select_channels(crops: &[Tensor], idx: &[i64]) -> Vec<Tensor> {
    if idx.len() as i64 == crops[0].size()[1] {
        return crops.iter().map(Tensor::shallow_clone).collect();
    }
    let index = Tensor::from_slice(idx).to_device(crops[0].device());
    crops.iter().map(|c| c.index_select(1, &index)).collect()
}

/// The student's patch masks (`[I, k·N]`, channel-major over its channels `student`) laid
/// out over the teacher's channels `teacher` (a superset, ascending): the same positions
/// masked in the student's channels, none in the others. The masked tokens come in the same
/// row-major order on both sides, so the teacher's targets line up with the student's
/// predictions.
fn masks_among(masks: &Tensor, student: &[i64], teacher: &[i64]) -> Tensor {
    let (images, k) = (masks.size()[0], student.len() as i64);
    let per_channel = masks.reshape([images, k, -1]);
    let positions: Vec<i64> = student
        .iter()
        .map(|c| {
            teacher
                .iter()
                .position(|t| t == c)
                .expect("the teacher sees every channel of the student") as i64
        })
        .collect();
    let index = Tensor::from_slice(&positions).to_device(masks.device());
    per_channel
        .zeros_like()
        .narrow(1, 0, 1)
        .repeat([1, teacher.len() as i64, 1])
        .index_copy(1, &index, &per_channel)
        .flatten(1, 2)
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
    /// `train.cuda_graphs`: a capture or replay failed.
    #[error(transparent)]
    Graph(#[from] crate::cuda_graph::GraphError),
}

pub struct StepOutput {
    /// The total loss (the sum of the terms), mean over the ranks.
    pub loss: f64,
    /// Each term's value, mean over the ranks.
    pub terms: TermValues,
    /// Gradient norms before clipping, one per parameter with a gradient.
    pub grad_norms: Vec<f64>,
    /// fp16 only: the optimizer step was skipped because a gradient overflowed.
    pub skipped: bool,
    /// The teacher distribution the loss used, for collapse detection.
    pub teacher: TeacherTargets,
}

/// Everything one iteration updates: networks, optimizer state, the loss terms (with their
/// centres) and (fp16) the loss scale.
pub struct Learner {
    pub nets: Networks,
    pub optimizer: AdamW,
    pub terms: LossTerms,
    pub precision: Precision,
    /// Present for fp16 only.
    pub scaler: Option<LossScaler>,
    pub device: Device,
}

impl Learner {
    /// `nets` trained on `terms`. The networks must have been built for the terms (iBOT's
    /// mask token, and its separate head if asked for).
    pub fn new(nets: Networks, terms: LossTerms, precision: Precision, device: Device) -> Self {
        let optimizer = AdamW::new(&nets.student_vs);
        Self {
            nets,
            optimizer,
            terms,
            precision,
            scaler: (precision == Precision::Fp16).then(LossScaler::default),
            device,
        }
    }

    /// The learner `cfg` describes, its networks initialised from `run.seed`: what training,
    /// `trainer bench step` and `trainer selftest` step.
    pub fn from_config(
        cfg: &Config,
        in_chans: usize,
        device: Device,
    ) -> Result<Self, crate::precision::PrecisionError> {
        tch::manual_seed(cfg.run.seed as i64);
        crate::precision::check_supported(cfg.train.precision, device)?;
        let nets = Networks::new(cfg, in_chans, device);
        let terms = LossTerms::from_config(cfg, device);
        Ok(Self::new(nets, terms, cfg.train.precision, device))
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
        // Channel tokens: the step's channel subset, for every crop and (unless
        // `train.teacher_channels: all` gives it more) the teacher.
        let subset = p.channels.map(|c| c.indices());
        let teacher_subset = match (p.channels, p.teacher_channels) {
            (Some(student), Some(teacher)) if student != teacher => Some(teacher.indices()),
            _ => None,
        };
        let teacher_crops: Option<Vec<Tensor>> = teacher_subset
            .as_deref()
            .map(|idx| select_channels(&crops[..2], idx));
        let selected: Vec<Tensor>;
        let crops = match &subset {
            Some(idx) => {
                selected = select_channels(crops, idx);
                &selected[..]
            }
            None => crops,
        };
        let channels = subset.as_deref();
        let masks = self.masks(crops, p, strategy.collective().rank());
        let teacher_masks = match (&masks, channels, &teacher_subset) {
            (Some(m), Some(student), Some(t)) => Some(masks_among(m, student, t)),
            _ => None,
        };
        // DiChaViT's terms read the student's channel patch embedding and the step's channels
        // (every channel when the step draws no subset).
        let every: Vec<i64> = match subset {
            Some(_) => Vec::new(),
            None => (0..crops[0].size()[1]).collect(),
        };
        let tokens = self
            .nets
            .student
            .backbone
            .channel_patch_embed()
            .map(|embed| TokenStep {
                embed,
                global: &crops[..2],
                channels: channels.unwrap_or(&every),
            });
        let ctx = StepContext {
            epoch: p.epoch,
            teacher_temp: self.terms.teacher_temp(p.epoch),
            batch: crops[0].size()[0],
            masks: masks.as_ref(),
            tokens,
        };
        strategy.before_teacher()?;
        let teacher = match (&teacher_crops, &teacher_subset) {
            (Some(c), Some(t)) => self.teacher_forward(c, Some(t), teacher_masks.as_ref()),
            _ => self.teacher_forward(crops, channels, ctx.masks),
        };
        self.terms.targets(&teacher, &ctx, strategy.collective())?;
        strategy.before_student()?;
        let loss = self.student_loss(crops, channels, &teacher, &ctx);
        strategy.after_student()?;
        let group = strategy.collective();
        let targets = self.terms.update(&teacher, &ctx, group)?;
        let (loss_value, terms) = self.global_terms(&loss, group)?;
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

    /// The patch masks a term asks for on this rank's global crops (iBOT), None otherwise.
    fn masks(&self, crops: &[Tensor], p: &StepParams, rank: usize) -> Option<Tensor> {
        let (b, c, h, w) = crops[0].size4().expect("crops are [B, C, H, W]");
        let vit = self.nets.student.backbone.config();
        self.terms.masks(&MaskRequest {
            images: 2 * b as usize,
            grid: ((h / vit.patch_size) as usize, (w / vit.patch_size) as usize),
            token_channels: if vit.channel_tokens { c as usize } else { 1 },
            step_seed: p.rng_seed,
            rank,
            device: crops[0].device(),
        })
    }

    /// The teacher on the global crops (with masks: also the masked patches' logits).
    pub(super) fn teacher_forward(
        &self,
        crops: &[Tensor],
        channels: Option<&[i64]>,
        masks: Option<&Tensor>,
    ) -> TeacherOutputs {
        let teacher = &self.nets.teacher;
        autocast(self.precision, self.device, || {
            tch::no_grad(|| match masks {
                Some(m) => {
                    let t = teacher.forward_ibot_t(&crops[..2], m, false, channels, true);
                    TeacherOutputs {
                        logits: t.logits,
                        patch_logits: Some(t.patch_logits),
                        channel_logits: t.channel_logits,
                    }
                }
                None => {
                    let t = teacher.forward_crops_t(&crops[..2], channels, true);
                    TeacherOutputs {
                        logits: t.logits,
                        patch_logits: None,
                        channel_logits: t.channel_logits,
                    }
                }
            })
        })
    }

    /// The student on every crop and the step's loss: the terms computed under autocast
    /// with the forward, the others after it; the total adds them in that order.
    pub(super) fn student_loss(
        &self,
        crops: &[Tensor],
        channels: Option<&[i64]>,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
    ) -> StepLoss {
        let (student, terms) = (&self.nets.student, &self.terms);
        let (outputs, under_autocast) = autocast(self.precision, self.device, || {
            let outputs = match ctx.masks {
                Some(m) => {
                    let IbotForward {
                        logits,
                        cls,
                        patch_logits,
                        channel_logits,
                    } = student.forward_ibot_t(crops, m, true, channels, true);
                    StudentOutputs {
                        logits,
                        cls,
                        patch_logits: Some(patch_logits),
                        channel_logits,
                    }
                }
                None => {
                    let CropsForward {
                        logits,
                        cls,
                        channel_logits,
                    } = student.forward_crops_t(crops, channels, true);
                    StudentOutputs {
                        logits,
                        cls,
                        patch_logits: None,
                        channel_logits,
                    }
                }
            };
            let values = terms.values(true, &outputs, teacher, ctx);
            (outputs, values)
        });
        let after = terms.values(false, &outputs, teacher, ctx);
        let values: Vec<Tensor> = under_autocast
            .into_iter()
            .zip(after)
            .map(|(a, b)| a.or(b).expect("each term is computed once"))
            .collect();
        let order = terms
            .iter()
            .enumerate()
            .filter(|(_, t)| t.autocast())
            .chain(terms.iter().enumerate().filter(|(_, t)| !t.autocast()))
            .map(|(i, _)| i);
        let mut total: Option<Tensor> = None;
        for i in order {
            total = Some(match total {
                None => values[i].shallow_clone(),
                Some(t) => t.to_kind(tch::Kind::Float) + &values[i],
            });
        }
        StepLoss {
            total: total.expect("the DINO term is always on"),
            values,
        }
    }

    /// The loss and its terms averaged over the ranks. Every rank logs the same values and
    /// takes the same finite/NaN decision, so none is left waiting in a collective. The terms
    /// travel in the loss's own all-reduce (only when there is more than one).
    fn global_terms(
        &self,
        loss: &StepLoss,
        group: &mut dyn Collective,
    ) -> Result<(f64, TermValues), DistError> {
        let mut global = loss.packed();
        group.all_reduce_sum(&mut global)?;
        let world = group.world_size() as f64;
        let global: Vec<f64> = Vec::<f64>::try_from(global.to_device(Device::Cpu))
            .expect("the packed loss terms are f64")
            .into_iter()
            .map(|x| x / world)
            .collect();
        Ok(self.term_values(&global))
    }

    /// The loss and its named terms from [`StepLoss::packed`]'s values.
    pub(super) fn term_values(&self, global: &[f64]) -> (f64, TermValues) {
        // One term: its value is the total.
        let values = if global.len() == 1 {
            global
        } else {
            &global[1..]
        };
        let terms = self
            .terms
            .iter()
            .zip(values)
            .map(|(t, &v)| (t.info(), v))
            .collect();
        (global[0], TermValues(terms))
    }
}

/// The step's loss on this rank: the total the backward runs from, and each term's value
/// (in list order).
pub(super) struct StepLoss {
    pub(super) total: Tensor,
    pub(super) values: Vec<Tensor>,
}

impl StepLoss {
    /// The total, then (only when there is more than one) each term, detached as one f64
    /// vector on the loss's device: what the ranks average and the host reads at once.
    pub(super) fn packed(&self) -> Tensor {
        let mut parts = vec![&self.total];
        if self.values.len() > 1 {
            parts.extend(self.values.iter());
        }
        let mut parts: Vec<Tensor> = parts
            .into_iter()
            .map(|t| t.detach().to_kind(tch::Kind::Double).reshape([1]))
            .collect();
        match parts.len() {
            1 => parts.remove(0),
            _ => Tensor::cat(&parts, 0),
        }
    }
}
