//! What a `model.init` source fixes of the run's `model:` section (its grid of position
//! embeddings included: `model.img_size`), read before the config is
//! validated ([`config::ReadLayout`]), so a run config need not repeat the source's
//! architecture and every stage builds the same network from the same file. Cheap by
//! design, since every command that reads the config reads it: a timm folder's `config.json`
//! and safetensors header, a run checkpoint's model record, a `.pth`'s pickle (the tensor
//! shapes, not their data).
use crate::checkpoint;
use crate::config::{
    self, Arch, CheckpointKey, Config, ConfigError, InitFormat, ModelInit, PosEmbed, SourceLayout,
};
use crate::export::{ExportError, ModelRecord};
use crate::model::backbone::BackboneWeights;
use crate::model::{timm, PosResample, VitConfig};
use std::path::Path;

/// Reads sources from the local filesystem (where `model.init.from` must be when training
/// starts).
pub struct SourceReader;

impl config::ReadLayout for SourceReader {
    fn read_layout(&self, init: &ModelInit) -> Result<SourceLayout, String> {
        let Some(from) = &init.from else {
            return Err("no model.init.from".into());
        };
        let path = Path::new(from);
        match init.format {
            InitFormat::Timm => of_timm(&timm::read_layout(path).map_err(|e| e.to_string())?),
            InitFormat::Run => {
                // A checkpoint without a model record (imported from a `.pth`) is read by its
                // tensors, as a `.pth` is; a record that is there but malformed is refused.
                let meta = checkpoint::read_meta(path).map_err(|e| e.to_string())?;
                match ModelRecord::from_fingerprint(&meta.fingerprint, path) {
                    Ok(m) => Ok(SourceLayout {
                        arch: m.arch,
                        patch_size: m.patch_size,
                        num_register_tokens: m.num_register_tokens,
                        layer_scale: m.layer_scale,
                        pos_embed: Some(m.pos_embed),
                        img_size: m.img_size,
                    }),
                    Err(ExportError::Unrecorded { .. }) => of_weights(path),
                    Err(e) => Err(e.to_string()),
                }
            }
            InitFormat::Pth => of_weights(path),
        }
    }
}

/// The layout the teacher backbone's tensor shapes show. DINO's and DINOv2's files hold the
/// same position tensor whichever resampling their code used (docs/pretrained.md, the DINOv2
/// table), so `pos_embed` is left to the config.
fn of_weights(path: &Path) -> Result<SourceLayout, String> {
    let shapes: timm::Shapes =
        BackboneWeights::shapes(path, CheckpointKey::Teacher).map_err(|e| e.to_string())?;
    let vit =
        timm::layout(&shapes, &serde_json::json!({}), path, path).map_err(|e| e.to_string())?;
    of_network(&vit, None)
}

/// The user's config file with the layout of its `model.init` source: how the trainer's
/// commands read a config ([`Config::load_with`]).
pub fn load_config(path: &Path) -> Result<Config, ConfigError> {
    Config::load_with(path, &SourceReader)
}

/// [`load_config`] for text already read (`origin` names it in messages).
pub fn config_from_yaml(text: &str, origin: &str) -> Result<Config, ConfigError> {
    Config::from_yaml_with(text, origin, &SourceReader)
}

/// The layout of a network read from a timm folder.
pub(super) fn of_timm(vit: &VitConfig) -> Result<SourceLayout, String> {
    of_network(vit, Some(pos_embed_of(vit)))
}

/// `model.pos_embed` of a network read from a timm folder.
fn pos_embed_of(vit: &VitConfig) -> PosEmbed {
    match (vit.no_embed_class, vit.pos_resample) {
        (true, _) => PosEmbed::TimmNoClass,
        (false, PosResample::Timm) => PosEmbed::Timm,
        (false, PosResample::Dino) => PosEmbed::Dino,
    }
}

/// The preset whose width, depth, heads and MLP ratio the network has, with the rest of its
/// layout; a network of no preset is refused naming its sizes and the presets.
fn of_network(vit: &VitConfig, pos_embed: Option<PosEmbed>) -> Result<SourceLayout, String> {
    const PRESETS: [Arch; 4] = [Arch::VitTiny, Arch::VitSmall, Arch::VitBase, Arch::VitLarge];
    let sizes = |c: &VitConfig| (c.embed_dim, c.depth, c.num_heads, c.mlp_ratio);
    let describe = |c: &VitConfig| {
        format!(
            "width {}, depth {}, {} heads, MLP ratio {}",
            c.embed_dim, c.depth, c.num_heads, c.mlp_ratio
        )
    };
    let arch = PRESETS
        .into_iter()
        .find(|&a| sizes(&VitConfig::new(a, 16, 3)) == sizes(vit))
        .ok_or_else(|| {
            let presets: Vec<String> = PRESETS
                .iter()
                .map(|&a| format!("{} ({})", a.name(), describe(&VitConfig::new(a, 16, 3))))
                .collect();
            format!(
                "its network ({}) is none of model.arch's: {}",
                describe(vit),
                presets.join("; ")
            )
        })?;
    Ok(SourceLayout {
        arch,
        patch_size: vit.patch_size as usize,
        num_register_tokens: vit.num_register_tokens as usize,
        layer_scale: vit.layer_scale,
        pos_embed,
        img_size: vit.img_size as usize,
    })
}
