//! The step's loss as a named list of terms: the DINO term (always), and the stabilisers a
//! config turns on (KoLeo, iBOT). Each kind of term is one type implementing [`LossTerm`] in
//! its own file, registered once in [`KINDS`]; the step sums the list and all-reduces its
//! values, telemetry shows them by name (progress line, TensorBoard, Prometheus), checkpoints
//! hold their running state under its own names, and the collapse detector reads the DINO
//! term by name. docs/architecture.md lists where a new term goes.
use super::ibot::IbotObjective;
use super::koleo::KoLeoTerm;
use super::loss::{DinoTerm, TeacherTargets};
use crate::config::Config;
use crate::dist::group::DistError;
use crate::dist::Collective;
use std::any::Any;
use tch::{Device, Tensor};

/// How a term is named wherever it is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermInfo {
    /// The key: `{name}_loss` in JSON logs, `train/{name}_loss` in TensorBoard,
    /// `scdino_train_{name}_loss` in Prometheus.
    pub name: &'static str,
    /// The progress line's label (`= DINO 6.22 + KoLeo -0.31`).
    pub label: &'static str,
    /// The Prometheus gauge's help text.
    pub help: &'static str,
}

/// The teacher's outputs on the two global crops, as the step's forward gives them.
pub struct TeacherOutputs {
    /// CLS logits, `[2·B, K]`.
    pub logits: Tensor,
    /// With masks: the masked patches' logits `[M, K']` (the unmasked crop's tokens there).
    pub patch_logits: Option<Tensor>,
}

/// The student's outputs on every crop.
pub struct StudentOutputs {
    /// Head logits, `[ncrops·B, K]`.
    pub logits: Tensor,
    /// The backbone's CLS tokens, `[ncrops·B, D]` (global crops first).
    pub cls: Tensor,
    /// With masks: the masked patches' logits `[M, K']`.
    pub patch_logits: Option<Tensor>,
}

/// What every term knows of the step it is computed in.
pub struct StepContext<'a> {
    pub epoch: usize,
    /// The DINO teacher temperature of the epoch.
    pub teacher_temp: f64,
    /// Images per crop on this rank.
    pub batch: i64,
    /// The masks the forwards applied (`[2·B, tokens]`), when a term asked for them.
    pub masks: Option<&'a Tensor>,
}

/// What a term that masks patches needs to draw this rank's masks.
pub struct MaskRequest {
    /// Global-crop images on this rank (2·B).
    pub images: usize,
    /// The patch grid of a global crop (rows, columns).
    pub grid: (usize, usize),
    /// Tokens per patch position (ChannelViT: one per channel of the step; 1 otherwise).
    pub token_channels: usize,
    /// The step's generator seed (`StepParams::rng_seed`).
    pub step_seed: i64,
    pub rank: usize,
    pub device: Device,
}

/// One term of the loss. Every rank calls every method in the same order (some are
/// collectives). The phases follow the step: masks before the teacher, targets after it,
/// the value with the student's outputs, then the running state's update.
pub trait LossTerm: Any + Send {
    fn info(&self) -> &'static TermInfo;
    /// True: the value is computed under the precision's autocast, with the student's
    /// forward; false: after it, in fp32 (KoLeo, as DINOv2). The total adds the autocast
    /// terms first, each in list order.
    fn autocast(&self) -> bool {
        true
    }
    /// Patch masks the forwards should apply to the global crops (`[2·B, tokens]`, bool);
    /// at most one term asks for them.
    fn masks(&self, _request: &MaskRequest) -> Option<Tensor> {
        None
    }
    /// After the teacher's forward (no gradient): the targets [`LossTerm::value`] will use.
    fn targets(
        &mut self,
        _teacher: &TeacherOutputs,
        _ctx: &StepContext,
        _group: &mut dyn Collective,
    ) -> Result<(), DistError> {
        Ok(())
    }
    /// This rank's value of the term, weight included: a differentiable scalar.
    fn value(
        &self,
        student: &StudentOutputs,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
    ) -> Tensor;
    /// After the value: moves the running state (centres) past this step's teacher outputs.
    fn update(
        &mut self,
        _teacher: &TeacherOutputs,
        _ctx: &StepContext,
        _group: &mut dyn Collective,
    ) -> Result<(), DistError> {
        Ok(())
    }
    /// The running state checkpoints hold, under DINOv2's names; the tensors share the
    /// term's storage, so a restore copies into them.
    fn state(&self) -> Vec<(&'static str, Tensor)> {
        Vec::new()
    }
}

/// A kind of term: the term `cfg` asks for, None when its section leaves it off.
type TermKind = fn(&Config, Device) -> Option<Box<dyn LossTerm>>;

/// Every kind of term, in the order the step all-reduces them and telemetry shows them.
const KINDS: &[TermKind] = &[
    |cfg, device| Some(Box::new(DinoTerm::from_config(cfg, device))),
    |cfg, _| KoLeoTerm::from_config(cfg).map(|t| Box::new(t) as Box<dyn LossTerm>),
    |cfg, device| IbotObjective::from_config(cfg, device).map(|t| Box::new(t) as Box<dyn LossTerm>),
];

/// The terms of a run's loss, the DINO term first.
pub struct LossTerms {
    terms: Vec<Box<dyn LossTerm>>,
}

impl LossTerms {
    /// The terms `cfg` turns on.
    pub fn from_config(cfg: &Config, device: Device) -> Self {
        Self::new(KINDS.iter().filter_map(|kind| kind(cfg, device)).collect())
    }

    /// `terms` as given (their order is the list's); the first must be the DINO term.
    pub fn new(terms: Vec<Box<dyn LossTerm>>) -> Self {
        assert!(
            terms
                .first()
                .is_some_and(|t| (t.as_ref() as &dyn Any).is::<DinoTerm>()),
            "the DINO term comes first"
        );
        Self { terms }
    }

    /// scDINO's loss: the DINO term alone, EMA-centred.
    pub fn dino_only(loss: super::loss::DinoLoss) -> Self {
        Self::new(vec![Box::new(DinoTerm::new(
            loss,
            crate::config::Centering::Ema,
        ))])
    }

    pub fn iter(&self) -> impl Iterator<Item = &dyn LossTerm> {
        self.terms.iter().map(|t| t.as_ref())
    }

    /// The term of type `T`, if the list has one.
    pub fn find<T: LossTerm>(&self) -> Option<&T> {
        self.iter()
            .find_map(|t| (t as &dyn Any).downcast_ref::<T>())
    }

    pub fn find_mut<T: LossTerm>(&mut self) -> Option<&mut T> {
        self.terms
            .iter_mut()
            .find_map(|t| (t.as_mut() as &mut dyn Any).downcast_mut::<T>())
    }

    pub fn dino(&self) -> &DinoTerm {
        self.find().expect("the DINO term is always on")
    }

    /// The DINO teacher temperature of `epoch`.
    pub fn teacher_temp(&self, epoch: usize) -> f64 {
        self.dino().loss.teacher_temp(epoch)
    }

    /// The masks a term asks the forwards to apply.
    pub fn masks(&self, request: &MaskRequest) -> Option<Tensor> {
        self.iter().find_map(|t| t.masks(request))
    }

    /// [`LossTerm::targets`] of every term, in list order.
    pub fn targets(
        &mut self,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
        group: &mut dyn Collective,
    ) -> Result<(), DistError> {
        self.terms
            .iter_mut()
            .try_for_each(|t| t.targets(teacher, ctx, group))
    }

    /// [`LossTerm::update`] of every term, in list order; returns the DINO term's teacher
    /// targets of this step, for collapse detection.
    pub fn update(
        &mut self,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
        group: &mut dyn Collective,
    ) -> Result<TeacherTargets, DistError> {
        for t in &mut self.terms {
            t.update(teacher, ctx, group)?;
        }
        Ok(self
            .find_mut::<DinoTerm>()
            .and_then(DinoTerm::take_collapse_targets)
            .expect("the DINO term keeps its targets at every update"))
    }

    /// Every term's running state, in list order.
    pub fn state(&self) -> Vec<(&'static str, Tensor)> {
        self.iter().flat_map(|t| t.state()).collect()
    }

    /// The values of the terms, in list order: `autocast` picks those computed under
    /// autocast (true) or after it (false); the others are None.
    pub fn values(
        &self,
        autocast: bool,
        student: &StudentOutputs,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
    ) -> Vec<Option<Tensor>> {
        self.iter()
            .map(|t| (t.autocast() == autocast).then(|| t.value(student, teacher, ctx)))
            .collect()
    }
}

/// The values of a step's terms, each the mean over the ranks, in list order: what the
/// progress line, TensorBoard and Prometheus show and the collapse detector reads.
#[derive(Debug, Clone, PartialEq)]
pub struct TermValues(pub Vec<(&'static TermInfo, f64)>);

impl TermValues {
    /// The value of the term called `name`, if it is on.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0
            .iter()
            .find(|(info, _)| info.name == name)
            .map(|&(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static TermInfo, f64)> + '_ {
        self.0.iter().copied()
    }

    /// Whether the loss has more than the DINO term: only then are the terms shown apart
    /// from the total.
    pub fn split(&self) -> bool {
        self.0.len() > 1
    }
}
