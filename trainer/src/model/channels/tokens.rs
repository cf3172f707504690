//! `model.channels: tokens` (ChannelViT, Bao et al., ICLR 2024): one shared single-channel
//! patch projection, a learned embedding per channel, one token per channel and patch;
//! trained with hierarchical channel sampling.
use super::hierarchical::hierarchical_sample;
use super::kind::{unit_parts, ChannelModeKind, CombinationInput};
use crate::config::{Arch, ChannelMode, TokensPool};
use crate::model::{VisionTransformer, VitConfig};
use tch::Tensor;

pub struct Tokens;

impl ChannelModeKind for Tokens {
    fn uncapturable(&self) -> Option<&'static str> {
        Some("model.channels: tokens: the channel subset (and so the token count) changes per step")
    }

    fn mode(&self) -> ChannelMode {
        ChannelMode::Tokens
    }

    fn vit_config(&self, arch: Arch, patch_size: usize, k: usize) -> VitConfig {
        VitConfig::new(arch, patch_size, k).with_channel_tokens()
    }

    fn knows_channels(&self) -> bool {
        true
    }

    fn step_channels(&self, seed: u64, iteration: usize, k: usize) -> Option<Vec<i64>> {
        Some(hierarchical_sample(seed, iteration, k))
    }

    /// Hierarchical sampling draws the count uniformly from 1..=k.
    fn step_channel_counts(&self, k: usize) -> Vec<usize> {
        (1..=k).collect()
    }

    fn features(&self, vit: &VisionTransformer, x: &Tensor, input: &CombinationInput) -> Tensor {
        let channels = input.positions.as_deref();
        match input.tokens_pool {
            TokensPool::Cls => vit.forward_channels_t(x, channels, false),
            TokensPool::ClsAndChannels => cls_and_channels(vit, x, channels).flatten(1, 2),
            TokensPool::JointAndAlone => {
                let k = x.size()[1];
                let joint = cls_and_channels(vit, x, channels);
                if k == 1 {
                    // The pass over the channel alone is the joint pass.
                    return joint.flatten(1, 2);
                }
                // Every view (the joint one, each channel's own) weighs the same: its parts
                // are unit length, so the view is scaled to unit length as a whole.
                let mut views = vec![joint / ((k + 1) as f64).sqrt()];
                for c in 0..k {
                    let model_channel = channels.map_or(c, |p| p[c as usize]);
                    let alone = cls_and_channels(vit, &x.narrow(1, c, 1), Some(&[model_channel]));
                    views.push(alone / 2f64.sqrt());
                }
                Tensor::cat(&views, 1).flatten(1, 2)
            }
        }
    }

    fn feature_dim(&self, embed_dim: i64, k: usize, input: &CombinationInput) -> i64 {
        let k = k as i64;
        match input.tokens_pool {
            TokensPool::Cls => embed_dim,
            TokensPool::ClsAndChannels => embed_dim * (k + 1),
            TokensPool::JointAndAlone if k == 1 => embed_dim * 2,
            TokensPool::JointAndAlone => embed_dim * (3 * k + 1),
        }
    }

    /// One map per channel: the CLS attention to that channel's patches, averaged over the
    /// heads.
    fn attention_maps(
        &self,
        vit: &VisionTransformer,
        x: &Tensor,
        input: &CombinationInput,
        channel_names: &[&str],
    ) -> Vec<(String, Tensor)> {
        let p = vit.config().patch_size;
        let (k, h, w) = (x.size()[0], x.size()[1], x.size()[2]);
        let (h, w) = (h - h % p, w - w % p);
        let x = x.narrow(1, 0, h).narrow(2, 0, w).unsqueeze(0);
        let channels = input.positions.as_deref();
        let attn = tch::no_grad(|| vit.last_selfattention_channels(&x, channels));
        let n = (h / p) * (w / p);
        let per_channel = attn
            .get(0)
            .select(1, 0)
            .narrow(1, 1, k * n)
            .mean_dim(0, false, None)
            .reshape([k, 1, h / p, w / p])
            .upsample_nearest2d([h, w], Some(p as f64), Some(p as f64));
        channel_names
            .iter()
            .enumerate()
            .map(|(c, name)| {
                (
                    format!("attn-channel_{name}"),
                    per_channel.get(c as i64).squeeze_dim(0),
                )
            })
            .collect()
    }

    /// The features stage's feature of every channel with the run's `tokens_pool` (before
    /// the analyses' L2 normalisation of the row): the pass over every channel and, with
    /// `joint_and_alone`, a pass over each channel alone, whose embedding is a slice of the
    /// table (no index tensor in the trace).
    fn export_forward(
        &self,
        vit: &VisionTransformer,
        x: &Tensor,
        input: &CombinationInput,
    ) -> Tensor {
        self.features(vit, x, input)
    }

    fn export_output(&self, d: i64, k: usize, input: &CombinationInput) -> (String, &'static str) {
        let width = self.feature_dim(d, k, input);
        let meaning = match input.tokens_pool {
            TokensPool::Cls => "the CLS token after the final norm: the analyses L2-normalise it",
            TokensPool::ClsAndChannels => "the run's `tokens_pool: cls_and_channels`: the CLS token and each channel's mean patch token, each at unit length, concatenated (CLS first, then the channels in order); the analyses L2-normalise the row",
            TokensPool::JointAndAlone => "the run's `tokens_pool: joint_and_alone`: the CLS token and each channel's mean patch token of the pass over every channel, then the same two of a pass over each channel alone, each part at unit length and each view scaled to unit length; the analyses L2-normalise the row",
        };
        (format!("[B, {width}]"), meaning)
    }

    fn timm_unsupported(&self) -> Option<&'static str> {
        Some("ChannelViT's per-channel tokens and channel embeddings")
    }

    fn record(&self) -> Option<&'static str> {
        Some("tokens")
    }
}

/// `[B, k+1, D]`: the CLS token and each of the `k` channels' mean patch token of one pass over
/// `x` (`[B, k, H, W]`), each part unit length (`tokens_pool: cls_and_channels`).
fn cls_and_channels(vit: &VisionTransformer, x: &Tensor, channels: Option<&[i64]>) -> Tensor {
    let (cls, patches) = vit.forward_features_t(x, channels, None, false);
    // The patch tokens are channel-major: k channels of n patches each. (`unflatten` takes
    // no batch size, which a trace would fix.)
    let k = x.size()[1];
    let per_channel = patches.unflatten(1, [k, -1]).mean_dim(2, false, None);
    unit_parts(&Tensor::cat(&[cls.unsqueeze(1), per_channel], 1))
}
