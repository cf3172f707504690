//! DiChaViT's two diversification losses for `model.channels: tokens` (Pham & Plummer,
//! NeurIPS 2024; chaudatascience/diverse_channel_vit `models/loss_fn.py`, called from
//! `models/dichavit.py`), as terms of the step's loss. ChannelViT's channel embeddings and
//! shared projection tend to make channels look alike, so a model leans on a few of them;
//! the channel loss keeps the channel embeddings apart, the token loss keeps the projected
//! patch tokens of different channels (and, as the published scripts run it, of one channel)
//! apart. Both read the student's patch embedding ([`TokenStep`]), run in fp32 after the
//! forward, and are the same on every rank's data as in the published code; the sampling
//! half of DiChaViT is [`super::channels::diverse_sample`].
use super::loss_term::{
    LossTerm, StepContext, StudentOutputs, TeacherOutputs, TermInfo, TokenStep,
};
use crate::config::Config;
use tch::{Kind, Tensor};

/// `F.normalize(x, p=2, dim=-1)`: rows divided by max(‖row‖, 1e-12).
fn normalize(x: &Tensor) -> Tensor {
    x / x.norm_scalaropt_dim(2.0, [-1], true).clamp_min(1e-12)
}

/// DiChaViT's `proxy_loss`: `proxies`, `embeddings` `[k, D]` (row i: channel i's), each
/// L2-normalised and scaled by s = √(1/τ); the logits of embedding i are −‖s·ĉ_i − s·p̂_j‖²
/// over the k proxies, and the loss is the mean cross-entropy to its own proxy (the published
/// `torch.eye(Cin)` target).
pub fn proxy_loss(proxies: &Tensor, embeddings: &Tensor, temperature: f64) -> Tensor {
    let s = (1.0 / temperature).sqrt();
    let p = normalize(&proxies.to_kind(Kind::Float)) * s;
    let e = normalize(&embeddings.to_kind(Kind::Float)) * s;
    // `torch.cdist(e, p) ** 2`, written as the squared differences (the same value, and a
    // gradient without cdist's square root).
    let d2 = (e.unsqueeze(1) - p.unsqueeze(0))
        .square()
        .sum_dim_intlist(-1, false, Kind::Float);
    -(-d2)
        .log_softmax(-1, Kind::Float)
        .diagonal(0, 0, 1)
        .mean(Kind::Float)
}

/// DiChaViT's `ortho_proj_loss_fn_v2` (`use_square=False`) on `tokens` `[B, k, n, D]`: image
/// b's k·n patch tokens, channel-major, before any channel embedding. With the tokens
/// L2-normalised, P is the mean cosine over the pairs of distinct tokens of one channel and N
/// over the pairs of tokens of different channels, each per image; the loss is the mean over
/// the images of γ_s·P + γ_d·N (`reverse_pos_pairs`) or γ_s·(1 − P) + γ_d·N.
///
/// The published code builds the `[B, k·n, k·n]` matrix of cosines and masks it; the sums over
/// the masks are computed here from per-channel sums of the tokens instead (the sum over one
/// channel's pairs is ‖Σ_i t̂_i‖² less the diagonal Σ_i ‖t̂_i‖², over all pairs ‖Σ_c Σ_i t̂_ci‖²),
/// the same value in O(k·n·D) instead of O((k·n)²·D) time and memory: at 224 px, patch 16 and
/// five channels that is 980 tokens, a 3.8 MB matrix per image.
pub fn token_diversity_loss(tokens: &Tensor, gamma_s: f64, gamma_d: f64, reverse: bool) -> Tensor {
    let (_, k, n, _) = tokens.size4().expect("tokens are [B, k, n, D]");
    let t = normalize(&tokens.to_kind(Kind::Float));
    let sq = |x: &Tensor| x.square().sum_dim_intlist(-1, false, Kind::Float);
    let diagonal = sq(&t).sum_dim_intlist([1, 2].as_slice(), false, Kind::Float);
    let per_channel = t.sum_dim_intlist(2, false, Kind::Float);
    let same = sq(&per_channel).sum_dim_intlist(1, false, Kind::Float);
    let all = sq(&per_channel.sum_dim_intlist(1, false, Kind::Float));
    // The published denominators: the mask sizes plus 1e-6 (a single channel has no
    // cross-channel pair, so N is 0 there).
    let (k, n) = (k as f64, n as f64);
    let pos = (same.shallow_clone() - diagonal) / (k * n * (n - 1.0) + 1e-6);
    let neg = (all - same) / (k * n * (k - 1.0) * n + 1e-6);
    let pos = if reverse {
        pos * gamma_s
    } else {
        (1.0 - pos) * gamma_s
    };
    (pos + neg * gamma_d).mean(Kind::Float)
}

/// The channel tokens of the step, which these terms need.
fn token_step<'a>(ctx: &StepContext<'a>) -> TokenStep<'a> {
    ctx.tokens
        .expect("DiChaViT's terms are validated for model.channels: tokens only")
}

/// Channel Diversification Loss: `model.dichavit.channel_loss_weight` times [`proxy_loss`] of
/// the step's channels' embeddings against their proxies (the sampled channels only, as
/// DiChaViT indexes `channel_emb_proxies[cur_channels]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChannelDiversityTerm {
    pub weight: f64,
    pub temperature: f64,
}

impl ChannelDiversityTerm {
    pub const INFO: TermInfo = TermInfo {
        name: "channel_diversity",
        label: "CDL",
        help: "DiChaViT channel diversification term of the last iteration's loss, weight included",
    };

    /// The term `model.dichavit.channel_loss_weight` asks for; None at 0 (off).
    pub fn from_config(cfg: &Config) -> Option<Self> {
        let d = &cfg.model.dichavit;
        (d.channel_loss_weight > 0.0).then_some(Self {
            weight: d.channel_loss_weight,
            temperature: d.channel_loss_temperature,
        })
    }
}

impl LossTerm for ChannelDiversityTerm {
    fn info(&self) -> &'static TermInfo {
        &Self::INFO
    }

    /// fp32: a handful of normalised vectors and a softmax.
    fn autocast(&self) -> bool {
        false
    }

    fn uncapturable(&self) -> Option<&'static str> {
        Some("DiChaViT's channel loss needs channel tokens, whose steps change shape")
    }

    fn value(&self, _: &StudentOutputs, _: &TeacherOutputs, ctx: &StepContext) -> Tensor {
        let step = token_step(ctx);
        let proxies = step
            .embed
            .proxies()
            .expect("a model trained with the channel loss has proxies (model::configs_for)");
        let index = Tensor::from_slice(step.channels).to_device(proxies.device());
        let embeddings = step.embed.channel_embeddings().index_select(0, &index);
        proxy_loss(
            &proxies.index_select(0, &index),
            &embeddings,
            self.temperature,
        ) * self.weight
    }
}

/// Token Diversification Loss: `model.dichavit.token_loss_weight` times
/// [`token_diversity_loss`] of the student's two global crops (the crops DINO's teacher also
/// sees; DiChaViT has one view per image), averaged over their images.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenDiversityTerm {
    pub weight: f64,
    pub gamma_s: f64,
    pub gamma_d: f64,
    pub reverse_pos_pairs: bool,
}

impl TokenDiversityTerm {
    pub const INFO: TermInfo = TermInfo {
        name: "token_diversity",
        label: "TDL",
        help: "DiChaViT token diversification term of the last iteration's loss, weight included",
    };

    /// The term `model.dichavit.token_loss_weight` asks for; None at 0 (off).
    pub fn from_config(cfg: &Config) -> Option<Self> {
        let d = &cfg.model.dichavit;
        (d.token_loss_weight > 0.0).then_some(Self {
            weight: d.token_loss_weight,
            gamma_s: d.gamma_s,
            gamma_d: d.gamma_d,
            reverse_pos_pairs: d.reverse_pos_pairs,
        })
    }
}

impl LossTerm for TokenDiversityTerm {
    fn info(&self) -> &'static TermInfo {
        &Self::INFO
    }

    /// fp32: cosines of normalised tokens.
    fn autocast(&self) -> bool {
        false
    }

    fn uncapturable(&self) -> Option<&'static str> {
        Some("DiChaViT's token loss needs channel tokens, whose steps change shape")
    }

    /// The projection is recomputed from the global crops (one convolution): the tokens the
    /// student's forward made from them, before the channel embedding and any mask, and the
    /// gradient reaches the same `proj` parameters.
    fn value(&self, _: &StudentOutputs, _: &TeacherOutputs, ctx: &StepContext) -> Tensor {
        let step = token_step(ctx);
        let tokens = step.embed.project(&Tensor::cat(step.global, 0));
        token_diversity_loss(&tokens, self.gamma_s, self.gamma_d, self.reverse_pos_pairs)
            * self.weight
    }
}
