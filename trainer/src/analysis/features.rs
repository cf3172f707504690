//! CLS features of the held-out images (scDINO `compute_CLS_features.py` and
//! `extract_image_labels.py` in one pass): the checkpoint's backbone, the same preprocessing
//! as training, resize (bilinear, shorter side to `resize_length`), normalisation, CLS token,
//! L2 normalisation. Features, labels and paths are produced together, so they cannot drift
//! apart (scDINO ran two jobs and relied on the sampler order matching).
use crate::analysis::pretrained::{self, InputSize, ModelInput};
use crate::checkpoint;
use crate::config::{BagPool, ChannelMode, Config, MissingChannels, TokensPool};
use crate::data::cell_channels::{combination_split, selection_in_cell};
use crate::data::mean_std::MeanStd;
use crate::data::preprocess::preprocess;
use crate::data::{self, quality, ImageChw, PreprocessOptions};
use crate::layout::ModelLayout;
use crate::model::backbone::{BackboneError, BackboneWeights, PatchEmbedAdapt};
use crate::model::channels::{for_mode, ChannelModeKind, CombinationInput};
use crate::model::{VisionTransformer, VitConfig};
use std::path::{Path, PathBuf};
use tch::{nn, Device, Kind, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum FeaturesError {
    #[error(transparent)]
    Data(#[from] data::DataError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Backbone(#[from] BackboneError),
    #[error(transparent)]
    Pretrained(#[from] crate::analysis::pretrained::PretrainedError),
    #[error(transparent)]
    MeanStd(#[from] crate::data::mean_std::MeanStdError),
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    #[error("channel combination {index} does not exist")]
    NoCombination { index: usize },
    #[error("the backbone failed on a batch of {} images ({}{}): {reason}", images.len(), images.iter().take(3).cloned().collect::<Vec<_>>().join(", "), if images.len() > 3 { ", ..." } else { "" })]
    Forward { images: Vec<String>, reason: String },
    #[error("the held-out split is empty")]
    EmptyHeldOut,
    /// A cell with its own channels lacks one of the combination's.
    #[error("{} holds the channels [{held}], not every one of [{wanted}] (data.screen.cell_channels: own)", path.display())]
    LacksChannels {
        path: PathBuf,
        held: String,
        wanted: String,
    },
    #[error("{} has {found} channels but data.channel_names lists {expected}", path.display())]
    ChannelCount {
        path: PathBuf,
        found: usize,
        expected: usize,
    },
    /// `trainer embed` with a timm folder: no run config, so the count asked for is the
    /// model's input channels.
    #[error("{} has {found} channels, but the timm model {} takes {expected} input channels: `trainer embed` gives it every channel of an image, in file order, so each image must have exactly {expected} (`trainer features` with a run config selects or adapts channels)", path.display(), folder.display())]
    FolderChannelCount {
        path: PathBuf,
        found: usize,
        folder: PathBuf,
        expected: usize,
    },
    #[error("{} was trained with model.channels: {trained}, the config says {configured}", checkpoint.display())]
    ChannelModeMismatch {
        checkpoint: PathBuf,
        trained: &'static str,
        configured: &'static str,
    },
    #[error("{} was trained on channel {channel}, which data.channel_names does not list", checkpoint.display())]
    MissingChannel {
        channel: String,
        checkpoint: PathBuf,
    },
    #[error("{}: {features} feature rows but {labels} labels, {paths} paths, {indices} indices", path.display())]
    RowCountMismatch {
        path: PathBuf,
        features: usize,
        labels: usize,
        paths: usize,
        indices: usize,
    },
    /// The checkpoint lacks a tensor the configured backbone has.
    #[error("{}: backbone tensor {tensor} is missing", checkpoint.display())]
    MissingTensor { checkpoint: PathBuf, tensor: String },
    #[error(transparent)]
    ShapeMismatch(Box<ShapeMismatch>),
    /// An adaptive `model.channels` needs to know which channels the checkpoint saw; a
    /// checkpoint from elsewhere does not say.
    #[error("{} does not record how it takes channels; model.channels: {configured} needs a checkpoint trained here with it", checkpoint.display())]
    ChannelModeUnrecorded {
        checkpoint: PathBuf,
        configured: &'static str,
    },
    /// A `fixed` model asked to embed channels other than the ones it was trained on.
    #[error("{} is a model.channels: fixed model trained on [{}]; it takes exactly those channels, not [{}] (train a model for this combination, or one model for every combination with model.channels: tokens or bag; downstream.features.missing_channels: zeros feeds the channels it lacks as zeros)", checkpoint.display(), trained.join(", "), wanted.join(", "))]
    FixedChannels {
        checkpoint: PathBuf,
        trained: Vec<String>,
        wanted: Vec<String>,
    },
    /// A feature bundle without the tensor or metadata that binds its rows.
    #[error("{}: {problem}", path.display())]
    Bundle {
        path: PathBuf,
        problem: BundleProblem,
    },
    /// Features that could not be copied out of their tensor.
    #[error(transparent)]
    Tensor(tch::TchError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A checkpoint tensor of another shape than the configured backbone's (`hint` says what
/// the checkpoint was trained with, when it records it).
#[derive(Debug, thiserror::Error)]
#[error("{}: backbone tensor {tensor} has shape {found:?}, the configured model ({model}) needs {needed:?}{hint}", checkpoint.display())]
pub struct ShapeMismatch {
    pub checkpoint: PathBuf,
    pub tensor: String,
    pub found: Vec<i64>,
    pub needed: Vec<i64>,
    pub model: String,
    pub hint: String,
}

/// What a feature bundle lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleProblem {
    #[error("no `features` tensor")]
    NoFeatures,
    #[error("metadata is not JSON")]
    MetadataNotJson,
    #[error("metadata has no `{0}` list")]
    NoList(&'static str),
    /// An entry of the `{0}` list of another type than the list's.
    #[error("{0}")]
    BadEntry(&'static str),
}

/// Rows in held-out order: `features[i]` belongs to `labels[i]` and `paths[i]`.
pub struct FeatureSet {
    /// `[N, D]`, float32, rows of unit L2 norm.
    pub features: Tensor,
    pub labels: Vec<String>,
    pub paths: Vec<String>,
    /// Dataset indices (ImageFolder order).
    pub indices: Vec<usize>,
    /// Names the output files: `epoch{E}` after the checkpoint's epoch (see
    /// [`BackboneWeights::tag`]).
    pub tag: String,
    /// The checkpoint file the features were computed with, and its epoch (epochs finished
    /// when it was written; absent for a foreign `.pth` without one).
    pub checkpoint: String,
    pub checkpoint_epoch: Option<usize>,
}

/// The configured ViT with `weights` loaded on `device`, for images of `channels` (file
/// channel indices).
/// The patch embedding is adapted as `downstream.features` says (see
/// [`PatchEmbedAdapt`]); every other tensor must exist with the configured shape (scDINO loads
/// with `strict=False`, which leaves a missing tensor at its random init: we refuse instead).
pub fn load_backbone(
    cfg: &Config,
    weights: &BackboneWeights,
    channels: &[usize],
    device: Device,
) -> Result<(nn::VarStore, VisionTransformer), FeaturesError> {
    let adapt = PatchEmbedAdapt::from_config(&cfg.downstream.features);
    let patch_embed = weights.patch_embed_for(channels, &adapt)?;
    let hint = weights
        .args
        .as_ref()
        .map(|a| format!(" (the checkpoint was trained with {})", a.summary()))
        .unwrap_or_default();
    let vit_cfg = crate::model::with_layout(
        VitConfig::new(cfg.model.arch, cfg.model.patch_size, channels.len())
            .with_registers(cfg.model.num_register_tokens),
        &cfg.model,
    );
    let model = format!("{:?}, patch {}", cfg.model.arch, cfg.model.patch_size);
    build_backbone(weights, vit_cfg, Some(patch_embed), &model, &hint, device)
}

/// A frozen backbone of `vit_cfg` on `device` holding `weights` (the patch-embedding weight
/// replaced by `patch_embed` when given); a tensor missing or of another shape is an error
/// naming it, the configured `model` and the `hint`.
fn build_backbone(
    weights: &BackboneWeights,
    vit_cfg: VitConfig,
    patch_embed: Option<Tensor>,
    model: &str,
    hint: &str,
    device: Device,
) -> Result<(nn::VarStore, VisionTransformer), FeaturesError> {
    let mut vs = nn::VarStore::new(device);
    let vit = VisionTransformer::new(vs.root() / "backbone", vit_cfg);
    tch::no_grad(|| {
        for (name, mut t) in vs.variables() {
            let short = name.strip_prefix("backbone.").unwrap_or(&name);
            let src = match &patch_embed {
                Some(p) if short == "patch_embed.proj.weight" => p.shallow_clone(),
                _ => weights
                    .tensors
                    .get(short)
                    .map(Tensor::shallow_clone)
                    .ok_or_else(|| FeaturesError::MissingTensor {
                        checkpoint: weights.path.clone(),
                        tensor: short.to_string(),
                    })?,
            };
            if src.size() != t.size() {
                return Err(FeaturesError::ShapeMismatch(Box::new(ShapeMismatch {
                    checkpoint: weights.path.clone(),
                    tensor: short.to_string(),
                    found: src.size(),
                    needed: t.size(),
                    model: model.to_string(),
                    hint: hint.to_string(),
                })));
            }
            t.copy_(&src);
        }
        Ok(())
    })?;
    vs.freeze();
    Ok((vs, vit))
}

/// How a batch of one combination's images becomes features: the backbone, and how the
/// combination's channels reach it, as its `model.channels` mode says (see
/// [`ChannelModeKind::features`]). A `bag` model's pooling is decided here, where every
/// feature of a combination is made (features stage, evaluate), so no analysis can read
/// another.
pub struct Embedder {
    kind: &'static dyn ChannelModeKind,
    vit: VisionTransformer,
    input: CombinationInput,
}

impl Embedder {
    /// A `fixed` model whose input channels are the combination's, as they come (a backbone
    /// from elsewhere: a timm folder, a `.pth`).
    pub fn fixed(vit: VisionTransformer) -> Self {
        let trained = vit.config().in_chans;
        Self {
            kind: for_mode(ChannelMode::Fixed),
            vit,
            input: CombinationInput {
                positions: None,
                trained,
                bag_pool: BagPool::default(),
                tokens_pool: TokensPool::default(),
            },
        }
    }

    /// `[B, k, H, W]` → features `[B, D]` (`[B, k·D]` for `bag` concatenated), rows not yet
    /// normalised.
    pub fn embed(&self, x: &Tensor) -> Tensor {
        tch::no_grad(|| self.kind.features(&self.vit, x, &self.input))
    }

    /// Features `[B, D]` (float32, on `device`, rows not yet normalised) of prepared images
    /// `inputs` (`[k, H, W]` each, in order) that may differ in size: a non-square crop keeps
    /// its aspect ratio through the resize (scDINO's `Resize(resize_length)`), and the
    /// backbone takes any multiple-of-patch size by resampling its positions. Images of one
    /// size are stacked and run together, each size in order of first appearance, and the
    /// rows go back to the order given; so a batch of equal sizes is one forward, exactly as
    /// before. A libtorch error (a size the backbone cannot take) comes back as its message,
    /// never as a panic.
    pub fn embed_images(
        &self,
        inputs: &[Tensor],
        device: Device,
        kind: Kind,
    ) -> Result<Tensor, String> {
        let mut groups: Vec<(Vec<i64>, Vec<usize>)> = vec![];
        for (i, x) in inputs.iter().enumerate() {
            let size = x.size();
            match groups.iter_mut().find(|(s, _)| *s == size) {
                Some((_, members)) => members.push(i),
                None => groups.push((size, vec![i])),
            }
        }
        let forward = |members: &[usize]| -> Result<Tensor, String> {
            let batch: Vec<&Tensor> = members.iter().map(|&i| &inputs[i]).collect();
            let x = Tensor::f_stack(&batch, 0)
                .and_then(|x| x.f_to_device(device))
                .and_then(|x| x.f_to_kind(kind))
                .map_err(|e| e.to_string())?;
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.embed(&x).to_kind(Kind::Float)
            }))
            .map_err(|p| panic_message(p.as_ref()))
        };
        if groups.len() == 1 {
            return forward(&groups[0].1);
        }
        let mut rows: Vec<Option<Tensor>> = (0..inputs.len()).map(|_| None).collect();
        for (_, members) in &groups {
            let f = forward(members)?;
            for (j, &i) in members.iter().enumerate() {
                rows[i] = Some(f.get(j as i64));
            }
        }
        let rows: Vec<Tensor> = rows.into_iter().flatten().collect();
        Ok(Tensor::stack(&rows, 0))
    }

    /// Feature dimension for `k` channels.
    pub fn dim(&self, k: usize) -> i64 {
        self.kind
            .feature_dim(self.vit.config().embed_dim, k, &self.input)
    }

    /// The named attention maps of one image `x` (`[k, h, w]`, normalised) of the
    /// combination's `channel_names`.
    /// The backbone's patch side: a map's pixels repeat each patch's value this many times
    /// in each direction.
    pub fn patch_size(&self) -> i64 {
        self.vit.config().patch_size
    }

    pub fn attention_maps(&self, x: &Tensor, channel_names: &[&str]) -> Vec<(String, Tensor)> {
        self.kind
            .attention_maps(&self.vit, x, &self.input, channel_names)
    }
}

/// The backbone of `weights` ready to embed the combination `channels` (file channel
/// indices) as `model.channels` says; a `bag`/`tokens` checkpoint is read as it was trained
/// (no patch-embedding adapter), its channels matched to the combination by name.
pub fn load_embedder(
    cfg: &Config,
    weights: &BackboneWeights,
    channels: &[usize],
    device: Device,
) -> Result<(nn::VarStore, Embedder), FeaturesError> {
    let mode = cfg.model.channels;
    let kind = for_mode(mode);
    if let Some(t) = &weights.trained {
        if t.mode != mode {
            return Err(FeaturesError::ChannelModeMismatch {
                checkpoint: weights.path.clone(),
                trained: t.mode.name(),
                configured: mode.name(),
            });
        }
    } else if mode.is_adaptive() {
        return Err(FeaturesError::ChannelModeUnrecorded {
            checkpoint: weights.path.clone(),
            configured: mode.name(),
        });
    }
    let wanted: Vec<&str> = channels
        .iter()
        .map(|&c| cfg.data.channel_names[c].as_str())
        .collect();
    let trained = match &weights.trained {
        Some(t) if mode.is_adaptive() => t,
        _ => return load_per_combination(cfg, weights, channels, &wanted, device),
    };
    let m = &cfg.model;
    let vit_cfg = kind
        .vit_config(m.arch, m.patch_size, trained.names.len())
        .with_registers(m.num_register_tokens);
    let vit_cfg = crate::model::with_layout(vit_cfg, m);
    let model = format!(
        "{:?}, patch {}, model.channels: {}",
        m.arch,
        m.patch_size,
        mode.name()
    );
    let (vs, vit) = build_backbone(weights, vit_cfg, None, &model, "", device)?;
    let positions = if kind.knows_channels() {
        Some(trained.indices_of(&wanted, &weights.path)?)
    } else {
        None
    };
    let input = CombinationInput {
        positions,
        trained: trained.names.len() as i64,
        bag_pool: cfg.downstream.features.bag_pool,
        tokens_pool: cfg.downstream.features.tokens_pool,
    };
    Ok((vs, Embedder { kind, vit, input }))
}

/// A model trained on one combination (`fixed`) for the combination `channels` (`wanted`
/// by name): its patch embedding adapted as `downstream.features` says, or, with
/// `missing_channels: zeros`, the channels it lacks fed as zeros.
fn load_per_combination(
    cfg: &Config,
    weights: &BackboneWeights,
    channels: &[usize],
    wanted: &[&str],
    device: Device,
) -> Result<(nn::VarStore, Embedder), FeaturesError> {
    let kind = for_mode(cfg.model.channels);
    let embedder = |vit, positions, trained| Embedder {
        kind,
        vit,
        input: CombinationInput {
            positions,
            trained,
            bag_pool: cfg.downstream.features.bag_pool,
            tokens_pool: cfg.downstream.features.tokens_pool,
        },
    };
    if let (Some(t), MissingChannels::Zeros) =
        (&weights.trained, cfg.downstream.features.missing_channels)
    {
        if t.names
            .iter()
            .map(String::as_str)
            .ne(wanted.iter().copied())
        {
            let positions = t.indices_of(wanted, &weights.path)?;
            let trained_channels: Vec<usize> = t
                .names
                .iter()
                .map(|n| {
                    cfg.data
                        .channel_names
                        .iter()
                        .position(|c| c == n)
                        .ok_or_else(|| FeaturesError::MissingChannel {
                            channel: n.clone(),
                            checkpoint: weights.path.clone(),
                        })
                })
                .collect::<Result<_, _>>()?;
            let (vs, vit) = load_backbone(cfg, weights, &trained_channels, device)?;
            return Ok((vs, embedder(vit, Some(positions), t.names.len() as i64)));
        }
    }
    if let (Some(t), true) = (&weights.trained, cfg.downstream.features.is_unadapted()) {
        if t.names
            .iter()
            .map(String::as_str)
            .ne(wanted.iter().copied())
        {
            return Err(FeaturesError::FixedChannels {
                checkpoint: weights.path.clone(),
                trained: t.names.clone(),
                wanted: wanted.iter().map(|w| w.to_string()).collect(),
            });
        }
    }
    let (vs, vit) = load_backbone(cfg, weights, channels, device)?;
    Ok((vs, embedder(vit, None, channels.len() as i64)))
}

/// torchvision `Resize(size)` with an int: the shorter side becomes `size`.
pub(crate) fn resized_hw(h: usize, w: usize, size: usize) -> (i64, i64) {
    if h <= w {
        (size as i64, (size * w / h) as i64)
    } else {
        ((size * h / w) as i64, size as i64)
    }
}

pub(crate) fn to_tensor(img: &ImageChw) -> Tensor {
    Tensor::from_slice(&img.data).reshape([
        img.channels as i64,
        img.height as i64,
        img.width as i64,
    ])
}

/// Extracts the held-out features of channel combination `combination` with `checkpoint`
/// (one of ours or a PyTorch `.pth`).
pub fn extract(
    cfg: &Config,
    combination: usize,
    checkpoint_path: &Path,
    mean_std: &MeanStd,
) -> Result<FeatureSet, FeaturesError> {
    extract_shard(cfg, combination, checkpoint_path, mean_std, 0, 1)
}

/// The share of rank `rank` of `world`: held-out positions `rank, rank + world, …`. The
/// returned set's labels, paths and indices still cover every held-out row (every rank knows
/// them from the seeded split); only `features` are this rank's rows, in that order.
/// [`crate::pipeline::stages::features`] gathers and interleaves the shares.
pub fn extract_shard(
    cfg: &Config,
    combination: usize,
    checkpoint_path: &Path,
    mean_std: &MeanStd,
    rank: usize,
    world: usize,
) -> Result<FeatureSet, FeaturesError> {
    let source = data::open_source(&cfg.data)?;
    let index = source.index();
    let channels = cfg
        .channel_sets
        .get(combination)
        .ok_or(FeaturesError::NoCombination { index: combination })?;
    let split = combination_split(source.as_ref(), &cfg.data, cfg.run.seed as u32, channels)?;
    if split.held_out.is_empty() {
        return Err(FeaturesError::EmptyHeldOut);
    }
    let mine: Vec<usize> = split
        .held_out
        .iter()
        .copied()
        .skip(rank)
        .step_by(world.max(1))
        .collect();
    let mut set = extract_indices(
        cfg,
        combination,
        checkpoint_path,
        mean_std,
        source.as_ref(),
        &mine,
    )?;
    set.labels = split
        .held_out
        .iter()
        .map(|&i| index.samples[i].label.clone())
        .collect();
    set.paths = split
        .held_out
        .iter()
        .map(|&i| index.samples[i].path.display().to_string())
        .collect();
    set.indices = split.held_out.clone();
    Ok(set)
}

/// The features of `indices` of `source` (any image set with the training data's channels:
/// the training folder's splits, or a separate test folder), in that order.
pub fn extract_indices(
    cfg: &Config,
    combination: usize,
    checkpoint_path: &Path,
    mean_std: &MeanStd,
    source: &dyn data::ImageSource,
    indices: &[usize],
) -> Result<FeatureSet, FeaturesError> {
    let channels = cfg
        .channel_sets
        .get(combination)
        .cloned()
        .ok_or(FeaturesError::NoCombination { index: combination })?;
    let f = &cfg.downstream.features;
    // The forward passes run on `train.device` (this process's GPU on a GPU node); images are
    // prepared and features collected on the CPU.
    let device = crate::device::resolve_for_this_process(cfg.train.device)?;
    let (_vs, embedder, preparer, tag, epoch) = if pretrained::is_timm_folder(checkpoint_path) {
        let p = pretrained::for_config(cfg, &channels, checkpoint_path, device)?;
        let tag = crate::model::backbone::timm_folder_tag(checkpoint_path);
        let (embedder, preparer) = (Embedder::fixed(p.vit), Preparer::pretrained(p.input));
        (p.vs, embedder, preparer, tag, None)
    } else {
        let weights = BackboneWeights::load(checkpoint_path, f.checkpoint_key)?;
        let (vs, embedder) = load_embedder(cfg, &weights, &channels, device)?;
        let (mean, std) = mean_std.select(&channels, &cfg.data.channel_names);
        let preparer = Preparer::new(cfg, &channels, mean, std);
        (vs, embedder, preparer, weights.tag(), weights.epoch)
    };
    let index = source.index();
    let mut rows = Vec::new();
    // A streaming source fetches these images ahead of the forward passes.
    source.will_read(indices);
    for chunk in indices.chunks(f.batch_size_per_gpu.max(1)) {
        let mut batch = Vec::with_capacity(chunk.len());
        for &i in chunk {
            let raw = source.read(i)?;
            let path = &index.samples[i].path;
            let within = selection_in_cell(source, i, &channels)
                .map_err(|held| preparer.lacks(path, &held))?;
            batch.push(preparer.prepare(&raw, within.as_deref(), path)?);
        }
        let f = embedder
            .embed_images(&batch, device, Kind::Float)
            .map_err(|reason| FeaturesError::Forward {
                images: chunk
                    .iter()
                    .map(|&i| index.samples[i].path.display().to_string())
                    .collect(),
                reason,
            })?;
        rows.push(f.to_device(Device::Cpu));
    }
    let features = if rows.is_empty() {
        Tensor::zeros(
            [0, embedder.dim(channels.len())],
            (Kind::Float, tch::Device::Cpu),
        )
    } else {
        unit_rows(&Tensor::cat(&rows, 0))
    };
    Ok(FeatureSet {
        features,
        labels: indices
            .iter()
            .map(|&i| index.samples[i].label.clone())
            .collect(),
        paths: indices
            .iter()
            .map(|&i| index.samples[i].path.display().to_string())
            .collect(),
        indices: indices.to_vec(),
        tag,
        checkpoint: checkpoint_path.display().to_string(),
        checkpoint_epoch: epoch,
    })
}

/// Names (once per process) what min–max scaling guarded in one image; scDINO replaced such
/// an image by dataset image 0, so its feature row described another cell.
fn warn_guarded(outcome: &data::MinMaxOutcome, selected: &[usize], names: &[String], path: &Path) {
    if let Some(&k) = outcome.constant_channels.first() {
        quality::constant_channel(selected[k], names, path);
    }
    if outcome.nonfinite_pixels > 0 {
        quality::nonfinite_pixels(outcome.nonfinite_pixels, path);
    }
}

/// The text of a caught panic (libtorch's error message, for tch's panicking calls).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Rows scaled to unit L2 norm, as every feature table holds them.
pub fn unit_rows(features: &Tensor) -> Tensor {
    features / features.norm_scalaropt_dim(2.0, [1], true).clamp_min(1e-12)
}

/// How one decoded image becomes a backbone input, exactly as the features stage prepares
/// it: the file must have the run's channel count; the combination's channels are selected,
/// centre-cropped and min–max scaled ([`preprocess`]), resized (bilinear, shorter side to
/// `resize_length`) and normalised with the dataset mean/std. Shared by `trainer features`,
/// `evaluate` and `trainer embed`, so their numbers agree by construction.
pub struct Preparer {
    channels: Vec<usize>,
    file_channels: usize,
    names: Vec<String>,
    opts: PreprocessOptions,
    resize: Option<usize>,
    /// A pretrained model's own input size (instead of `resize`).
    input: Option<InputSize>,
    /// The timm folder whose input channel count `file_channels` is (None: the run config's).
    folder: Option<PathBuf>,
    /// Per selected channel, when `downstream.features.normalize`.
    normalize: Option<(Vec<f32>, Vec<f32>)>,
}

impl Preparer {
    /// For the file channels `channels` of `cfg`'s data, normalised with `mean`/`std` (one
    /// value per selected channel).
    pub fn new(cfg: &Config, channels: &[usize], mean: Vec<f32>, std: Vec<f32>) -> Self {
        let f = &cfg.downstream.features;
        Self {
            channels: channels.to_vec(),
            file_channels: cfg.file_channels(),
            names: cfg.data.channel_names.clone(),
            opts: PreprocessOptions {
                selected_channels: Some(channels.to_vec()),
                center_crop: cfg.data.center_crop,
            },
            resize: f.resize.then_some(f.resize_length),
            input: None,
            folder: None,
            normalize: f.normalize.then_some((mean, std)),
        }
    }

    /// For a pretrained model ([`pretrained`]): the input it expects (its own size and
    /// mean/std).
    pub fn pretrained(input: ModelInput) -> Self {
        let ModelInput {
            file_channels,
            channels,
            names,
            center_crop,
            size,
            mean,
            std,
            folder,
        } = input;
        Self {
            opts: PreprocessOptions {
                selected_channels: Some(channels.clone()),
                center_crop,
            },
            channels,
            file_channels,
            names,
            resize: None,
            input: Some(size),
            folder,
            normalize: Some((mean, std)),
        }
    }

    /// Cell `path` holds only the channels `held` (positions in `data.channel_names`), not
    /// every one of the combination's (`data.screen.cell_channels: own`).
    pub fn lacks(&self, path: &Path, held: &[usize]) -> FeaturesError {
        let names = |c: &[usize]| -> String {
            c.iter()
                .map(|&c| self.names[c].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        FeaturesError::LacksChannels {
            path: path.to_path_buf(),
            held: names(held),
            wanted: names(&self.channels),
        }
    }

    /// `raw` (read from `path`, which errors name) as a `[k, H, W]` float tensor. `within`:
    /// for a cell read with its own channels, where the combination's lie among them
    /// ([`data::cell_channels::selection_in_cell`]).
    pub fn prepare(
        &self,
        raw: &ImageChw,
        within: Option<&[usize]>,
        path: &Path,
    ) -> Result<Tensor, FeaturesError> {
        if let Some(within) = within {
            let own = PreprocessOptions {
                selected_channels: Some(within.to_vec()),
                ..self.opts.clone()
            };
            return self.finish(raw, &own, path);
        }
        if raw.channels != self.file_channels {
            return Err(match &self.folder {
                Some(folder) => FeaturesError::FolderChannelCount {
                    path: path.to_path_buf(),
                    found: raw.channels,
                    folder: folder.clone(),
                    expected: self.file_channels,
                },
                None => FeaturesError::ChannelCount {
                    path: path.to_path_buf(),
                    found: raw.channels,
                    expected: self.file_channels,
                },
            });
        }
        self.finish(raw, &self.opts, path)
    }

    /// Preprocessing with `opts`' channel selection, resizing and normalisation.
    fn finish(
        &self,
        raw: &ImageChw,
        opts: &PreprocessOptions,
        path: &Path,
    ) -> Result<Tensor, FeaturesError> {
        let (img, outcome) = preprocess(raw, opts)?;
        warn_guarded(&outcome, &self.channels, &self.names, path);
        let mut x = to_tensor(&img);
        if let Some(size) = self.resize {
            let (h, w) = resized_hw(img.height, img.width, size);
            x = x
                .unsqueeze(0)
                .upsample_bilinear2d([h, w], false, None, None)
                .squeeze_dim(0);
        }
        if let Some(input) = &self.input {
            x = input.resize(&x);
        }
        if let Some((mean, std)) = &self.normalize {
            let m = Tensor::from_slice(mean).reshape([-1, 1, 1]);
            let s = Tensor::from_slice(std).reshape([-1, 1, 1]);
            x = (x - m) / s;
        }
        Ok(x)
    }
}

/// numpy's `%.18e`: 18 decimals and an exponent with a sign and at least two digits.
pub fn format_e18(v: f64) -> String {
    let mut s = String::with_capacity(26);
    push_e18(&mut s, v);
    s
}

/// Appends [`format_e18`] of `v` to `out` without allocating: Rust writes `1.5e-7` where numpy
/// writes `1.5e-07`, so the exponent gets its sign and two digits in place.
pub fn push_e18(out: &mut String, v: f64) {
    use std::fmt::Write;
    if push_e18_f32(out, v) {
        return;
    }
    let start = out.len();
    write!(out, "{v:.18e}").expect("formatting into a String");
    let Some(e) = out[start..].find('e') else {
        return; // NaN, inf
    };
    let sign_at = start + e + 1;
    let negative = out.as_bytes()[sign_at] == b'-';
    if !negative {
        out.insert(sign_at, '+');
    }
    if out.len() - (sign_at + 1) < 2 {
        out.insert(sign_at + 1, '0');
    }
}

/// Writes `CLS_features/{tag}_features.csv` (scDINO's headerless `%.18e` CSV),
/// `class_labels.csv`, `image_paths.csv` and `CLS_features/{tag}_features.safetensors` (the
/// three bound together: features tensor plus labels and paths in its metadata), atomically.
pub fn write(files: &ModelLayout, tag: &str, set: &FeatureSet) -> Result<(), FeaturesError> {
    let feat_dir = files.features_dir();
    std::fs::create_dir_all(&feat_dir).map_err(|source| FeaturesError::Io {
        path: feat_dir.clone(),
        source,
    })?;
    write_csv(&files.features_csv(tag), &set.features)?;
    let lines = |v: &[String]| v.iter().map(|s| format!("{s}\n")).collect::<String>();
    let labels = lines(&set.labels);
    for (path, text) in [
        (files.class_labels_csv(), labels),
        (files.image_paths_csv(), lines(&set.paths)),
    ] {
        scdino_base::fs::write_atomic(&path, text.as_bytes())
            .map_err(data::DataError::writing(&path))?;
    }
    write_bundle(&files.bundle(tag), set)
}

/// [`push_e18`] for the values features are made of: an f32 widened to f64, of magnitude
/// 2^-21..2^100. Such a value is m·2^e with m < 2^24, so its exact decimal expansion
/// m·5^-e·10^e fits a u128, and its 19 significant digits are that integer's first digits,
/// rounded half to even as printf rounds; formatting that way is several times faster than
/// the general exact formatter, which dominated writing scDINO's CSV. Returns false (and
/// writes nothing) for any other value.
fn push_e18_f32(out: &mut String, v: f64) -> bool {
    let f = v as f32;
    if f as f64 != v || !f.is_normal() {
        return false;
    }
    let bits = f.to_bits();
    let m = ((bits & 0x7f_ffff) | 0x80_0000) as u128;
    let e2 = ((bits >> 23) & 0xff) as i32 - 127 - 23;
    let (n, scale) = match e2 {
        0..=100 => (m << e2, 0),
        -44..=-1 => (m * 5u128.pow((-e2) as u32), -e2),
        _ => return false,
    };
    let mut digits = [0u8; 40];
    let mut len = 0;
    let mut rest = n;
    while rest > 0 {
        digits[len] = (rest % 10) as u8;
        rest /= 10;
        len += 1;
    }
    digits[..len].reverse();
    let mut exp = len as i32 - 1 - scale;
    let mut sig = [0u8; 19];
    let kept = len.min(19);
    sig[..kept].copy_from_slice(&digits[..kept]);
    if len > 19 {
        let first = digits[19];
        let beyond = digits[20..len].iter().any(|&d| d != 0);
        let round_up = first > 5 || (first == 5 && (beyond || sig[18] % 2 == 1));
        if round_up {
            let mut i = 19;
            loop {
                if i == 0 {
                    sig[0] = 1; // 9.99…9 carried into 10.00…0
                    exp += 1;
                    break;
                }
                i -= 1;
                if sig[i] == 9 {
                    sig[i] = 0;
                } else {
                    sig[i] += 1;
                    break;
                }
            }
        }
    }
    if f < 0.0 {
        out.push('-');
    }
    out.push((b'0' + sig[0]) as char);
    out.push('.');
    for &d in &sig[1..] {
        out.push((b'0' + d) as char);
    }
    out.push('e');
    out.push(if exp < 0 { '-' } else { '+' });
    let a = exp.unsigned_abs();
    if a >= 100 {
        out.push((b'0' + (a / 100) as u8) as char);
    }
    out.push((b'0' + (a / 10 % 10) as u8) as char);
    out.push((b'0' + (a % 10) as u8) as char);
    true
}

/// `features` as scDINO's headerless `%.18e` CSV, atomically. Formatting 19 significant
/// digits per value dominates (90,851 × 384 values: numpy's savetxt takes 26 s), so the rows are
/// formatted in one chunk per core.
pub fn write_csv(path: &Path, features: &Tensor) -> Result<(), FeaturesError> {
    let rows = features.size()[0] as usize;
    let d = features.size()[1] as usize;
    let f64s = Vec::<f64>::try_from(features.to_kind(Kind::Double).flatten(0, -1))
        .map_err(FeaturesError::Tensor)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = rows.div_ceil(threads).max(1);
    let format_rows = |rows: std::ops::Range<usize>| {
        let mut csv = String::with_capacity(rows.len() * d * 26);
        for r in rows {
            for (j, &v) in f64s[r * d..(r + 1) * d].iter().enumerate() {
                if j > 0 {
                    csv.push(',');
                }
                push_e18(&mut csv, v);
            }
            csv.push('\n');
        }
        csv
    };
    let chunks: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..rows)
            .step_by(per)
            .map(|start| s.spawn(move || format_rows(start..(start + per).min(rows))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a CSV formatting thread panicked"))
            .collect()
    });
    scdino_base::fs::write_atomic_parts(path, &chunks)
        .map_err(|e| data::DataError::io(path, "writing", e))?;
    Ok(())
}

/// The safetensors bundle alone: features, labels, paths, dataset indices and the checkpoint
/// they came from, bound together and checksummed.
pub fn write_bundle(bundle: &Path, set: &FeatureSet) -> Result<(), FeaturesError> {
    let meta = checkpoint::CheckpointMeta {
        format: checkpoint::FORMAT.into(),
        epoch: 0,
        epoch_batch: 0,
        iteration: 0,
        seed: 0,
        fingerprint: serde_json::json!({
            "labels": set.labels,
            "paths": set.paths,
            "indices": set.indices,
            "checkpoint": set.checkpoint,
            "checkpoint_epoch": set.checkpoint_epoch,
        })
        .to_string(),
        config_yaml: String::new(),
        mean: vec![],
        std: vec![],
        epoch_totals: Default::default(),
        loss_scaler: None,
        dataset: None,
    };
    checkpoint::save(
        bundle,
        &[("features".to_string(), set.features.shallow_clone())],
        &meta,
    )?;
    Ok(())
}

/// The provenance of figures made from the features `set`: the checkpoint they were computed
/// with, its sha256 and epoch.
pub fn provenance(
    set: &FeatureSet,
) -> Result<crate::analysis::evaluate::Provenance, FeaturesError> {
    let path = Path::new(&set.checkpoint);
    let sha256 = pretrained::checkpoint_sha256(path).map_err(|source| FeaturesError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(crate::analysis::evaluate::Provenance {
        checkpoint: set.checkpoint.clone(),
        checkpoint_sha256: sha256,
        epoch: set.checkpoint_epoch,
        tag: set.tag.clone(),
    })
}

/// Reads back `CLS_features/{tag}_features.safetensors` (features, labels, paths and indices
/// bound together, checksum verified).
pub fn read_bundle(path: &Path) -> Result<FeatureSet, FeaturesError> {
    let ck = checkpoint::load(path)?;
    let invalid = |problem| FeaturesError::Bundle {
        path: path.to_path_buf(),
        problem,
    };
    let features = ck
        .get("features")
        .ok_or_else(|| invalid(BundleProblem::NoFeatures))?;
    let meta: serde_json::Value = serde_json::from_str(&ck.meta.fingerprint)
        .map_err(|_| invalid(BundleProblem::MetadataNotJson))?;
    let strings = |key: &'static str| -> Result<Vec<String>, FeaturesError> {
        meta[key]
            .as_array()
            .ok_or_else(|| invalid(BundleProblem::NoList(key)))?
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| invalid(BundleProblem::BadEntry(key)))
            })
            .collect()
    };
    let labels = strings("labels")?;
    let paths = strings("paths")?;
    let indices = meta["indices"]
        .as_array()
        .ok_or_else(|| invalid(BundleProblem::NoList("indices")))?
        .iter()
        .map(|v| {
            v.as_u64()
                .map(|i| i as usize)
                .ok_or_else(|| invalid(BundleProblem::BadEntry("indices")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rows = features.size()[0] as usize;
    if labels.len() != rows || paths.len() != rows || indices.len() != rows {
        return Err(FeaturesError::RowCountMismatch {
            path: path.to_path_buf(),
            features: rows,
            labels: labels.len(),
            paths: paths.len(),
            indices: indices.len(),
        });
    }
    let tag = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix("_features.safetensors"))
        .unwrap_or_default()
        .to_string();
    Ok(FeatureSet {
        features,
        labels,
        paths,
        indices,
        tag,
        checkpoint: meta["checkpoint"].as_str().unwrap_or_default().to_string(),
        checkpoint_epoch: meta["checkpoint_epoch"].as_u64().map(|e| e as usize),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages of the checkpoint and bundle refusals, as they read when they were
    /// strings.
    #[test]
    fn refusals_name_the_file_and_what_it_lacks() {
        let ck = || PathBuf::from("/r/checkpoint.safetensors");
        let cases = [
            (
                FeaturesError::MissingTensor {
                    checkpoint: ck(),
                    tensor: "cls_token".into(),
                },
                "/r/checkpoint.safetensors: backbone tensor cls_token is missing",
            ),
            (
                FeaturesError::ShapeMismatch(Box::new(ShapeMismatch {
                    checkpoint: ck(),
                    tensor: "pos_embed".into(),
                    found: vec![1, 5, 192],
                    needed: vec![1, 17, 192],
                    model: "VitTiny, patch 16".into(),
                    hint: " (the checkpoint was trained with x)".into(),
                })),
                "/r/checkpoint.safetensors: backbone tensor pos_embed has shape [1, 5, 192], the configured model (VitTiny, patch 16) needs [1, 17, 192] (the checkpoint was trained with x)",
            ),
            (
                FeaturesError::ChannelModeUnrecorded {
                    checkpoint: ck(),
                    configured: "tokens",
                },
                "/r/checkpoint.safetensors does not record how it takes channels; model.channels: tokens needs a checkpoint trained here with it",
            ),
            (
                FeaturesError::FixedChannels {
                    checkpoint: ck(),
                    trained: vec!["a".into(), "b".into()],
                    wanted: vec!["a".into()],
                },
                "/r/checkpoint.safetensors is a model.channels: fixed model trained on [a, b]; it takes exactly those channels, not [a] (train a model for this combination, or one model for every combination with model.channels: tokens or bag; downstream.features.missing_channels: zeros feeds the channels it lacks as zeros)",
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.to_string(), want);
        }
        let bundle = |problem| {
            FeaturesError::Bundle {
                path: "/r/t_features.safetensors".into(),
                problem,
            }
            .to_string()
        };
        assert_eq!(
            bundle(BundleProblem::NoFeatures),
            "/r/t_features.safetensors: no `features` tensor"
        );
        assert_eq!(
            bundle(BundleProblem::MetadataNotJson),
            "/r/t_features.safetensors: metadata is not JSON"
        );
        assert_eq!(
            bundle(BundleProblem::NoList("labels")),
            "/r/t_features.safetensors: metadata has no `labels` list"
        );
        assert_eq!(
            bundle(BundleProblem::BadEntry("indices")),
            "/r/t_features.safetensors: indices"
        );
    }

    #[test]
    fn a_bundle_without_features_or_metadata_is_refused_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t_features.safetensors");
        let write = |name: &str, fingerprint: &str| {
            let meta = checkpoint::CheckpointMeta {
                format: checkpoint::FORMAT.into(),
                epoch: 0,
                epoch_batch: 0,
                iteration: 0,
                seed: 0,
                fingerprint: fingerprint.into(),
                config_yaml: String::new(),
                mean: vec![],
                std: vec![],
                epoch_totals: Default::default(),
                loss_scaler: None,
                dataset: None,
            };
            let t = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
            checkpoint::save(&path, &[(name.to_string(), t)], &meta).unwrap();
        };
        write("other", "{}");
        assert!(matches!(
            read_bundle(&path),
            Err(FeaturesError::Bundle {
                problem: BundleProblem::NoFeatures,
                ..
            })
        ));
        write("features", "not json");
        assert!(matches!(
            read_bundle(&path),
            Err(FeaturesError::Bundle {
                problem: BundleProblem::MetadataNotJson,
                ..
            })
        ));
        write("features", r#"{"labels": ["a", 1]}"#);
        assert!(matches!(
            read_bundle(&path),
            Err(FeaturesError::Bundle {
                problem: BundleProblem::BadEntry("labels"),
                ..
            })
        ));
        write("features", r#"{"labels": ["a", "b"], "paths": ["x", "y"]}"#);
        assert!(matches!(
            read_bundle(&path),
            Err(FeaturesError::Bundle {
                problem: BundleProblem::NoList("indices"),
                ..
            })
        ));
    }

    #[test]
    fn numpy_e18_format() {
        assert_eq!(format_e18(0.1), "1.000000000000000056e-01");
        assert_eq!(format_e18(-2.5), "-2.500000000000000000e+00");
        assert_eq!(format_e18(0.0), "0.000000000000000000e+00");
        // Checked against Python: "%.18e" % 1.5e-120
        assert_eq!(format_e18(1.5e-120), "1.500000000000000054e-120");
        assert_eq!(format_e18(-3.0e7), "-3.000000000000000000e+07");
    }

    /// The f32 fast path against the general formatter on every sign and exponent of the
    /// fast path's range, with mantissas spread over their range (ties included: 20-digit
    /// expansions end in 5).
    #[test]
    fn f32_fast_path_equals_the_exact_formatter() {
        let slow = |v: f64| {
            let mut s = format!("{v:.18e}");
            let e = s.find('e').unwrap();
            if !s[e + 1..].starts_with('-') {
                s.insert(e + 1, '+');
            }
            let digits = s.len() - (e + 2);
            if digits < 2 {
                s.insert(e + 2, '0');
            }
            s
        };
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut checked = 0;
        for exp in 0u32..=255 {
            for _ in 0..400 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let bits = (exp << 23) | (state as u32 & 0x807f_ffff);
                let v = f32::from_bits(bits) as f64;
                let mut fast = String::new();
                if push_e18_f32(&mut fast, v) {
                    assert_eq!(fast, slow(v), "{bits:#x}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 40_000, "{checked}");
        let mut s = String::new();
        assert!(!push_e18_f32(&mut s, 0.1) && !push_e18_f32(&mut s, 0.0) && s.is_empty());
    }

    #[test]
    fn csv_chunks_join_into_numpy_savetxt_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.csv");
        let x = Tensor::from_slice(&[0.1f32, -2.5, 0.0, 1.5e-7, 3.0, 7.25, -0.5]).reshape([7, 1]);
        write_csv(&path, &x.repeat([1, 2])).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 7);
        assert_eq!(
            lines[0],
            "1.000000014901161194e-01,1.000000014901161194e-01"
        );
        assert_eq!(
            lines[3],
            "1.500000053056282923e-07,1.500000053056282923e-07"
        );
        assert_eq!(
            lines[6],
            "-5.000000000000000000e-01,-5.000000000000000000e-01"
        );
    }

    #[test]
    fn shorter_side_resize() {
        assert_eq!(resized_hw(50, 50, 224), (224, 224));
        assert_eq!(resized_hw(40, 60, 224), (224, 336));
        assert_eq!(resized_hw(61, 40, 224), (341, 224));
    }
}
