//! What an export reads from a training checkpoint: the model it records (the fingerprint
//! written by `trainer train`: architecture, patch size, channel mode and names, registers),
//! the per-channel mean/std the crops were normalised with, the run config, and one network's
//! backbone loaded into our ViT, every tensor present with its shape (nothing left at a random
//! init).
use super::ExportError;
use crate::checkpoint;
use crate::config::{Arch, ChannelMode, CheckpointKey, Config, ModelSection, PosEmbed};
use crate::model::channels;
use crate::model::{timm, PosResample, VisionTransformer, VitConfig, TRAINING_ONLY};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use tch::{nn, Kind, Tensor};

/// The model a checkpoint's fingerprint records.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRecord {
    pub arch: Arch,
    pub patch_size: usize,
    pub mode: ChannelMode,
    /// The channels the model was trained on, in its input order.
    pub channel_names: Vec<String>,
    pub num_register_tokens: usize,
    /// `model.layer_scale` and `model.pos_embed` of the run (absent from older fingerprints:
    /// none and DINO's).
    pub layer_scale: Option<f64>,
    pub pos_embed: PosEmbed,
    /// The resolution of the position grid (`model.img_size`; absent from the fingerprints of
    /// runs at the default grid, and of every run before the key existed: 224).
    pub img_size: usize,
    /// `model.channel_separate_blocks` and `model.channel_mixing_blocks` of a `tokens` run
    /// (absent from the fingerprints of runs without: 0).
    pub channel_separate_blocks: usize,
    pub channel_mixing_blocks: usize,
    /// The exact network when the source is a timm folder (its sizes need not be one of
    /// our presets, and it may have LayerScale or no class position); None: the preset.
    pub layout: Option<VitConfig>,
}

impl ModelRecord {
    /// Reads the fingerprint JSON; an error names the keys it lacks (a checkpoint imported
    /// from a `.pth` records none of them).
    pub fn from_fingerprint(fingerprint: &str, path: &Path) -> Result<Self, ExportError> {
        let invalid = |what: String| ExportError::Invalid {
            path: path.to_path_buf(),
            what,
        };
        let v: serde_json::Value = serde_json::from_str(fingerprint)
            .map_err(|e| invalid(format!("its model record (fingerprint) is not JSON: {e}")))?;
        let missing: Vec<&str> = ["arch", "patch_size", "channel_names"]
            .into_iter()
            .filter(|k| v.get(k).is_none_or(|x| x.is_null()))
            .collect();
        if !missing.is_empty() {
            return Err(ExportError::Unrecorded {
                path: path.to_path_buf(),
                missing: missing.join(", "),
                imported: if v.get("imported_from").is_some() {
                    ", it was imported from a .pth"
                } else {
                    ""
                },
            });
        }
        let field = |k: &str| invalid(format!("the fingerprint's `{k}` is malformed: {}", v[k]));
        let arch: Arch = serde_json::from_value(v["arch"].clone()).map_err(|_| field("arch"))?;
        let patch_size = v["patch_size"]
            .as_u64()
            .ok_or_else(|| field("patch_size"))? as usize;
        let channel_names = v["channel_names"]
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|n| n.as_str().map(String::from))
                    .collect::<Option<Vec<_>>>()
            })
            .filter(|n| !n.is_empty())
            .ok_or_else(|| field("channel_names"))?;
        let mode = channels::read_record(v.get(channels::RECORD_KEY))
            .map_err(|_| field(channels::RECORD_KEY))?;
        // A count of restricted blocks: absent is 0, more than the depth is malformed.
        let blocks = |k: &str| match v.get(k) {
            None => Ok(0),
            Some(n) => n
                .as_u64()
                .filter(|&n| n as usize <= arch.depth())
                .map(|n| n as usize)
                .ok_or_else(|| field(k)),
        };
        let num_register_tokens = match v.get("num_register_tokens") {
            None => 0,
            Some(r) => r.as_u64().ok_or_else(|| field("num_register_tokens"))? as usize,
        };
        Ok(Self {
            arch,
            patch_size,
            mode,
            channel_names,
            num_register_tokens,
            layer_scale: v.get("layer_scale").and_then(|x| x.as_f64()),
            pos_embed: match v.get("pos_embed") {
                None => PosEmbed::Dino,
                Some(p) => serde_json::from_value(p.clone()).map_err(|_| field("pos_embed"))?,
            },
            img_size: match v.get("img_size") {
                None => ModelSection::DEFAULT_IMG_SIZE,
                Some(s) => s
                    .as_u64()
                    .filter(|&s| s as usize >= patch_size)
                    .ok_or_else(|| field("img_size"))? as usize,
            },
            channel_separate_blocks: blocks("channel_separate_blocks")?,
            channel_mixing_blocks: blocks("channel_mixing_blocks")?,
            layout: None,
        })
    }

    /// The backbone's architecture (a `bag` model is one single-channel ViT).
    pub fn vit_config(&self) -> VitConfig {
        if let Some(layout) = self.layout {
            return layout;
        }
        let k = self.channel_names.len();
        let vit = channels::for_mode(self.mode)
            .vit_config(self.arch, self.patch_size, k)
            .with_registers(self.num_register_tokens);
        let section = ModelSection {
            layer_scale: self.layer_scale,
            pos_embed: self.pos_embed,
            img_size: Some(self.img_size),
            channel_separate_blocks: self.channel_separate_blocks,
            channel_mixing_blocks: self.channel_mixing_blocks,
            ..ModelSection::default()
        };
        crate::model::with_layout(vit, &section)
    }

    /// `vit_small, patch 16, 3 channels (DAPI, ...), model.channels: fixed`.
    pub fn describe(&self) -> String {
        let registers = match self.num_register_tokens {
            0 => String::new(),
            r => format!(", {r} register tokens"),
        };
        let mixing = [
            ("channel_separate_blocks", self.channel_separate_blocks),
            ("channel_mixing_blocks", self.channel_mixing_blocks),
        ]
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .map(|(key, n)| format!(", model.{key}: {n}"))
        .collect::<String>();
        format!(
            "{}, patch {}, {} channels ({}), model.channels: {}{registers}{mixing}",
            arch_name(self.arch),
            self.patch_size,
            self.channel_names.len(),
            self.channel_names.join(", "),
            self.mode.name()
        )
    }
}

/// The config spelling of `arch` (`vit_small`).
pub fn arch_name(arch: Arch) -> String {
    serde_json::to_value(arch)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| format!("{arch:?}"))
}

pub fn network_name(key: CheckpointKey) -> &'static str {
    match key {
        CheckpointKey::Teacher => "teacher",
        CheckpointKey::Student => "student",
    }
}

/// One network of a checkpoint, ready to export.
pub struct Source {
    pub path: PathBuf,
    pub network: CheckpointKey,
    pub model: ModelRecord,
    /// Per input channel (the model's channel order), as the crops were normalised.
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    /// Epochs done and the next global iteration when the checkpoint was written.
    pub epoch: usize,
    pub iteration: usize,
    /// The run config (None when the checkpoint's copy is missing or no longer parses).
    pub config: Option<Config>,
    pub config_yaml: String,
    /// The side of the square images the export takes, and where that number came from.
    pub input: InputSize,
    /// Holds the backbone's weights (float32, CPU, frozen), under `backbone.*`, with the
    /// position embeddings resampled for [`Source::input`] (see [`Source::load`]).
    pub vs: nn::VarStore,
    pub vit: VisionTransformer,
}

/// The image size an export takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputSize {
    pub side: usize,
    /// `downstream.features.resize_length` of the run config, or `--image-size`.
    pub from: InputSizeFrom,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputSizeFrom {
    /// The run's `downstream.features.resize_length`: the export gives the features stage's
    /// numbers.
    FeaturesStage,
    /// Asked for with `--image-size`.
    Requested,
    /// A timm folder's own training resolution.
    TimmSource,
}

impl InputSize {
    /// One sentence for the model card and the loading notes: where the size comes from and
    /// what that guarantees, for the `trained` network.
    pub fn explain(&self, trained: &VitConfig, run: Option<&Config>) -> String {
        let s = self.side;
        let (from, to) = (trained.grid(), s as i64 / trained.patch_size);
        let how = match trained.pos_resample {
            PosResample::Dino => "DINO's bicubic `interpolate_pos_encoding`",
            PosResample::Timm => "timm's antialiased bicubic `resample_abs_pos_embed`",
        };
        let resampled = if from == to {
            format!("its position embeddings are the trained {from}×{from} grid as it is")
        } else {
            format!(
                "its position embeddings are the trained {from}×{from} grid resampled once to {to}×{to} patches with {how}, as the pipeline does at run time"
            )
        };
        match self.from {
            InputSizeFrom::TimmSource => format!(
                "The input size {s}×{s} is the resolution the source timm model was saved at."
            ),
            InputSizeFrom::FeaturesStage => format!(
                "The input size {s}×{s} is the run's `downstream.features.resize_length`: at this size the export gives exactly the features stage's CLS features ({resampled})."
            ),
            InputSizeFrom::Requested => {
                let pipeline = match run {
                    Some(c) if c.downstream.features.resize => format!(
                        "the run's features stage embedded at {} px",
                        c.downstream.features.resize_length
                    ),
                    _ => "the run's features stage did not resize".into(),
                };
                format!(
                    "The input size {s}×{s} was asked for with `--image-size` ({pipeline}); {resampled}, so at {s} px the export gives what `trainer features` gives for images of that size."
                )
            }
        }
    }

    /// The machine-readable record in each export's `config.json`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "side": self.side,
            "from": match self.from {
                InputSizeFrom::FeaturesStage => "downstream.features.resize_length",
                InputSizeFrom::Requested => "--image-size",
                InputSizeFrom::TimmSource => "the timm source's img_size",
            },
        })
    }

    /// `requested` if given, else the features stage's resolution from the run `config`; an
    /// error when neither says (no config, or a features stage that does not resize).
    fn resolve(
        requested: Option<usize>,
        config: Option<&Config>,
        patch_size: usize,
        path: &Path,
    ) -> Result<Self, ExportError> {
        let invalid = |what: String| ExportError::Invalid {
            path: path.to_path_buf(),
            what,
        };
        let size = match (requested, config) {
            (Some(side), _) => Self {
                side,
                from: InputSizeFrom::Requested,
            },
            (None, Some(c)) if c.downstream.features.resize => Self {
                side: c.downstream.features.resize_length,
                from: InputSizeFrom::FeaturesStage,
            },
            (None, Some(_)) => {
                return Err(invalid(
                    "its run config has downstream.features.resize: false (features at each image's own size), so no input size is known; pass --image-size N (the side of the square images the export will take)".into(),
                ))
            }
            (None, None) => {
                return Err(invalid(
                    "it holds no run config saying at which size the features stage embedded images; pass --image-size N (the side of the square images the export will take)".into(),
                ))
            }
        };
        if size.side < patch_size {
            return Err(invalid(format!(
                "an input size of {} px is smaller than the model's patch size {patch_size}",
                size.side
            )));
        }
        Ok(size)
    }
}

impl Source {
    /// Loads `network` of the checkpoint at `path` for images of `image_size` px (None: the
    /// run's features-stage size). The model trains and embeds with position embeddings kept
    /// at its recorded grid (224 px, or its `model.init` source's) and resampled with its
    /// layout's method to each input's grid; the export holds them already resampled for its
    /// input size, so the exported network at that size computes exactly what the features
    /// stage computes (and at the grid's own size holds the trained tensor itself).
    pub fn load(
        path: &Path,
        network: CheckpointKey,
        image_size: Option<usize>,
    ) -> Result<Self, ExportError> {
        if timm::is_timm_folder(path) {
            return Self::load_timm(path, image_size);
        }
        // An unreadable file is left to the checkpoint reader to report.
        if let Ok(crate::pth::FileKind::Zip | crate::pth::FileKind::LegacyPickle) =
            crate::pth::sniff(path)
        {
            return Err(ExportError::PyTorchFile {
                path: path.to_path_buf(),
            });
        }
        let ck = checkpoint::load(path)?;
        let invalid = |what: String| ExportError::Invalid {
            path: path.to_path_buf(),
            what,
        };
        let model = ModelRecord::from_fingerprint(&ck.meta.fingerprint, path)?;
        let k = model.channel_names.len();
        if ck.meta.mean.len() != k || ck.meta.std.len() != k {
            return Err(invalid(format!(
                "it records {} means and {} stds for its {k} channels; export needs the per-channel mean/std the model was trained with",
                ck.meta.mean.len(),
                ck.meta.std.len()
            )));
        }
        let config = (!ck.meta.config_yaml.trim().is_empty())
            .then(|| Config::from_yaml(&ck.meta.config_yaml, &path.display().to_string()))
            .and_then(|r| {
                r.map_err(|e| {
                    tracing::warn!("the run config stored in the checkpoint does not parse ({e}); the model card leaves it out")
                })
                .ok()
            });
        let input = InputSize::resolve(image_size, config.as_ref(), model.patch_size, path)?;
        let prefix = format!("{}.backbone.", network_name(network));
        let trained_vs = nn::VarStore::new(tch::Device::Cpu);
        let trained = VisionTransformer::new(trained_vs.root() / "backbone", model.vit_config());
        let mut vars = trained_vs.variables();
        // iBOT's mask token only ever replaces masked patches in training: no inference
        // network (ours or timm's) has it.
        let stored: BTreeSet<&str> = ck
            .tensors
            .keys()
            .filter_map(|n| n.strip_prefix(&prefix))
            .filter(|n| !TRAINING_ONLY.contains(n))
            .collect();
        if stored.is_empty() {
            return Err(invalid(format!(
                "no {} backbone in the checkpoint (no {prefix}* tensors)",
                network_name(network)
            )));
        }
        let wanted: BTreeSet<String> = vars
            .keys()
            .map(|n| n.trim_start_matches("backbone.").to_string())
            .collect();
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|n| !stored.contains(n.as_str()))
            .collect();
        let unexpected: Vec<&&str> = stored.iter().filter(|n| !wanted.contains(**n)).collect();
        if !missing.is_empty() || !unexpected.is_empty() {
            return Err(invalid(format!(
                "its {} backbone does not fit the recorded model ({}): missing {missing:?}, unexpected {unexpected:?}",
                network_name(network),
                model.describe()
            )));
        }
        tch::no_grad(|| {
            for (name, var) in vars.iter_mut() {
                let short = name.trim_start_matches("backbone.");
                let src = &ck.tensors[&format!("{prefix}{short}")];
                if src.size() != var.size() {
                    return Err(invalid(format!(
                        "{prefix}{short} has shape {:?}, the recorded model ({}) needs {:?}",
                        src.size(),
                        model.describe(),
                        var.size()
                    )));
                }
                var.copy_(&src.to_kind(Kind::Float));
            }
            Ok(())
        })?;
        let (vs, vit) = resampled(&trained_vs, &trained, model.vit_config(), input.side as i64);
        Ok(Self {
            path: path.to_path_buf(),
            network,
            model,
            mean: ck.meta.mean.clone(),
            std: ck.meta.std.clone(),
            epoch: ck.meta.epoch,
            iteration: ck.meta.iteration,
            config,
            config_yaml: ck.meta.config_yaml.clone(),
            input,
            vs,
            vit,
        })
    }

    /// A timm folder (`config.json` + `model.safetensors`) for images of `image_size` px
    /// (None: the resolution it was saved at), normalised with its `pretrained_cfg` mean/std.
    pub fn load_timm(dir: &Path, image_size: Option<usize>) -> Result<Self, ExportError> {
        let invalid = |what: String| ExportError::Invalid {
            path: dir.to_path_buf(),
            what,
        };
        let source = timm::read(dir).map_err(|e| invalid(e.to_string()))?;
        let cfg = source.cfg;
        let k = cfg.in_chans as usize;
        let (mean, std) = match (&source.mean, &source.std) {
            (Some(m), Some(s)) if m.len() == k && s.len() == k => (m.clone(), s.clone()),
            _ => {
                return Err(invalid(format!(
                    "config.json's pretrained_cfg needs a mean and a std for each of the model's {k} input channels (the normalisation the weights expect)"
                )))
            }
        };
        let channel_names = match source.channel_names.clone() {
            Some(names) if names.len() == k => names,
            _ => (0..k).map(|i| format!("channel_{i}")).collect(),
        };
        let arch = timm::arch_of_width(cfg.embed_dim).ok_or_else(|| {
            invalid(format!(
                "width {} is none of this project's ViT presets (192, 384, 768, 1024)",
                cfg.embed_dim
            ))
        })?;
        let input = match image_size {
            Some(side) => InputSize {
                side,
                from: InputSizeFrom::Requested,
            },
            None => InputSize {
                side: cfg.img_size as usize,
                from: InputSizeFrom::TimmSource,
            },
        };
        if (input.side as i64) < cfg.patch_size {
            return Err(invalid(format!(
                "an input size of {} px is smaller than the model's patch size {}",
                input.side, cfg.patch_size
            )));
        }
        let model = ModelRecord {
            arch,
            patch_size: cfg.patch_size as usize,
            mode: ChannelMode::Fixed,
            channel_names,
            num_register_tokens: cfg.num_register_tokens as usize,
            layer_scale: cfg.layer_scale,
            pos_embed: PosEmbed::Dino,
            img_size: cfg.img_size as usize,
            channel_separate_blocks: 0,
            channel_mixing_blocks: 0,
            layout: Some(cfg),
        };
        let trained_vs = nn::VarStore::new(tch::Device::Cpu);
        let trained = VisionTransformer::new(trained_vs.root() / "backbone", cfg);
        source
            .load_into(&trained_vs, "backbone.")
            .map_err(|e| invalid(e.to_string()))?;
        let (vs, vit) = resampled(&trained_vs, &trained, cfg, input.side as i64);
        Ok(Self {
            path: dir.to_path_buf(),
            network: CheckpointKey::Teacher,
            model,
            mean,
            std,
            epoch: 0,
            iteration: 0,
            config: None,
            config_yaml: String::new(),
            input,
            vs,
            vit,
        })
    }

    /// The exported network's configuration: the trained one at the export's input size.
    pub fn vit_config(&self) -> VitConfig {
        *self.vit.config()
    }

    /// The backbone's tensors under their (DINO = PyTorch) names, sorted.
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = self
            .vs
            .variables()
            .into_iter()
            .map(|(n, t)| (n.trim_start_matches("backbone.").to_string(), t))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// A frozen copy of `trained` (built with `cfg`, its weights in `trained_vs`) for `side`-px inputs: every tensor as it
/// is, the position embeddings those `trained` adds to a `side × side` input.
fn resampled(
    trained_vs: &nn::VarStore,
    trained: &VisionTransformer,
    cfg: VitConfig,
    side: i64,
) -> (nn::VarStore, VisionTransformer) {
    let cfg = VitConfig {
        img_size: side,
        ..cfg
    };
    let mut vs = nn::VarStore::new(tch::Device::Cpu);
    let vit = VisionTransformer::new(vs.root() / "backbone", cfg);
    let trained_vars = trained_vs.variables();
    tch::no_grad(|| {
        for (name, mut var) in vs.variables() {
            let value = if name == "backbone.pos_embed" {
                trained.pos_embed_for(side, side)
            } else {
                trained_vars[&name].shallow_clone()
            };
            var.copy_(&value);
        }
    });
    vs.freeze();
    (vs, vit)
}
