//! The ViT backbone weights an analysis embeds with, from any checkpoint we can read: ours
//! (safetensors) or PyTorch `.pth` as scDINO/DINO save them, told apart by their first bytes.
//!
//! Names are normalised the way DINO's `load_pretrained_weights` does (pick `teacher` or
//! `student`, strip `module.` then `backbone.`, drop the head), so the rest of the code sees
//! backbone-relative names (`patch_embed.proj.weight`) whatever the file was.
use crate::checkpoint::{self, CheckpointError};
use crate::config::{ChannelMode, CheckpointKey};
use crate::model::channels;
use crate::pth::{self, FileKind, PthError, PthFile, TrainingArgs, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum BackboneError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Pth(#[from] PthError),
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
}

/// Marks the fingerprint of a checkpoint written by [`BackboneWeights::save`].
const IMPORTED: &str = "imported_from";

/// Backbone weights and what the file says about them.
pub struct BackboneWeights {
    pub path: PathBuf,
    /// Backbone-relative names, the dtype they were saved in.
    pub tensors: HashMap<String, Tensor>,
    /// Epochs completed when it was saved (scDINO's `epoch` entry holds epoch+1, our
    /// `meta.epoch` the same count); `None` for a bare state dict.
    pub epoch: Option<usize>,
    /// Our training checkpoints: `(batches of the running epoch done, iteration)`, which tell
    /// a mid-epoch checkpoint and the untrained network from the end of an epoch.
    pub progress: Option<(usize, usize)>,
    /// scDINO's training `args`, when the file has them.
    pub args: Option<TrainingArgs>,
    /// Our checkpoints only: the channels the model was trained on, and how it takes them.
    pub trained: Option<TrainedChannels>,
}

/// What one of our checkpoints records of its channels (its fingerprint), so a model can be
/// used on a combination without the training config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainedChannels {
    pub mode: ChannelMode,
    /// The names of the channels the model was trained on, in its channel order.
    pub names: Vec<String>,
}

impl TrainedChannels {
    fn from_fingerprint(fingerprint: &str) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(fingerprint).ok()?;
        let names = v["channel_names"]
            .as_array()?
            .iter()
            .map(|n| n.as_str().map(String::from))
            .collect::<Option<Vec<_>>>()?;
        let record = v.get(channels::RECORD_KEY).filter(|m| m.is_string());
        let mode = channels::read_record(record).ok()?;
        Some(Self { mode, names })
    }

    /// The model's channel index of each of `wanted` (channel names), or an error naming the
    /// first channel the model never saw.
    pub fn indices_of(&self, wanted: &[&str], path: &Path) -> Result<Vec<i64>, BackboneError> {
        wanted
            .iter()
            .map(|w| {
                self.names
                    .iter()
                    .position(|n| n == w)
                    .map(|i| i as i64)
                    .ok_or_else(|| BackboneError::Invalid {
                        path: path.to_path_buf(),
                        what: format!(
                            "channel {w} was never seen by this model (model.channels: {}, trained on {})",
                            self.mode.name(),
                            self.names.join(", ")
                        ),
                    })
            })
            .collect()
    }
}

fn key_name(key: CheckpointKey) -> &'static str {
    match key {
        CheckpointKey::Teacher => "teacher",
        CheckpointKey::Student => "student",
    }
}

/// DINO's renaming: `module.backbone.blocks.0...` -> `blocks.0...`; `None` for head weights.
/// DINOv2's chunked blocks (`block_chunks > 0`, for FSDP: `blocks.{chunk}.{block}...`, the
/// block index counted over the whole network) lose their chunk index.
fn backbone_name(name: &str) -> Option<String> {
    let name = name.strip_prefix("module.").unwrap_or(name);
    let name = name.strip_prefix("backbone.").unwrap_or(name);
    if name.starts_with("head.") {
        return None;
    }
    let parts: Vec<&str> = name.splitn(4, '.').collect();
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match parts[..] {
        ["blocks", chunk, block, rest] if numeric(chunk) && numeric(block) => {
            Some(format!("blocks.{block}.{rest}"))
        }
        _ => Some(name.to_string()),
    }
}

/// The backbone tensors of the `key` network of a `.pth` (a training checkpoint, or a bare
/// state dict when the file has neither network) by backbone-relative names, not yet read.
fn pth_network(
    f: &PthFile,
    path: &Path,
    key: CheckpointKey,
) -> Result<Vec<(String, pth::TensorRef)>, BackboneError> {
    let invalid = |what: String| BackboneError::Invalid {
        path: path.to_path_buf(),
        what,
    };
    let root = f.root();
    let want = key_name(key);
    let dict = match root.get(want) {
        Some(d @ Value::Dict(_)) => d,
        Some(other) => {
            return Err(invalid(format!(
                "`{want}` is {}, not a state dict",
                other.short_repr()
            )))
        }
        None => {
            let other = match key {
                CheckpointKey::Teacher => "student",
                CheckpointKey::Student => "teacher",
            };
            if root.get(other).is_some() {
                return Err(invalid(format!(
                    "has `{other}` but no `{want}` (downstream.features.checkpoint_key)"
                )));
            }
            root.clone()
        }
    };
    let tensors: Vec<(String, pth::TensorRef)> = f
        .tensors_of(&dict)
        .into_iter()
        .filter_map(|(name, t)| Some((backbone_name(&name)?, t)))
        .collect();
    if tensors.is_empty() {
        let keys: Vec<String> = root
            .dict_items()
            .unwrap_or_default()
            .into_iter()
            .take(10)
            .map(|(k, _)| k)
            .collect();
        return Err(invalid(format!(
            "no `{want}` network and no backbone tensors at the top level (top-level keys: {keys:?})"
        )));
    }
    Ok(tensors)
}

impl BackboneWeights {
    /// Reads the `key` network of `path`, whichever format it is.
    pub fn load(path: &Path, key: CheckpointKey) -> Result<Self, BackboneError> {
        match pth::sniff(path)? {
            FileKind::Zip | FileKind::LegacyPickle => Self::from_pth(path, key),
            FileKind::Other => Self::from_ours(path, key),
        }
    }

    fn invalid(path: &Path, what: String) -> BackboneError {
        BackboneError::Invalid {
            path: path.to_path_buf(),
            what,
        }
    }

    /// A `.pth`: a training checkpoint (`key` selects the network, as scDINO's
    /// `checkpoint_key`), or a bare state dict when the file has neither network.
    fn from_pth(path: &Path, key: CheckpointKey) -> Result<Self, BackboneError> {
        let f = PthFile::open(path)?;
        let mut tensors = HashMap::new();
        for (name, t) in pth_network(&f, path, key)? {
            tensors.insert(name, f.tensor(&t)?);
        }
        let root = f.root();
        Ok(Self {
            path: path.to_path_buf(),
            tensors,
            epoch: root
                .get("epoch")
                .and_then(|e| e.as_int())
                .and_then(|e| usize::try_from(e).ok()),
            progress: None,
            args: root.get("args").and_then(|a| TrainingArgs::from_value(&a)),
            trained: None,
        })
    }

    /// The shapes of the `key` network's tensors by the names [`Self::load`] gives them, read
    /// without the tensor data: a `.pth`'s pickle (its storages are not read), our
    /// checkpoint's safetensors header. What a config needs of a `model.init` source
    /// (train/init_layout.rs) every time a command reads that config, so a multi-GB source
    /// must not be read whole for it.
    pub fn shapes(
        path: &Path,
        key: CheckpointKey,
    ) -> Result<BTreeMap<String, Vec<i64>>, BackboneError> {
        if pth::sniff(path)? != FileKind::Other {
            let f = PthFile::open(path)?;
            return Ok(pth_network(&f, path, key)?
                .into_iter()
                .map(|(name, t)| (name, t.size))
                .collect());
        }
        let header = checkpoint::read_header(path)?;
        let shapes = crate::tensor_file::header_shapes(&header)
            .map_err(|e| Self::invalid(path, e.to_string()))?;
        let prefix = format!("{}.", key_name(key));
        let shapes: BTreeMap<String, Vec<i64>> = shapes
            .into_iter()
            .filter_map(|(name, shape)| Some((backbone_name(name.strip_prefix(&prefix)?)?, shape)))
            .collect();
        if shapes.is_empty() {
            return Err(Self::invalid(
                path,
                format!("no {} backbone", key_name(key)),
            ));
        }
        Ok(shapes)
    }

    /// One of our safetensors checkpoints (`teacher.backbone.*`).
    fn from_ours(path: &Path, key: CheckpointKey) -> Result<Self, BackboneError> {
        let ck = checkpoint::load(path)?;
        let prefix = format!("{}.", key_name(key));
        let tensors: HashMap<String, Tensor> = ck
            .tensors
            .iter()
            .filter_map(|(name, t)| {
                let short = backbone_name(name.strip_prefix(&prefix)?)?;
                Some((short, t.shallow_clone()))
            })
            .collect();
        if tensors.is_empty() {
            return Err(Self::invalid(
                path,
                format!("no {} backbone", key_name(key)),
            ));
        }
        let epoch_known = epoch_known(&ck.meta);
        Ok(Self {
            path: path.to_path_buf(),
            tensors,
            epoch: epoch_known.then_some(ck.meta.epoch),
            progress: epoch_known.then_some((ck.meta.epoch_batch, ck.meta.iteration)),
            args: None,
            trained: TrainedChannels::from_fingerprint(&ck.meta.fingerprint),
        })
    }

    /// The name part of feature files (see [`tag_for`]).
    pub fn tag(&self) -> String {
        tag_for(&self.path, self.epoch, self.progress)
    }

    /// The weight of the patch embedding, adapted to `channels` (file channel indices) as
    /// configured; see [`PatchEmbedAdapt`].
    pub fn patch_embed_for(
        &self,
        channels: &[usize],
        adapt: &PatchEmbedAdapt,
    ) -> Result<Tensor, BackboneError> {
        let w = self
            .tensors
            .get("patch_embed.proj.weight")
            .ok_or_else(|| Self::invalid(&self.path, "no patch_embed.proj.weight".into()))?;
        if w.dim() != 4 {
            return Err(Self::invalid(
                &self.path,
                format!("patch_embed.proj.weight has shape {:?}", w.size()),
            ));
        }
        let ck_chans = w.size()[1] as usize;
        match adapt {
            PatchEmbedAdapt::Mean => Ok(w
                .to_kind(Kind::Float)
                .mean_dim(1, true, Kind::Float)
                .repeat([1, channels.len() as i64, 1, 1])),
            PatchEmbedAdapt::Map(map) => {
                let mut seq = Vec::with_capacity(channels.len());
                for &c in channels {
                    let src = *map.get(&c).ok_or_else(|| {
                        Self::invalid(
                            &self.path,
                            format!("channel {c} has no entry in downstream.features.custom_embedding_map"),
                        )
                    })?;
                    if src >= ck_chans {
                        return Err(Self::invalid(
                            &self.path,
                            format!("downstream.features.custom_embedding_map maps channel {c} to checkpoint channel {src}, but the checkpoint's patch embedding has only {ck_chans} channels"),
                        ));
                    }
                    seq.push(src as i64);
                }
                Ok(w.index_select(1, &Tensor::from_slice(&seq)))
            }
            PatchEmbedAdapt::None if ck_chans != channels.len() => Err(Self::invalid(
                &self.path,
                format!(
                    "the checkpoint's patch embedding takes {ck_chans} channels but the channel combination {channels:?} has {}; set downstream.features.use_mean_patch_embedding or downstream.features.custom_embedding_map to adapt it",
                    channels.len()
                ),
            )),
            PatchEmbedAdapt::None => Ok(w.shallow_clone()),
        }
    }

    /// Writes the backbone as one of our checkpoints (`{key}.backbone.*`), loadable wherever a
    /// checkpoint is (`trainer features --checkpoint`). The fingerprint records the source, so
    /// a training run refuses to resume from it.
    pub fn save(&self, out: &Path, key: CheckpointKey) -> Result<(), BackboneError> {
        let mut names: Vec<&String> = self.tensors.keys().collect();
        names.sort();
        let tensors: Vec<(String, Tensor)> = names
            .into_iter()
            .map(|n| {
                (
                    format!("{}.backbone.{n}", key_name(key)),
                    self.tensors[n].shallow_clone(),
                )
            })
            .collect();
        let args: BTreeMap<String, String> = self
            .args
            .as_ref()
            .map(|a| a.all.iter().cloned().collect())
            .unwrap_or_default();
        let meta = checkpoint::CheckpointMeta {
            format: checkpoint::FORMAT.into(),
            epoch: self.epoch.unwrap_or(0),
            epoch_batch: 0,
            iteration: 0,
            seed: 0,
            fingerprint: serde_json::json!({
                IMPORTED: self.path.display().to_string(),
                "checkpoint_key": key_name(key),
                "epoch_known": self.epoch.is_some(),
                "args": args,
            })
            .to_string(),
            config_yaml: String::new(),
            mean: vec![],
            std: vec![],
            epoch_totals: Default::default(),
            loss_scaler: None,
            dataset: None,
        };
        checkpoint::save(out, &tensors, &meta)?;
        Ok(())
    }
}

/// How the checkpoint's patch embedding meets a channel combination (scDINO
/// `compute_CLS_features.py`).
#[derive(Debug, Clone, PartialEq)]
pub enum PatchEmbedAdapt {
    /// Channel counts must match.
    None,
    /// `use_mean_patch_embedding`: the conv kernel averaged over its input channels, repeated
    /// once per selected channel (applied even when the counts match, as scDINO does).
    Mean,
    /// `custom_embedding_map`: selected file channel `c` uses checkpoint input channel
    /// `map[c]` (scDINO keys the map by the image's channel index, not the position in the
    /// combination).
    Map(BTreeMap<usize, usize>),
}

impl PatchEmbedAdapt {
    pub fn from_config(f: &crate::config::FeaturesSection) -> Self {
        if f.use_mean_patch_embedding {
            Self::Mean
        } else if !f.custom_embedding_map.is_empty() {
            Self::Map(f.custom_embedding_map.clone())
        } else {
            Self::None
        }
    }
}

/// One meaning per tag: `epoch{E}` = the weights after epoch E, counted from 0 (E = epochs
/// done - 1, scDINO's `checkpoint{E}.pth`); `init` = the network before its first step;
/// `step{N}` = a checkpoint in the middle of an epoch (after N steps: `--max-steps`, a
/// preempted run's latest); `model_{file stem}` when the file does not say which epoch it
/// is (scDINO's downstream-only naming). `progress` is `(batches of the running epoch done,
/// iteration)` where the file records it (our checkpoints).
fn tag_for(path: &Path, epoch: Option<usize>, progress: Option<(usize, usize)>) -> String {
    match (epoch, progress) {
        (Some(_), Some((batch, iteration))) if batch > 0 => format!("step{iteration}"),
        (Some(0), Some((_, 0))) => "init".to_string(),
        (Some(0), Some((_, iteration))) => format!("step{iteration}"),
        (Some(e), _) => format!("epoch{}", e.saturating_sub(1)),
        (None, _) => format!(
            "model_{}",
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        ),
    }
}

/// False for a checkpoint imported from a `.pth` that had no `epoch` entry: its `meta.epoch`
/// is a placeholder.
fn epoch_known(meta: &checkpoint::CheckpointMeta) -> bool {
    serde_json::from_str::<serde_json::Value>(&meta.fingerprint)
        .ok()
        .filter(|v| v.get(IMPORTED).is_some())
        .and_then(|v| v.get("epoch_known")?.as_bool())
        .unwrap_or(true)
}

/// The tag the outputs of a timm folder are named with: `model_{folder name}`, as a
/// checkpoint without an epoch is (scDINO's downstream-only naming).
pub fn timm_folder_tag(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("model_{name}")
}

/// [`BackboneWeights::tag`] without loading any weights: our checkpoints' safetensors header,
/// or a `.pth` file's pickle (its storages are not read).
pub fn checkpoint_tag(path: &Path) -> Result<String, BackboneError> {
    if crate::model::timm::is_timm_folder(path) {
        return Ok(timm_folder_tag(path));
    }
    let (epoch, progress) = match pth::sniff(path)? {
        FileKind::Zip | FileKind::LegacyPickle => (
            PthFile::open(path)?
                .root()
                .get("epoch")
                .and_then(|e| e.as_int())
                .and_then(|e| usize::try_from(e).ok()),
            None,
        ),
        FileKind::Other => {
            let meta = checkpoint::read_meta(path)?;
            let known = epoch_known(&meta);
            (
                known.then_some(meta.epoch),
                known.then_some((meta.epoch_batch, meta.iteration)),
            )
        }
    };
    Ok(tag_for(path, epoch, progress))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dino_renaming() {
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            backbone_name("module.backbone.blocks.0.attn.qkv.weight"),
            some("blocks.0.attn.qkv.weight")
        );
        assert_eq!(backbone_name("backbone.cls_token"), some("cls_token"));
        assert_eq!(backbone_name("pos_embed"), some("pos_embed"));
        // DINOv2's chunked blocks.
        assert_eq!(
            backbone_name("backbone.blocks.1.7.ls1.gamma"),
            some("blocks.7.ls1.gamma")
        );
        assert_eq!(
            backbone_name("blocks.11.mlp.fc1.bias"),
            some("blocks.11.mlp.fc1.bias")
        );
        assert_eq!(backbone_name("module.head.mlp.0.weight"), None);
        assert_eq!(backbone_name("head.last_layer.weight_g"), None);
    }
}
