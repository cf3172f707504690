//! One channel mode's interface (`model.channels`): what the rest of the trainer asks a mode
//! (its backbone, what a training step feeds it, how it embeds a combination and draws its
//! attention, how it is exported, what the checkpoint records). The modes implement it in
//! their own files; [`super`] registers them, so this file imports none of them.
use crate::config::{Arch, BagPool, ChannelMode, TokensPool};
use crate::model::{VisionTransformer, VitConfig};
use tch::Tensor;

/// How one channel combination reaches a model, for its features and attention maps.
pub struct CombinationInput {
    /// The model's channel index of each of the combination's channels, where the model is
    /// told which channels it gets (`tokens`: their channel embeddings; a `fixed` model fed
    /// zeros for the channels it lacks: their input positions); None: the combination's
    /// channels are the model's input as they come.
    pub positions: Option<Vec<i64>>,
    /// How many channels the model was trained on.
    pub trained: i64,
    /// `downstream.features.bag_pool`.
    pub bag_pool: BagPool,
    /// `downstream.features.tokens_pool`.
    pub tokens_pool: TokensPool,
}

/// `[B, k, D]` with every part `[b, i, :]` scaled to unit L2 length: the per-channel parts a
/// combination's feature concatenates (`bag`'s CLS tokens, `tokens`' CLS and channel means)
/// weigh the same whatever their scale.
pub(super) fn unit_parts(parts: &Tensor) -> Tensor {
    parts / parts.norm_scalaropt_dim(2.0, [2], true).clamp_min(1e-12)
}

/// One value of `model.channels`. Every method is a pure function of its arguments, so one
/// `&'static` instance serves every run.
pub trait ChannelModeKind: Send + Sync {
    /// The config value it implements.
    fn mode(&self) -> ChannelMode;

    /// The backbone of a model over `k` channels (the input channels of a `fixed` model, the
    /// channels a `tokens` model knows), before registers, layout and drop path.
    fn vit_config(&self, arch: Arch, patch_size: usize, k: usize) -> VitConfig;

    /// Why a training step of this mode cannot be captured as a CUDA graph (the warning of a
    /// run with `train.cuda_graphs: true` gives it), or None: the capture code names no mode.
    fn uncapturable(&self) -> Option<&'static str> {
        None
    }

    /// The model tells channels apart (an embedding per channel): a combination's channels
    /// are looked up by name among those it was trained on.
    fn knows_channels(&self) -> bool {
        false
    }

    /// Training: every channel of every image is its own single-channel item.
    fn channel_items(&self) -> bool {
        false
    }

    /// Training: the channels (ascending indices into the model's `k`) step `iteration`
    /// trains on; None: every channel the crops hold. The same on every rank.
    fn step_channels(&self, _seed: u64, _iteration: usize, _k: usize) -> Option<Vec<i64>> {
        None
    }

    /// The channel counts a step's crops hold for a model over `k` channels, each equally
    /// likely: a step's FLOPs are their mean.
    fn step_channel_counts(&self, k: usize) -> Vec<usize> {
        vec![k]
    }

    /// Features of a combination's images `x` (`[B, k, H, W]`, normalised): `[B, D]`
    /// (`[B, k·D]` for a concatenated bag), rows not yet normalised.
    fn features(&self, vit: &VisionTransformer, x: &Tensor, input: &CombinationInput) -> Tensor;

    /// The feature dimension for `k` channels of a backbone of width `embed_dim`.
    fn feature_dim(&self, embed_dim: i64, _k: usize, _input: &CombinationInput) -> i64 {
        embed_dim
    }

    /// The attention maps of one image `x` (`[k, h, w]`, normalised), named (`attn-head{j}`,
    /// `attn-channel_{name}`), each `[h', w']` (the sides trimmed to a multiple of P).
    fn attention_maps(
        &self,
        vit: &VisionTransformer,
        x: &Tensor,
        input: &CombinationInput,
        channel_names: &[&str],
    ) -> Vec<(String, Tensor)>;

    /// What an exported module computes from `x` (`[B, C, H, W]`: every channel the model
    /// was trained on, in its order, normalised); `input`: every channel, with the run's
    /// pools.
    fn export_forward(
        &self,
        vit: &VisionTransformer,
        x: &Tensor,
        input: &CombinationInput,
    ) -> Tensor;

    /// The exported module's output shape and meaning, for a width `d` and `k` channels.
    fn export_output(
        &self,
        d: i64,
        _k: usize,
        _input: &CombinationInput,
    ) -> (String, &'static str) {
        (
            format!("[B, {d}]"),
            "the CLS token after the final norm: the analyses L2-normalise it",
        )
    }

    /// Why timm's `VisionTransformer` cannot hold this model (None: it can).
    fn timm_unsupported(&self) -> Option<&'static str>;

    /// What the checkpoint's fingerprint records under [`super::RECORD_KEY`]; None: nothing
    /// (so that checkpoints written before the key existed still resume).
    fn record(&self) -> Option<&'static str>;
}

/// The CLS→patch attention of the last block, per head, upsampled ×P: `[heads, h, w]` where
/// `h`, `w` are the input's sides trimmed to a multiple of P.
pub fn cls_attention_maps(vit: &VisionTransformer, x: &Tensor) -> Tensor {
    let p = vit.config().patch_size;
    let (h, w) = (x.size()[1], x.size()[2]);
    let (h, w) = (h - h % p, w - w % p);
    let x = x.narrow(1, 0, h).narrow(2, 0, w).unsqueeze(0);
    let attn = tch::no_grad(|| vit.last_selfattention(&x));
    let heads = attn.size()[1];
    attn.get(0)
        .select(1, 0)
        .narrow(1, 1, (h / p) * (w / p))
        .reshape([heads, h / p, w / p])
        .unsqueeze(0)
        .upsample_nearest2d([h, w], Some(p as f64), Some(p as f64))
        .squeeze_dim(0)
}
