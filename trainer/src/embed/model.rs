//! The embedding model of `trainer embed`, from the checkpoint alone: one of our checkpoints
//! records the run config (backbone, preprocessing, `downstream.features`), the channels the
//! model was trained on and how it takes them, and the dataset mean/std it normalised them
//! with, so no run config is needed. Backbone, channel adaptation and preprocessing are the
//! features stage's own ([`load_embedder`], [`Preparer`]), so the numbers are the same.
use crate::analysis::features::{load_embedder, unit_rows, Embedder, FeaturesError, Preparer};
use crate::checkpoint;
use crate::config::{Config, MissingChannels};
use crate::model::backbone::BackboneWeights;
use crate::pth::{self, FileKind};
use std::path::{Path, PathBuf};
use tch::{nn, Device, Kind, Tensor};

mod timm_folder;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Features(#[from] FeaturesError),
    #[error("{}: {what}", path.display())]
    Unusable { path: PathBuf, what: String },
}

/// What embeds: the backbone on its device, the preprocessing, and what the table records.
pub struct Model {
    pub embedder: Embedder,
    _vs: nn::VarStore,
    pub preparer: Preparer,
    pub device: Device,
    pub bf16: bool,
    /// The names of the channels embedded, in order (`Metadata_Channels`).
    pub channel_names: Vec<String>,
    pub dim: usize,
    /// The run's `downstream.features.batch_size_per_gpu`, the default batch.
    pub batch_size: usize,
    pub checkpoint: String,
    pub epoch: Option<usize>,
}

impl Model {
    /// `path` (one of our checkpoints) for the channels named `channels` (default: the ones
    /// it was trained on), on `device`, in bfloat16 when `bf16`. A `fixed` model given fewer
    /// channels than it was trained on gets the others as zeros (`missing_channels: zeros`).
    pub fn load(
        path: &Path,
        channels: Option<&[String]>,
        device: Device,
        bf16: bool,
    ) -> Result<Self, ModelError> {
        let unusable = |what: String| ModelError::Unusable {
            path: path.to_path_buf(),
            what,
        };
        if crate::analysis::pretrained::is_timm_folder(path) {
            return Self::from_timm_folder(path, channels, device, bf16);
        }
        if !matches!(
            pth::sniff(path).map_err(|e| unusable(e.to_string()))?,
            FileKind::Other
        ) {
            return Err(unusable("a PyTorch .pth records no run config, channel names or dataset mean/std, which `trainer embed` takes from the checkpoint; embed with a checkpoint this trainer wrote (train or fine-tune here), or use `trainer features` with a run config".into()));
        }
        let meta = checkpoint::read_meta(path).map_err(FeaturesError::from)?;
        if meta.config_yaml.trim().is_empty() {
            return Err(unusable("it records no run config (an imported checkpoint?); `trainer embed` needs the run config a training checkpoint records (backbone, preprocessing, downstream.features)".into()));
        }
        let mut cfg = Config::from_yaml(
            &meta.config_yaml,
            &format!("{} (its run config)", path.display()),
        )
        .map_err(|e| unusable(format!("its recorded run config does not parse: {e}")))?;
        let weights = BackboneWeights::load(path, cfg.downstream.features.checkpoint_key)
            .map_err(FeaturesError::from)?;
        let trained = weights
            .trained
            .clone()
            .ok_or_else(|| unusable("it records no channel names (model fingerprint)".into()))?;
        if meta.mean.len() != trained.names.len() || meta.std.len() != trained.names.len() {
            return Err(unusable(format!(
                "it records {} means and {} stds for its {} channels; `trainer embed` normalises with the dataset mean/std the model was trained with",
                meta.mean.len(),
                meta.std.len(),
                trained.names.len()
            )));
        }
        let wanted: Vec<String> =
            channels.map_or_else(|| trained.names.clone(), <[String]>::to_vec);
        let mut file_channels = Vec::with_capacity(wanted.len());
        let (mut mean, mut std) = (vec![], vec![]);
        for name in &wanted {
            let file = cfg.data.channel_names.iter().position(|c| c == name);
            let model = trained.names.iter().position(|c| c == name);
            let (Some(file), Some(model)) = (file, model) else {
                return Err(unusable(format!(
                    "--channels names {name}, but the model was trained on [{}] (model.channels: {})",
                    trained.names.join(", "),
                    trained.mode.name()
                )));
            };
            file_channels.push(file);
            mean.push(meta.mean[model]);
            std.push(meta.std[model]);
        }
        if !trained.mode.is_adaptive() && wanted != trained.names {
            let mut sections = cfg.sections();
            sections.downstream.features.missing_channels = MissingChannels::Zeros;
            cfg = Config::from_sections(sections, &path.display().to_string()).map_err(|e| {
                unusable(format!("its run config with missing_channels: zeros: {e}"))
            })?;
        }
        let (vs, embedder) = if bf16 {
            let (mut vs, e) = load_embedder(&cfg, &weights, &file_channels, device)?;
            vs.bfloat16();
            (vs, e)
        } else {
            load_embedder(&cfg, &weights, &file_channels, device)?
        };
        let dim = embedder.dim(file_channels.len()) as usize;
        Ok(Self {
            preparer: Preparer::new(&cfg, &file_channels, mean, std),
            embedder,
            _vs: vs,
            device,
            bf16,
            channel_names: wanted,
            dim,
            batch_size: cfg.downstream.features.batch_size_per_gpu,
            checkpoint: path.display().to_string(),
            epoch: weights.epoch,
        })
    }

    /// Unit-length features `[B, dim]` (float32, CPU) of prepared images, in order; images
    /// of different sizes are run size by size ([`Embedder::embed_images`]). A backbone
    /// failure is returned as its message.
    pub fn embed(&self, batch: &[Tensor]) -> Result<Tensor, String> {
        let kind = if self.bf16 {
            Kind::BFloat16
        } else {
            Kind::Float
        };
        let f = self.embedder.embed_images(batch, self.device, kind)?;
        Ok(unit_rows(&f).to_device(Device::Cpu))
    }
}
