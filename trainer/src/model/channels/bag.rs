//! `model.channels: bag` (DINO Bag-of-Channels): one single-channel ViT trained on every
//! channel of every image as its own image; a combination's feature is its channels' CLS
//! tokens, each L2-normalised (so every channel weighs the same), pooled as
//! `downstream.features.bag_pool` says.
use super::kind::{cls_attention_maps, unit_parts, ChannelModeKind, CombinationInput};
use crate::config::{Arch, BagPool, ChannelMode};
use crate::model::{VisionTransformer, VitConfig};
use tch::{Kind, Tensor};

pub struct Bag;

/// The per-channel CLS tokens of `x` (`[B, k, H, W]`) from a single-channel backbone, the
/// channels going through the batch dimension: `[B, k, D]`. DINO-BoC's feature is these
/// concatenated in channel order (`[B, k·D]`), or their mean over the channels (`[B, D]`), as
/// `downstream.features.bag_pool` says.
pub fn bag_cls(vit: &VisionTransformer, x: &Tensor) -> Tensor {
    let (b, k, h, w) = x.size4().expect("images are [B, C, H, W]");
    vit.forward_t(&x.reshape([b * k, 1, h, w]), false)
        .reshape([b, k, -1])
}

impl ChannelModeKind for Bag {
    fn uncapturable(&self) -> Option<&'static str> {
        Some("model.channels: bag: the number of single-channel items changes per step")
    }

    fn mode(&self) -> ChannelMode {
        ChannelMode::Bag
    }

    /// A single-channel ViT whatever `k` is.
    fn vit_config(&self, arch: Arch, patch_size: usize, _k: usize) -> VitConfig {
        VitConfig::new(arch, patch_size, 1)
    }

    fn channel_items(&self) -> bool {
        true
    }

    fn features(&self, vit: &VisionTransformer, x: &Tensor, input: &CombinationInput) -> Tensor {
        let cls = bag_cls(vit, x);
        let cls = unit_parts(&cls);
        match input.bag_pool {
            BagPool::Concat => cls.flatten(1, 2),
            BagPool::Mean => cls.mean_dim(1, false, Kind::Float),
        }
    }

    fn feature_dim(&self, embed_dim: i64, k: usize, input: &CombinationInput) -> i64 {
        match input.bag_pool {
            BagPool::Concat => embed_dim * k as i64,
            BagPool::Mean => embed_dim,
        }
    }

    /// One map per channel: the heads' mean CLS attention of the channel alone.
    fn attention_maps(
        &self,
        vit: &VisionTransformer,
        x: &Tensor,
        _input: &CombinationInput,
        channel_names: &[&str],
    ) -> Vec<(String, Tensor)> {
        channel_names
            .iter()
            .enumerate()
            .map(|(c, name)| {
                let one = x.narrow(0, c as i64, 1);
                (
                    format!("attn-channel_{name}"),
                    cls_attention_maps(vit, &one).mean_dim(0, false, None),
                )
            })
            .collect()
    }

    /// Each channel through the single-channel ViT, `[B, C, D]` (the channel count is fixed,
    /// the batch is not).
    fn export_forward(&self, vit: &VisionTransformer, x: &Tensor, _: &CombinationInput) -> Tensor {
        let k = x.size()[1];
        vit.forward_t(&x.flatten(0, 1).unsqueeze(1), false)
            .unflatten(0, [-1, k])
    }

    fn export_output(&self, d: i64, k: usize, _: &CombinationInput) -> (String, &'static str) {
        (
            format!("[B, {k}, {d}]"),
            "each channel's CLS token (DINO Bag-of-Channels): the analyses L2-normalise each and concatenate them in channel order",
        )
    }

    fn timm_unsupported(&self) -> Option<&'static str> {
        Some("one single-channel ViT applied to each channel, features concatenated")
    }

    fn record(&self) -> Option<&'static str> {
        Some("bag")
    }
}
