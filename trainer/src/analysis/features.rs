//! CLS features of the held-out images (scDINO `compute_CLS_features.py` and
//! `extract_image_labels.py` in one pass): the checkpoint's backbone, the same preprocessing
//! as training, resize (bilinear, shorter side to `resize_length`), normalisation, CLS token,
//! L2 normalisation. Features, labels and paths are produced together, so they cannot drift
//! apart (scDINO ran two jobs and relied on the sampler order matching).
use crate::analysis::backbone::{BackboneError, BackboneWeights, PatchEmbedAdapt};
use crate::analysis::mean_std::MeanStd;
use crate::checkpoint;
use crate::config::{ChannelMode, Config, MissingChannels};
use crate::data::preprocess::preprocess;
use crate::data::{self, quality, ImageChw, PreprocessOptions};
use crate::layout::ModelLayout;
use crate::model::{bag_cls, VisionTransformer, VitConfig};
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
    MeanStd(#[from] crate::analysis::mean_std::MeanStdError),
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    #[error("channel combination {index} does not exist")]
    NoCombination { index: usize },
    #[error("the held-out split is empty")]
    EmptyHeldOut,
    #[error("{} has {found} channels but data.channel_names lists {expected}", path.display())]
    ChannelCount {
        path: PathBuf,
        found: usize,
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
    /// A checkpoint or feature bundle that does not hold what this stage needs.
    #[error("{0}")]
    Invalid(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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
    let vit_cfg = VitConfig::new(cfg.model.arch, cfg.model.patch_size, channels.len())
        .with_registers(cfg.model.num_register_tokens);
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
    let path = weights.path.display();
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
                    .ok_or_else(|| {
                        FeaturesError::Invalid(format!(
                            "{path}: backbone tensor {short} is missing"
                        ))
                    })?,
            };
            if src.size() != t.size() {
                return Err(FeaturesError::Invalid(format!(
                    "{path}: backbone tensor {short} has shape {:?}, the configured model ({model}) needs {:?}{hint}",
                    src.size(),
                    t.size()
                )));
            }
            t.copy_(&src);
        }
        Ok(())
    })?;
    vs.freeze();
    Ok((vs, vit))
}

/// How a batch of one combination's images becomes features, per `model.channels`.
pub enum Embedder {
    /// `fixed`: the backbone over the combination's channels as its input channels.
    Fixed(VisionTransformer),
    /// `fixed` with `missing_channels: zeros`: the combination's channels go to their
    /// `positions` among the model's `trained` input channels, the others stay zero (after
    /// normalisation: each at its dataset mean).
    FixedZeroFilled {
        vit: VisionTransformer,
        positions: Vec<i64>,
        trained: i64,
    },
    /// `tokens`: ChannelViT over the model's channels `channels` (indices into what it was
    /// trained on).
    Tokens {
        vit: VisionTransformer,
        channels: Vec<i64>,
    },
    /// `bag`: the single-channel backbone on every channel; the per-channel CLS features,
    /// each L2-normalised, concatenated in channel order (so every channel weighs the same).
    Bag(VisionTransformer),
}

impl Embedder {
    /// `[B, k, H, W]` → features `[B, D]` (`[B, k·D]` for `bag`), rows not yet normalised.
    pub fn embed(&self, x: &Tensor) -> Tensor {
        tch::no_grad(|| match self {
            Embedder::Fixed(vit) => vit.forward_t(x, false),
            Embedder::FixedZeroFilled { vit, .. } => {
                vit.forward_t(&self.model_channels(x, 1), false)
            }
            Embedder::Tokens { vit, channels } => vit.forward_channels_t(x, Some(channels), false),
            Embedder::Bag(vit) => {
                let cls = bag_cls(vit, x);
                let cls = &cls / cls.norm_scalaropt_dim(2.0, [2], true).clamp_min(1e-12);
                cls.flatten(1, 2)
            }
        })
    }

    /// `x` with the combination's channels (along `dim`) placed among the model's input
    /// channels, the others zero, for `FixedZeroFilled`; `x` itself for every other mode.
    pub fn model_channels(&self, x: &Tensor, dim: i64) -> Tensor {
        match self {
            Embedder::FixedZeroFilled {
                positions, trained, ..
            } => {
                let mut shape = x.size();
                shape[dim as usize] = *trained;
                let at = Tensor::from_slice(positions).to_device(x.device());
                Tensor::zeros(shape, (x.kind(), x.device())).index_copy(dim, &at, x)
            }
            _ => x.shallow_clone(),
        }
    }

    /// Feature dimension for `k` channels.
    pub fn dim(&self, k: usize) -> i64 {
        match self {
            Embedder::Fixed(vit)
            | Embedder::FixedZeroFilled { vit, .. }
            | Embedder::Tokens { vit, .. } => vit.config().embed_dim,
            Embedder::Bag(vit) => vit.config().embed_dim * k as i64,
        }
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
    let path = weights.path.display();
    if let Some(t) = &weights.trained {
        if t.mode != mode {
            return Err(FeaturesError::ChannelModeMismatch {
                checkpoint: weights.path.clone(),
                trained: t.mode.name(),
                configured: mode.name(),
            });
        }
    } else if mode.is_adaptive() {
        return Err(FeaturesError::Invalid(format!(
            "{path} does not record how it takes channels; model.channels: {} needs a checkpoint trained here with it",
            mode.name()
        )));
    }
    let wanted: Vec<&str> = channels
        .iter()
        .map(|&c| cfg.data.channel_names[c].as_str())
        .collect();
    let trained = match (&weights.trained, mode) {
        (_, ChannelMode::Fixed) => {
            if let (Some(t), MissingChannels::Zeros) =
                (&weights.trained, cfg.downstream.features.missing_channels)
            {
                if t.names
                    .iter()
                    .map(String::as_str)
                    .ne(wanted.iter().copied())
                {
                    let positions = t.indices_of(&wanted, &weights.path)?;
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
                    let embedder = Embedder::FixedZeroFilled {
                        vit,
                        positions,
                        trained: t.names.len() as i64,
                    };
                    return Ok((vs, embedder));
                }
            }
            if let (Some(t), true) = (&weights.trained, cfg.downstream.features.is_unadapted()) {
                if t.names
                    .iter()
                    .map(String::as_str)
                    .ne(wanted.iter().copied())
                {
                    return Err(FeaturesError::Invalid(format!(
                        "{path} is a model.channels: fixed model trained on [{}]; it takes exactly those channels, not [{}] (train a model for this combination, or one model for every combination with model.channels: tokens or bag; downstream.features.missing_channels: zeros feeds the channels it lacks as zeros)",
                        t.names.join(", "),
                        wanted.join(", ")
                    )));
                }
            }
            let (vs, vit) = load_backbone(cfg, weights, channels, device)?;
            return Ok((vs, Embedder::Fixed(vit)));
        }
        (Some(t), _) => t,
        (None, _) => unreachable!("an adaptive mode without a record was refused above"),
    };
    let m = &cfg.model;
    let vit_cfg = match mode {
        ChannelMode::Tokens => {
            VitConfig::new(m.arch, m.patch_size, trained.names.len()).with_channel_tokens()
        }
        _ => VitConfig::new(m.arch, m.patch_size, 1),
    }
    .with_registers(m.num_register_tokens);
    let model = format!(
        "{:?}, patch {}, model.channels: {}",
        m.arch,
        m.patch_size,
        mode.name()
    );
    let (vs, vit) = build_backbone(weights, vit_cfg, None, &model, "", device)?;
    let embedder = match mode {
        ChannelMode::Tokens => Embedder::Tokens {
            vit,
            channels: trained.indices_of(&wanted, &weights.path)?,
        },
        _ => Embedder::Bag(vit),
    };
    Ok((vs, embedder))
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
/// [`crate::pipeline::stages`] gathers and interleaves the shares.
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
    let split =
        data::train_heldout_split(index.len(), cfg.data.train_fraction, cfg.run.seed as u32)?;
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
    let weights = BackboneWeights::load(checkpoint_path, f.checkpoint_key)?;
    // The forward passes run on `train.device` (this process's GPU on a GPU node); images are
    // prepared and features collected on the CPU.
    let device = crate::device::resolve_for_this_process(cfg.train.device)?;
    let (_vs, embedder) = load_embedder(cfg, &weights, &channels, device)?;
    let index = source.index();
    let (mean, std) = mean_std.select(&channels, &cfg.data.channel_names);
    let opts = PreprocessOptions {
        selected_channels: Some(channels.clone()),
        center_crop: cfg.data.center_crop,
    };
    let mut rows = Vec::new();
    // A streaming source fetches these images ahead of the forward passes.
    source.will_read(indices);
    for chunk in indices.chunks(f.batch_size_per_gpu.max(1)) {
        let mut batch = Vec::with_capacity(chunk.len());
        for &i in chunk {
            let raw = source.read(i)?;
            let path = &index.samples[i].path;
            if raw.channels != cfg.file_channels() {
                return Err(FeaturesError::ChannelCount {
                    path: path.clone(),
                    found: raw.channels,
                    expected: cfg.file_channels(),
                });
            }
            let (img, outcome) = preprocess(&raw, &opts)?;
            warn_guarded(&outcome, &channels, &cfg.data.channel_names, path);
            batch.push(prepare(&img, cfg, &mean, &std));
        }
        let x = Tensor::stack(&batch, 0).to_device(device);
        rows.push(embedder.embed(&x).to_device(Device::Cpu));
    }
    let features = if rows.is_empty() {
        Tensor::zeros(
            [0, embedder.dim(channels.len())],
            (Kind::Float, tch::Device::Cpu),
        )
    } else {
        Tensor::cat(&rows, 0)
    };
    let norms = features.norm_scalaropt_dim(2.0, [1], true).clamp_min(1e-12);
    let features = features / norms;
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
        tag: weights.tag(),
        checkpoint: checkpoint_path.display().to_string(),
        checkpoint_epoch: weights.epoch,
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

/// Resize (if configured) and normalise (if configured) one preprocessed image.
fn prepare(img: &ImageChw, cfg: &Config, mean: &[f32], std: &[f32]) -> Tensor {
    let f = &cfg.downstream.features;
    let mut x = to_tensor(img);
    if f.resize {
        let (h, w) = resized_hw(img.height, img.width, f.resize_length);
        x = x
            .unsqueeze(0)
            .upsample_bilinear2d([h, w], false, None, None)
            .squeeze_dim(0);
    }
    if f.normalize {
        let m = Tensor::from_slice(mean).reshape([-1, 1, 1]);
        let s = Tensor::from_slice(std).reshape([-1, 1, 1]);
        x = (x - m) / s;
    }
    x
}

/// numpy's `%.18e`: 18 decimals and an exponent with a sign and at least two digits.
pub fn format_e18(v: f64) -> String {
    let s = format!("{v:.18e}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
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
    data::tiff_reader::write_atomic(&files.class_labels_csv(), labels.as_bytes())?;
    data::tiff_reader::write_atomic(&files.image_paths_csv(), lines(&set.paths).as_bytes())?;
    write_bundle(&files.bundle(tag), set)
}

/// `features` as scDINO's headerless `%.18e` CSV, atomically.
fn write_csv(path: &Path, features: &Tensor) -> Result<(), FeaturesError> {
    let rows = features.size()[0] as usize;
    let d = features.size()[1] as usize;
    let f64s = Vec::<f64>::try_from(features.to_kind(Kind::Double).flatten(0, -1))
        .map_err(|e| FeaturesError::Invalid(e.to_string()))?;
    let mut csv = String::with_capacity(f64s.len() * 26);
    for r in 0..rows {
        let line: Vec<String> = f64s[r * d..(r + 1) * d]
            .iter()
            .map(|&v| format_e18(v))
            .collect();
        csv.push_str(&line.join(","));
        csv.push('\n');
    }
    data::tiff_reader::write_atomic(path, csv.as_bytes())?;
    Ok(())
}

/// `model.channels: bag`'s compact feature: the mean of an image's per-channel CLS features
/// (each of unit length, as in the concatenation), L2-normalised, `[N, D]`, from the
/// concatenated `[N, k·D]` rows (row normalisation scales a row's k parts alike, so their
/// mean keeps its direction).
pub fn channel_mean(features: &Tensor, k: usize) -> Tensor {
    let (n, kd) = features.size2().expect("features are [N, k·D]");
    let mean = features
        .reshape([n, k as i64, kd / k as i64])
        .mean_dim(1, false, Kind::Float);
    &mean / mean.norm_scalaropt_dim(2.0, [1], true).clamp_min(1e-12)
}

/// Writes [`channel_mean`] of a `bag` model's features of `k` channels next to them:
/// `CLS_features/channel_mean/{tag}_features.{csv,safetensors}` (the bundle with the same
/// labels, paths and checkpoint, readable by [`read_bundle`]).
pub fn write_channel_mean(
    files: &ModelLayout,
    tag: &str,
    set: &FeatureSet,
    k: usize,
) -> Result<(), FeaturesError> {
    let dir = files.channel_mean_dir();
    std::fs::create_dir_all(&dir).map_err(|source| FeaturesError::Io {
        path: dir.clone(),
        source,
    })?;
    let mean = FeatureSet {
        features: channel_mean(&set.features, k),
        labels: set.labels.clone(),
        paths: set.paths.clone(),
        indices: set.indices.clone(),
        tag: set.tag.clone(),
        checkpoint: set.checkpoint.clone(),
        checkpoint_epoch: set.checkpoint_epoch,
    };
    write_csv(&files.channel_mean_csv(tag), &mean.features)?;
    write_bundle(&files.channel_mean_bundle(tag), &mean)
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
    let (_, sha256) =
        crate::data::shards::pack::sha256_file(path).map_err(|source| FeaturesError::Io {
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
    let invalid = |what: &str| FeaturesError::Invalid(format!("{}: {what}", path.display()));
    let features = ck
        .get("features")
        .ok_or_else(|| invalid("no `features` tensor"))?;
    let meta: serde_json::Value =
        serde_json::from_str(&ck.meta.fingerprint).map_err(|_| invalid("metadata is not JSON"))?;
    let strings = |key: &str| -> Result<Vec<String>, FeaturesError> {
        meta[key]
            .as_array()
            .ok_or_else(|| invalid(&format!("metadata has no `{key}` list")))?
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| invalid(key)))
            .collect()
    };
    let labels = strings("labels")?;
    let paths = strings("paths")?;
    let indices = meta["indices"]
        .as_array()
        .ok_or_else(|| invalid("metadata has no `indices` list"))?
        .iter()
        .map(|v| {
            v.as_u64()
                .map(|i| i as usize)
                .ok_or_else(|| invalid("indices"))
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

    #[test]
    fn numpy_e18_format() {
        assert_eq!(format_e18(0.1), "1.000000000000000056e-01");
        assert_eq!(format_e18(-2.5), "-2.500000000000000000e+00");
        assert_eq!(format_e18(0.0), "0.000000000000000000e+00");
        // Checked against Python: "%.18e" % 1.5e-120
        assert_eq!(format_e18(1.5e-120), "1.500000000000000054e-120");
    }

    #[test]
    fn shorter_side_resize() {
        assert_eq!(resized_hw(50, 50, 224), (224, 224));
        assert_eq!(resized_hw(40, 60, 224), (224, 336));
        assert_eq!(resized_hw(61, 40, 224), (341, 224));
    }
}
