//! `train.channel_dino_weight`: `bag`'s objective inside a `tokens` model. `bag` trains DINO
//! on each channel's own CLS, every (image, channel) a sample; a `tokens` model trains its
//! per-channel patch tokens only through iBOT and the CLS's attention, and on the PBMC-like
//! cells a dark channel's part of the feature (its mean patch token) ended up barely varying
//! between cells (BENCHMARKS.md, run 14). This term asks each channel's own token — the mean
//! of its patch tokens, what `tokens_pool: cls_and_channels` reads — for the same view
//! invariance the CLS gets: the DINO loss of the student's channel tokens on every crop
//! against the teacher's on the global crops, through the DINO head, with its own centring.
use super::loss::DinoTerm;
use super::loss_term::{LossTerm, StepContext, StudentOutputs, TeacherOutputs, TermInfo};
use crate::config::Config;
use crate::distributed::group::DistError;
use crate::distributed::Collective;
use tch::{Device, Tensor};

/// The channel DINO term: `train.channel_dino_weight` times the DINO term's loss and centring
/// (`train.centering`: an EMA centre of its own, `channel_dino_loss.center`, or Sinkhorn-Knopp
/// over the step's (image, channel) rows of all ranks) applied to the channel tokens' logits
/// ([`StudentOutputs::channel_logits`]) instead of the CLS's, under the same teacher
/// temperatures.
pub struct ChannelDinoTerm {
    /// A DINO term of its own, fed the channel logits as if they were the CLS's.
    pub dino: DinoTerm,
    pub weight: f64,
}

/// The channel logits of one side; the networks give them whenever this term is on.
fn channel_logits<'a>(logits: &'a Option<Tensor>, side: &str) -> &'a Tensor {
    logits.as_ref().unwrap_or_else(|| {
        panic!("the {side}'s channel-token logits are missing: its network was built without train.channel_dino_weight")
    })
}

/// The teacher's channel logits where the DINO term reads the CLS's.
fn teacher_view(teacher: &TeacherOutputs) -> TeacherOutputs {
    TeacherOutputs {
        logits: channel_logits(&teacher.channel_logits, "teacher").shallow_clone(),
        patch_logits: None,
        channel_logits: None,
    }
}

impl ChannelDinoTerm {
    pub const INFO: TermInfo = TermInfo {
        name: "channel_dino",
        label: "channel DINO",
        help: "DINO term of each channel's own token (train.channel_dino_weight, weighted) of the last iteration's loss",
    };

    /// The term `train.channel_dino_weight` asks for (the DINO term's prototypes, crops,
    /// temperatures and centring); None at 0 (off).
    pub fn from_config(cfg: &Config, device: Device) -> Option<Self> {
        let weight = cfg.train.channel_dino_weight;
        (weight > 0.0).then(|| Self {
            dino: DinoTerm::from_config(cfg, device),
            weight,
        })
    }
}

impl LossTerm for ChannelDinoTerm {
    fn info(&self) -> &'static TermInfo {
        &Self::INFO
    }

    fn uncapturable(&self) -> Option<&'static str> {
        Some("train.channel_dino_weight: the channel tokens change per step")
    }

    fn targets(
        &mut self,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
        group: &mut dyn Collective,
    ) -> Result<(), DistError> {
        self.dino.targets(&teacher_view(teacher), ctx, group)
    }

    fn value(
        &self,
        student: &StudentOutputs,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
    ) -> Tensor {
        let student = StudentOutputs {
            logits: channel_logits(&student.channel_logits, "student").shallow_clone(),
            cls: student.cls.shallow_clone(),
            patch_logits: None,
            channel_logits: None,
        };
        self.dino.value(&student, &teacher_view(teacher), ctx) * self.weight
    }

    fn update(
        &mut self,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
        group: &mut dyn Collective,
    ) -> Result<(), DistError> {
        self.dino.update(&teacher_view(teacher), ctx, group)?;
        // The collapse detector reads the CLS term's targets only.
        self.dino.take_collapse_targets();
        Ok(())
    }

    fn state(&self) -> Vec<(&'static str, Tensor)> {
        vec![(
            "channel_dino_loss.center",
            self.dino.loss.center.shallow_clone(),
        )]
    }
}
