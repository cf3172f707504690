//! One loss term's interface: what a term is told about the step and what it answers (its
//! name wherever it is shown, its masks, targets, value, centre updates and checkpointed
//! state). The terms implement it in their own files; [`super::loss_terms`] registers them, so
//! this file imports none of them.
use crate::distributed::group::DistError;
use crate::distributed::Collective;
use crate::model::ChannelPatchEmbed;
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
    /// With `train.channel_dino_weight`: each channel's own token's logits, `[2·B·k, K]` in
    /// (crop, image, channel) order.
    pub channel_logits: Option<Tensor>,
}

/// The student's outputs on every crop.
pub struct StudentOutputs {
    /// Head logits, `[ncrops·B, K]`.
    pub logits: Tensor,
    /// The backbone's CLS tokens, `[ncrops·B, D]` (global crops first).
    pub cls: Tensor,
    /// With masks: the masked patches' logits `[M, K']`.
    pub patch_logits: Option<Tensor>,
    /// With `train.channel_dino_weight`: each channel's own token's logits,
    /// `[ncrops·B·k, K]` in (crop, image, channel) order.
    pub channel_logits: Option<Tensor>,
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
    /// Channel tokens (`model.channels: tokens`): what the student embedded, for DiChaViT's
    /// terms; None for other models.
    pub tokens: Option<TokenStep<'a>>,
}

/// A `tokens` step as DiChaViT's terms see it: the student's patch embedding (the parameters
/// their gradients reach), the step's global crops and the model's index of each of their
/// channels.
#[derive(Clone, Copy)]
pub struct TokenStep<'a> {
    pub embed: &'a ChannelPatchEmbed,
    /// The two global crops, `[B, k, H, W]` each, holding the step's channels only.
    pub global: &'a [Tensor],
    /// The model's channel of each of the crops' k channels, ascending.
    pub channels: &'a [i64],
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
    /// Why a step with this term cannot be captured as a CUDA graph (`train.cuda_graphs`),
    /// or None when it can: the one warning line of such a run gives the first reason.
    fn uncapturable(&self) -> Option<&'static str> {
        None
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
