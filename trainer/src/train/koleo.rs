//! DINOv2's KoLeo regulariser (`dinov2/loss/koleo_loss.py`; Sablayrolles et al., "Spreading
//! vectors for similarity search"): the Kozachenko–Leonenko estimate of the entropy of the
//! student's L2-normalised CLS tokens, −mean log(distance to the nearest other token), which
//! pushes the tokens of one batch apart. `train.koleo_weight` times its value on each global
//! crop is added to the DINO loss; like DINOv2 it runs per rank, in fp32 whatever the
//! precision.
//!
//! DINOv2 takes −log(d + 1e-8) also where d is 0 (a duplicated image, or a batch of one whose
//! "nearest other" row is itself): a term of 18.4 whose gradient, 1/(d·D), reaches 1e8, the
//! NaNs of dinov2 issues #101, #143 and #314. Here such rows (nearest-neighbour distance below
//! [`DUPLICATE_DISTANCE`]) are left out of the mean, and a crop without any other row
//! contributes 0; on every other batch the value and gradient are DINOv2's.
use super::loss_term::{LossTerm, StepContext, StudentOutputs, TeacherOutputs, TermInfo};
use tch::{Kind, Tensor};

/// The KoLeo term of the step's loss: `train.koleo_weight` times KoLeo of each global crop's
/// student CLS tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KoLeoTerm {
    pub weight: f64,
}

impl KoLeoTerm {
    pub const INFO: TermInfo = TermInfo {
        name: "koleo",
        label: "KoLeo",
        help: "KoLeo term of the last iteration's loss, weight included",
    };

    /// The term `train.koleo_weight` asks for; None at 0 (off).
    pub fn from_config(cfg: &crate::config::Config) -> Option<Self> {
        let weight = cfg.train.koleo_weight;
        (weight > 0.0).then_some(Self { weight })
    }
}

impl LossTerm for KoLeoTerm {
    fn uncapturable(&self) -> Option<&'static str> {
        Some("KoLeo is not part of the captured step yet")
    }
    fn info(&self) -> &'static TermInfo {
        &Self::INFO
    }

    /// fp32 whatever the precision, as DINOv2.
    fn autocast(&self) -> bool {
        false
    }

    /// Per rank, on each global crop's CLS tokens.
    fn value(&self, student: &StudentOutputs, _: &TeacherOutputs, ctx: &StepContext) -> Tensor {
        let (cls, b) = (&student.cls, ctx.batch);
        (koleo_loss(&cls.narrow(0, 0, b)) + koleo_loss(&cls.narrow(0, b, b))) * self.weight
    }
}

/// A nearest neighbour closer than this (on the unit sphere) is the same vector: with
/// PyTorch's `pairwise_distance` eps of 1e-8, identical rows of dimension D are
/// 1e-8·√D apart (1.4e-7 for ViT-S), distinct images orders of magnitude further.
pub const DUPLICATE_DISTANCE: f64 = 1e-6;

/// KoLeo of one crop's CLS tokens `x`: `[B, D]`; a scalar on `x`'s device, differentiable.
pub fn koleo_loss(x: &Tensor) -> Tensor {
    let x = x.to_kind(Kind::Float);
    let n = x.size()[0];
    if n < 2 {
        // Keeps the graph (a zero gradient) so every rank runs the same backward.
        return x.sum(Kind::Float) * 0.0;
    }
    // F.normalize(x, p=2, dim=-1, eps=1e-8).
    let norms = x.norm_scalaropt_dim(2.0, [1], true).clamp_min(1e-8);
    let x = &x / norms;
    // The nearest other row by inner product (the diagonal set to −1, as DINOv2 does).
    let nearest = tch::no_grad(|| {
        let eye = Tensor::eye(n, (Kind::Bool, x.device()));
        x.mm(&x.tr()).masked_fill(&eye, -1.0).argmax(1, false)
    });
    let distances = Tensor::pairwise_distance(&x, &x.index_select(0, &nearest), 2.0, 1e-8, false);
    let terms = -(&distances + 1e-8).log();
    let kept = distances
        .detach()
        .gt(DUPLICATE_DISTANCE)
        .to_kind(Kind::Float);
    (terms * &kept).sum(Kind::Float) / kept.sum(Kind::Float).clamp_min(1.0)
}
