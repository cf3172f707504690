//! A timm folder (`config.json` + `model.safetensors`: DINOv2's `vit_*_dinov2` from the
//! Hugging Face hub, any timm `VisionTransformer` saved by `save_for_hf`, our own `trainer
//! export --format timm`) as the `--checkpoint` of `trainer features`, `evaluate` and `embed`,
//! so an off-the-shelf foundation model is the baseline row every comparison can show, without
//! training.
//!
//! The network is the folder's (built from its tensors and `config.json`, whatever `model.*`
//! says), and so is the input it expects: each channel min–max scaled per image as in every
//! stage, then resized to `pretrained_cfg.input_size` with `pretrained_cfg.interpolation` and
//! normalised with `pretrained_cfg.mean`/`std` instead of the dataset's, because the model was
//! trained on inputs of that size normalised that way.
use crate::config::Config;
use crate::model::backbone::{BackboneError, BackboneWeights, PatchEmbedAdapt};
use crate::model::timm::{self, TimmModel};
use crate::model::VisionTransformer;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{nn, Device, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum PretrainedError {
    #[error(transparent)]
    Timm(#[from] timm::TimmError),
    #[error(transparent)]
    Backbone(#[from] BackboneError),
    #[error("{}: {what}", path.display())]
    Unusable { path: PathBuf, what: String },
}

/// The size every image is resized to before a pretrained model, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputSize {
    pub height: i64,
    pub width: i64,
    /// timm's `bicubic` (PyTorch's `interpolate(mode="bicubic")`), else `bilinear`; both
    /// with `align_corners=False` and no antialiasing, as the features stage resizes.
    pub bicubic: bool,
}

impl InputSize {
    /// `x` (`[C, H, W]`) at this size.
    pub fn resize(&self, x: &Tensor) -> Tensor {
        let x = x.unsqueeze(0);
        let size = [self.height, self.width];
        let out = if self.bicubic {
            x.upsample_bicubic2d(size, false, None, None)
        } else {
            x.upsample_bilinear2d(size, false, None, None)
        };
        out.squeeze_dim(0)
    }
}

/// Whether `path` is a timm folder rather than a checkpoint file.
pub fn is_timm_folder(path: &Path) -> bool {
    timm::is_timm_folder(path)
}

/// The SHA-256 that identifies a checkpoint in provenance records and `trainer embed`'s
/// manifest: of the file, or for a timm folder of its two files' digests (the weights and
/// the `config.json` whose mean/std and input size change every feature).
pub fn checkpoint_sha256(path: &Path) -> std::io::Result<String> {
    use crate::data::shards::pack::sha256_file;
    if !is_timm_folder(path) {
        return Ok(sha256_file(path)?.1);
    }
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for name in ["config.json", "model.safetensors"] {
        let (_, digest) = sha256_file(&path.join(name))?;
        h.update(format!("{name} {digest}\n").as_bytes());
    }
    Ok(format!("{:x}", h.finalize()))
}

/// A timm folder ready to embed: the backbone (held by `vs`), the input it expects, and the
/// names of the channels it embeds. (The features stage wraps them in its `Embedder` and
/// `Preparer`; this module does not import it, which imports this one.)
pub struct Loaded {
    pub vs: nn::VarStore,
    pub vit: VisionTransformer,
    pub input: ModelInput,
    pub channel_names: Vec<String>,
}

/// How images are prepared for a pretrained model: the file channels `channels` of images
/// with `file_channels` channels named `names`, centre-cropped (`center_crop`) and min–max
/// scaled as in every stage, resized to `size` and normalised with `mean`/`std`.
pub struct ModelInput {
    pub file_channels: usize,
    pub channels: Vec<usize>,
    pub names: Vec<String>,
    pub center_crop: usize,
    pub size: InputSize,
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    /// The folder, when `file_channels` is its input channel count rather than the run
    /// config's (`trainer embed`), so an image that has not names it.
    pub folder: Option<PathBuf>,
}

/// The folder's input size, resampling and per-input-channel mean/std.
fn input_of(m: &TimmModel) -> Result<(InputSize, Vec<f32>, Vec<f32>), PretrainedError> {
    let path = m.dir.join("config.json");
    let unusable = |what: String| PretrainedError::Unusable {
        path: path.clone(),
        what,
    };
    let (height, width) = m.input_size.unwrap_or((m.cfg.img_size, m.cfg.img_size));
    let bicubic = match m.interpolation.as_deref() {
        None | Some("bicubic") => true,
        Some("bilinear") => false,
        Some(other) => {
            return Err(unusable(format!(
            "pretrained_cfg.interpolation is {other:?}; embedding resizes with bicubic or bilinear"
        )))
        }
    };
    let chans = m.cfg.in_chans as usize;
    let per_channel = |key: &str, v: &Option<Vec<f32>>| {
        match v.as_deref() {
        None => Err(unusable(format!("no pretrained_cfg.{key}: the model's input normalisation is unknown"))),
        Some([one]) => Ok(vec![*one; chans]),
        Some(v) if v.len() == chans => Ok(v.to_vec()),
        Some(v) => Err(unusable(format!("pretrained_cfg.{key} has {} values but the model takes {chans} channels (patch_embed.proj.weight)", v.len()))),
    }
    };
    let input = InputSize {
        height,
        width,
        bicubic,
    };
    Ok((
        input,
        per_channel("mean", &m.mean)?,
        per_channel("std", &m.std)?,
    ))
}

/// The frozen backbone of `m` for `in_chans` input channels, its patch embedding replaced by
/// `patch_embed` (already adapted to them).
fn backbone(
    mut m: TimmModel,
    patch_embed: Tensor,
    device: Device,
) -> Result<(nn::VarStore, VisionTransformer), PretrainedError> {
    let mut vs = nn::VarStore::new(device);
    let cfg = crate::model::VitConfig {
        in_chans: patch_embed.size()[1],
        ..m.cfg
    };
    let vit = VisionTransformer::new(vs.root() / "backbone", cfg);
    m.tensors
        .insert("patch_embed.proj.weight".into(), patch_embed);
    m.load_into(&vs, "backbone.")?;
    vs.freeze();
    Ok((vs, vit))
}

/// The timm folder `path` for the channels `channels` (file channel indices) of `cfg`'s data
/// (`trainer features`, `evaluate`). A source with another channel count than the combination
/// is adapted as for any checkpoint (`downstream.features.use_mean_patch_embedding`: the mean
/// kernel, normalised with the mean of the source's mean/std; `custom_embedding_map`: each
/// channel a source channel's kernel and mean/std), and refused naming both counts otherwise.
pub fn for_config(
    cfg: &Config,
    channels: &[usize],
    path: &Path,
    device: Device,
) -> Result<Loaded, PretrainedError> {
    let m = timm::read(path)?;
    let (input, mean, std) = input_of(&m)?;
    let adapt = PatchEmbedAdapt::from_config(&cfg.downstream.features);
    let names: Vec<String> = channels
        .iter()
        .map(|&c| cfg.data.channel_names[c].clone())
        .collect();
    let source_chans = m.cfg.in_chans as usize;
    if adapt == PatchEmbedAdapt::None && source_chans != channels.len() {
        return Err(PretrainedError::Unusable {
            path: path.to_path_buf(),
            what: format!("the timm model takes {source_chans} input channels (patch_embed.proj.weight) but the channel combination [{}] has {}; set downstream.features.use_mean_patch_embedding (every channel gets the mean kernel) or downstream.features.custom_embedding_map (each channel one of the model's) to adapt it", names.join(", "), channels.len()),
        });
    }
    let source = BackboneWeights {
        path: path.to_path_buf(),
        tensors: HashMap::from([(
            "patch_embed.proj.weight".to_string(),
            m.tensors["patch_embed.proj.weight"].shallow_clone(),
        )]),
        epoch: None,
        progress: None,
        args: None,
        trained: None,
    };
    let patch_embed = source.patch_embed_for(channels, &adapt)?;
    let avg = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    let (mean, std): (Vec<f32>, Vec<f32>) = match &adapt {
        PatchEmbedAdapt::None => (mean, std),
        PatchEmbedAdapt::Mean => (
            vec![avg(&mean); channels.len()],
            vec![avg(&std); channels.len()],
        ),
        PatchEmbedAdapt::Map(map) => channels.iter().map(|c| (mean[map[c]], std[map[c]])).unzip(),
    };
    let (vs, vit) = backbone(m, patch_embed, device)?;
    Ok(Loaded {
        vs,
        vit,
        input: ModelInput {
            file_channels: cfg.file_channels(),
            channels: channels.to_vec(),
            names: cfg.data.channel_names.clone(),
            center_crop: cfg.data.center_crop,
            size: input,
            mean,
            std,
            folder: None,
        },
        channel_names: names,
    })
}

/// The timm folder `path` for images of exactly its input channels, all of them in file order
/// (`trainer embed`, which has no run config to say which channels an image holds). The
/// channels are named as the folder records them (our exports), else by their index.
pub fn for_images(path: &Path, device: Device) -> Result<Loaded, PretrainedError> {
    let m = timm::read(path)?;
    let (input, mean, std) = input_of(&m)?;
    let chans = m.cfg.in_chans as usize;
    let names = match &m.channel_names {
        Some(n) if n.len() == chans => n.clone(),
        _ => (0..chans).map(|i| i.to_string()).collect(),
    };
    let channels: Vec<usize> = (0..chans).collect();
    let patch_embed = m.tensors["patch_embed.proj.weight"].shallow_clone();
    let (vs, vit) = backbone(m, patch_embed, device)?;
    Ok(Loaded {
        vs,
        vit,
        input: ModelInput {
            file_channels: chans,
            channels,
            names: names.clone(),
            center_crop: 0,
            size: input,
            mean,
            std,
            folder: Some(path.to_path_buf()),
        },
        channel_names: names,
    })
}
