//! `model.channels: fixed` (scDINO): a combination's channels are the ViT's input channels;
//! one model per entry of `data.channel_combinations`.
use super::kind::{cls_attention_maps, ChannelModeKind, CombinationInput};
use crate::config::{Arch, ChannelMode};
use crate::model::{VisionTransformer, VitConfig};
use tch::Tensor;

pub struct Fixed;

/// `x` with the combination's channels (along `dim`) placed at their positions among the
/// model's input channels, the others zero (after normalisation: each at its dataset mean),
/// when `input` says so; `x` itself otherwise.
fn model_channels(x: &Tensor, input: &CombinationInput, dim: i64) -> Tensor {
    match &input.positions {
        Some(positions) => {
            let mut shape = x.size();
            shape[dim as usize] = input.trained;
            let at = Tensor::from_slice(positions).to_device(x.device());
            Tensor::zeros(shape, (x.kind(), x.device())).index_copy(dim, &at, x)
        }
        None => x.shallow_clone(),
    }
}

impl ChannelModeKind for Fixed {
    fn mode(&self) -> ChannelMode {
        ChannelMode::Fixed
    }

    fn vit_config(&self, arch: Arch, patch_size: usize, k: usize) -> VitConfig {
        VitConfig::new(arch, patch_size, k)
    }

    fn features(&self, vit: &VisionTransformer, x: &Tensor, input: &CombinationInput) -> Tensor {
        vit.forward_t(&model_channels(x, input, 1), false)
    }

    /// scDINO's one map per head.
    fn attention_maps(
        &self,
        vit: &VisionTransformer,
        x: &Tensor,
        input: &CombinationInput,
        _channel_names: &[&str],
    ) -> Vec<(String, Tensor)> {
        let maps = cls_attention_maps(vit, &model_channels(x, input, 0));
        (0..maps.size()[0])
            .map(|j| (format!("attn-head{j}"), maps.get(j)))
            .collect()
    }

    fn export_forward(&self, vit: &VisionTransformer, x: &Tensor, _: &CombinationInput) -> Tensor {
        vit.forward_t(x, false)
    }

    fn timm_unsupported(&self) -> Option<&'static str> {
        None
    }

    fn record(&self) -> Option<&'static str> {
        None
    }
}
