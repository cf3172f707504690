//! ViT-DINO networks: the ViT backbone, the DINO head and the multi-crop wrapper, plus loading
//! weights by PyTorch name.
pub mod backbone;
pub mod channels;
mod head;
mod init;
mod multicrop_net;
mod pos_embed;
pub mod timm;
mod units;
mod vit;

pub use channels::bag_cls;
pub use head::{DinoHead, HeadConfig};
pub use multicrop_net::{CropsForward, IbotForward, MultiCropNet};
pub use pos_embed::PosResample;
pub use units::{ModelUnits, UndeclaredParameter, Unit, UnitKind};
pub use vit::{BlockHooks, ChannelPatchEmbed, VisionTransformer, VitConfig, TRAINING_ONLY};

use crate::config::{Config, ModelSection, PosEmbed};
use std::collections::BTreeSet;
use std::path::Path;
use tch::{nn, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("cannot read weights {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: tch::TchError,
    },
    #[error("weights {path} do not fit the model: {detail}")]
    Mismatch { path: String, detail: String },
}

/// The student and teacher architecture for a model over `in_chans` channels: the input
/// channels of a `fixed` model, the channels a `tokens` model knows (one embedding each);
/// a `bag` model is a single-channel ViT whatever `in_chans` is.
pub fn configs_for(cfg: &Config, in_chans: usize, student: bool) -> (VitConfig, HeadConfig) {
    let m = &cfg.model;
    let mut vit = channels::for_mode(m.channels).vit_config(m.arch, m.patch_size, in_chans);
    vit = with_layout(vit.with_registers(m.num_register_tokens), m);
    if cfg.train.ibot.enabled() {
        vit = vit.with_mask_token();
    }
    // DiChaViT's channel loss classifies the channel embeddings to proxies of their own.
    if vit.channel_tokens && m.dichavit.channel_loss_weight > 0.0 {
        vit = vit.with_channel_proxies();
    }
    if student {
        vit = vit.with_drop_path(m.drop_path_rate);
    }
    // The teacher head always normalises its last layer (scDINO main_dino.py).
    let norm_last = !student || m.norm_last_layer;
    let head = HeadConfig::new(vit.embed_dim, m.out_dim as i64, m.use_bn_in_head, norm_last);
    (vit, head)
}

/// `vit` with the configured LayerScale and position-embedding layout (`model.layer_scale`,
/// `model.pos_embed`, `model.img_size`'s grid) and the channel tokens' embedding scale and
/// separate and mixing blocks (`model.channel_embed_std`, `model.channel_separate_blocks`,
/// `model.channel_mixing_blocks`; validation
/// allows them off their defaults with `tokens` only, and the ViT reads them only then).
pub fn with_layout(vit: VitConfig, m: &ModelSection) -> VitConfig {
    let (no_embed_class, pos_resample) = match m.pos_embed {
        PosEmbed::Dino => (false, PosResample::Dino),
        PosEmbed::Timm => (false, PosResample::Timm),
        PosEmbed::TimmNoClass => (true, PosResample::Timm),
    };
    VitConfig {
        img_size: m.img_size_px() as i64,
        layer_scale: m.layer_scale,
        no_embed_class,
        pos_resample,
        channel_embed_std: m.channel_embed_std,
        channel_separate_blocks: m.channel_separate_blocks as i64,
        channel_mixing_blocks: m.channel_mixing_blocks as i64,
        ..vit
    }
}

/// The separate iBOT head of the student (or teacher), when `train.ibot` asks for one: the
/// DINO head's layout with `train.ibot.out_dim` prototypes (default `model.out_dim`), without
/// BatchNorm whatever `model.use_bn_in_head` says: a rank's masked patches are few (possibly
/// none) and DINOv2's iBOT head has none.
pub fn ibot_head_config(cfg: &Config, vit: &VitConfig, student: bool) -> Option<HeadConfig> {
    let ibot = &cfg.train.ibot;
    (ibot.enabled() && ibot.separate_head).then(|| {
        let m = &cfg.model;
        HeadConfig::new(
            vit.embed_dim,
            ibot.prototypes(m.out_dim) as i64,
            false,
            !student || m.norm_last_layer,
        )
    })
}

/// Total element count of the variables whose name starts with `prefix`.
pub fn count_parameters(vs: &nn::VarStore, prefix: &str) -> i64 {
    vs.variables()
        .iter()
        .filter(|(name, _)| name.starts_with(prefix))
        .map(|(_, t)| t.numel() as i64)
        .sum()
}

/// Loads a safetensors file into `vs`, requiring the exact same names and shapes both ways,
/// so a silently half-loaded model is impossible. Non-tensor entries (BatchNorm counters) are
/// the only names allowed to be missing from the model.
pub fn load_safetensors_strict(vs: &mut nn::VarStore, path: &Path) -> Result<(), WeightsError> {
    let shown = path.display().to_string();
    let tensors = Tensor::read_safetensors(path).map_err(|source| WeightsError::Read {
        path: shown.clone(),
        source,
    })?;
    let mut vars = vs.variables();
    let file_names: BTreeSet<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    let missing: Vec<&String> = vars
        .keys()
        .filter(|n| !file_names.contains(n.as_str()))
        .collect();
    let unexpected: Vec<&str> = file_names
        .iter()
        .copied()
        .filter(|n| !vars.contains_key(*n) && !n.ends_with("num_batches_tracked"))
        .collect();
    if !missing.is_empty() || !unexpected.is_empty() {
        return Err(WeightsError::Mismatch {
            path: shown,
            detail: format!("missing {missing:?}, unexpected {unexpected:?}"),
        });
    }
    tch::no_grad(|| {
        for (name, src) in &tensors {
            let Some(dst) = vars.get_mut(name) else {
                continue;
            };
            if dst.size() != src.size() {
                return Err(WeightsError::Mismatch {
                    path: shown.clone(),
                    detail: format!(
                        "{name} has shape {:?} in the file but {:?} in the model",
                        src.size(),
                        dst.size()
                    ),
                });
            }
            dst.copy_(src);
        }
        Ok(())
    })
}
