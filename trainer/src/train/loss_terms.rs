//! The step's loss as a named list of terms: the DINO term (always), and the stabilisers a
//! config turns on (KoLeo, iBOT, the channel tokens' DINO term, DiChaViT's channel and token
//! diversification). Each kind of term is one type implementing [`LossTerm`] in its own file,
//! registered once in [`KINDS`]; the step sums the list and all-reduces its values, telemetry
//! shows them by name (progress line, TensorBoard, Prometheus), checkpoints hold their running
//! state under its own names, and the collapse detector reads the DINO term by name.
//! docs/architecture.md lists where a new term goes.
use super::channel_dino::ChannelDinoTerm;
use super::dichavit::{ChannelDiversityTerm, TokenDiversityTerm};
use super::ibot::IbotObjective;
use super::koleo::KoLeoTerm;
use super::loss::{DinoTerm, TeacherTargets};
pub use super::loss_term::{
    LossTerm, MaskRequest, StepContext, StudentOutputs, TeacherOutputs, TermInfo, TokenStep,
};
use crate::config::Config;
use crate::distributed::group::DistError;
use crate::distributed::Collective;
use std::any::Any;
use tch::{Device, Tensor};

/// A kind of term: the term `cfg` asks for, None when its section leaves it off.
type TermKind = fn(&Config, Device) -> Option<Box<dyn LossTerm>>;

/// Every kind of term, in the order the step all-reduces them and telemetry shows them.
const KINDS: &[TermKind] = &[
    |cfg, device| Some(Box::new(DinoTerm::from_config(cfg, device))),
    |cfg, _| KoLeoTerm::from_config(cfg).map(|t| Box::new(t) as Box<dyn LossTerm>),
    |cfg, device| IbotObjective::from_config(cfg, device).map(|t| Box::new(t) as Box<dyn LossTerm>),
    |cfg, device| {
        ChannelDinoTerm::from_config(cfg, device).map(|t| Box::new(t) as Box<dyn LossTerm>)
    },
    |cfg, _| ChannelDiversityTerm::from_config(cfg).map(|t| Box::new(t) as Box<dyn LossTerm>),
    |cfg, _| TokenDiversityTerm::from_config(cfg).map(|t| Box::new(t) as Box<dyn LossTerm>),
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
