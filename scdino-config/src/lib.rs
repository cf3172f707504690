//! One YAML file drives every stage. `Sections` is the schema as written (with scDINO's
//! defaults); `Config` is the same after validation, plus the values derived from it. A `Config`
//! only exists validated: build it with [`Config::load`] or [`Config::from_yaml`].
//!
//! Its own crate, without libtorch, because two programs must apply the same rules: the trainer
//! (re-exported as `trainer::config`) and the launcher, which validates a config before it
//! bakes it into an image.
mod compat;
mod locate;
mod location;
mod metrics_validate;
mod parse;
pub mod reference;
pub mod scdino;
mod sections;
mod stage;
mod validate;

pub use compat::{IgnoredKey, IGNORED_KEYS};
pub use locate::KeyLines;
pub use location::{DatasetLocation, LocationError, S3Url};
pub use parse::{parse_yaml, Unparsed};
pub use sections::*;
pub use stage::{Stage, UnknownStage, PIPELINE_STAGES};
pub use validate::{Invalid, Validator};

/// Where an image built with `launcher image build --config` holds its run config; the
/// trainer's commands read it when `--config` is absent.
pub const BAKED_CONFIG_PATH: &str = "/opt/scdino/config.yaml";

/// `train.device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DeviceChoice {
    /// The local rank's GPU when libtorch sees one, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// The local rank's GPU; an error when there is none.
    Cuda,
}

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Syntax, type and unknown-key errors; the message carries line, column and a snippet.
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    /// A value that parses but makes no sense.
    #[error("{origin}{}: `{key}`: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        origin: String,
        key: String,
        line: Option<usize>,
        message: String,
    },
}

/// A validated configuration. Its values are read through `Deref` (`cfg.train.epochs`) and
/// cannot change after validation, so every stage sees what was checked; a different
/// configuration (a benchmark's, a scaling run's) is a new one, made by [`Config::edit`],
/// which validates again. Clones share the values.
///
/// ```compile_fail,E0594
/// let mut cfg = scdino_config::Config::from_yaml("", "defaults").unwrap();
/// cfg.train.epochs = 3; // no DerefMut: a validated config cannot be changed in place
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Config(std::sync::Arc<Values>);

impl std::ops::Deref for Config {
    type Target = Values;

    fn deref(&self) -> &Values {
        &self.0
    }
}

/// The values of a validated [`Config`]. Only validation builds them (non-exhaustive: no
/// struct literal outside this crate).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Values {
    pub run: RunSection,
    pub data: DataSection,
    pub model: ModelSection,
    pub train: TrainSection,
    pub augment: AugmentSection,
    pub downstream: DownstreamSection,
    /// `data.channel_combinations` as channel indices, in file order.
    pub channel_sets: Vec<Vec<usize>>,
}

impl Config {
    /// Reads and validates a user's file, and warns once for each key of it that nothing
    /// reads ([`IGNORED_KEYS`]): accepting a key silently would let the user believe it acts.
    /// Configs read back from a checkpoint or built in code go through [`Config::from_yaml`],
    /// which says nothing (their keys are not the user's current choice).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let origin = path.display().to_string();
        let cfg = Self::from_yaml(&text, &origin)?;
        for (key, line) in compat::ignored_keys_written(&KeyLines::scan(&text)) {
            tracing::warn!("{}", compat::ignored_key_notice(&origin, &key, line));
        }
        Ok(cfg)
    }

    /// `origin` names the source in messages (a file path, or `<stdin>`).
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let lines = KeyLines::scan(text);
        location::check_text(text, &Validator::new(origin, &lines))?;
        let sections: Sections = parse_yaml(text, origin)?;
        Self::validate(sections, origin, &lines)
    }

    /// A copy with `change` applied to its sections, validated as a file would be; `origin`
    /// names it in errors (e.g. `<bench step>`).
    pub fn edit(
        &self,
        origin: &str,
        change: impl FnOnce(&mut Sections),
    ) -> Result<Self, ConfigError> {
        let mut sections = self.sections();
        change(&mut sections);
        Self::from_sections(sections, origin)
    }

    /// Validates sections built in code (errors name `origin`, without line numbers).
    pub fn from_sections(sections: Sections, origin: &str) -> Result<Self, ConfigError> {
        Self::validate(sections, origin, &KeyLines::scan(""))
    }

    /// The sections as they would be written back (for `config show` and round trips).
    pub fn sections(&self) -> Sections {
        Sections {
            run: self.run.clone(),
            data: self.data.clone(),
            model: self.model.clone(),
            train: self.train.clone(),
            augment: self.augment.clone(),
            downstream: self.downstream.clone(),
        }
    }

    /// The fully resolved configuration as YAML (defaults written out).
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(&self.sections()).expect("config sections always serialize")
    }

    /// The file channels some model sees, ascending: only they can matter. With an adaptive
    /// `model.channels` that is every channel (the one model trains on all of them).
    pub fn used_channels(&self) -> Vec<usize> {
        if self.model.channels.is_adaptive() {
            return (0..self.file_channels()).collect();
        }
        let set: std::collections::BTreeSet<usize> =
            self.channel_sets.iter().flatten().copied().collect();
        set.into_iter().collect()
    }

    /// How many models the run trains: one per combination (`fixed`), or one for all of them
    /// (`bag`, `tokens`; the one `trainer train --combination 0` trains).
    pub fn trained_models(&self) -> usize {
        if self.model.channels.is_adaptive() {
            1
        } else {
            self.channel_sets.len()
        }
    }

    /// The channels the model behind combination `combination` trains on: the combination's
    /// own (`fixed`), or every channel of the files (`bag`, `tokens`: one model serves every
    /// combination). None for a combination the config does not have.
    pub fn training_channels(&self, combination: usize) -> Option<Vec<usize>> {
        let own = self.channel_sets.get(combination)?;
        Some(if self.model.channels.is_adaptive() {
            (0..self.file_channels()).collect()
        } else {
            own.clone()
        })
    }

    /// Number of channels each image file must have.
    pub fn file_channels(&self) -> usize {
        self.data.channel_names.len()
    }

    /// The run folder: `{output_dir}/{name}`.
    pub fn run_dir(&self) -> PathBuf {
        self.run.output_dir.join(&self.run.name)
    }

    /// scDINO's model folder name, e.g. `name_of_model_channel_aTub_BF` for channels [0, 1].
    /// With an adaptive `model.channels` the mode follows the model name
    /// (`name_of_model_tokens_channel_aTub_BF`), so its folders never mix with a fixed
    /// model's.
    pub fn model_dir_name(&self, channels: &[usize]) -> String {
        let names: String = channels
            .iter()
            .map(|&c| format!("_{}", self.data.channel_names[c]))
            .collect();
        format!("{}_channel{}", self.model_prefix(), names)
    }

    /// `model.name`, followed by an adaptive `model.channels` (`name_of_model_tokens`): what
    /// every folder and file of this model's run starts with.
    pub fn model_prefix(&self) -> String {
        match self.model.channels {
            ChannelMode::Fixed => self.model.name.clone(),
            mode => format!("{}_{}", self.model.name, mode.name()),
        }
    }

    fn validate(s: Sections, origin: &str, lines: &KeyLines) -> Result<Self, ConfigError> {
        let v = Validator::new(origin, lines);
        let (run, data, model, train, aug, down) = (
            &s.run,
            &s.data,
            &s.model,
            &s.train,
            &s.augment,
            &s.downstream,
        );

        v.check(!run.name.trim().is_empty(), "run.name", "must not be empty")?;
        v.check(
            !run.name.contains('/'),
            "run.name",
            "is a folder name and must not contain '/'",
        )?;
        v.check(
            run.seed <= u64::from(u32::MAX),
            "run.seed",
            "must be between 0 and 4294967295 (numpy's seed range, needed to reproduce scDINO's splits)",
        )?;

        v.fraction_open(data.train_fraction, "data.train_fraction")?;
        v.check(
            data.mean_std_fraction > 0.0 && data.mean_std_fraction <= 1.0,
            "data.mean_std_fraction",
            &format!(
                "is {} but must be in (0, 1]: the share of images used to estimate mean/std",
                data.mean_std_fraction
            ),
        )?;
        v.check(
            data.shuffle_buffer >= 1,
            "data.shuffle_buffer",
            "must be at least 1 (1 keeps each shard's stored order)",
        )?;
        v.check(
            !(data.order == SampleOrder::ShardSequential && data.format == DataFormat::Folder),
            "data.order",
            "shard_sequential needs a packed dataset (data.format: shards or auto); \
             pack one with `trainer data pack`",
        )?;
        v.check(
            data.s3.max_concurrency > 0,
            "data.s3.max_concurrency",
            "must be at least 1 (GET requests in flight)",
        )?;
        v.check(
            data.s3.shard_chunk_bytes > 0,
            "data.s3.shard_chunk_bytes",
            "must be at least 1 (bytes per chunk GET; 64 MiB by default)",
        )?;
        if let Some(ep) = &data.s3.endpoint {
            v.check(
                ep.starts_with("http://") || ep.starts_with("https://"),
                "data.s3.endpoint",
                &format!("{ep:?} must start with http:// or https://"),
            )?;
            v.check(
                !ep.starts_with("http://") || data.s3.allow_http,
                "data.s3.endpoint",
                &format!("{ep:?} is plain HTTP: set data.s3.allow_http: true (local S3-compatible servers only)"),
            )?;
        }
        v.check(
            !data.images_are_rgb,
            "data.images_are_rgb",
            "RGB images are not supported yet; multi-channel TIFFs only",
        )?;
        let n_channels = data.channel_names.len();
        v.check(
            n_channels > 0,
            "data.channel_names",
            "name at least one channel (one name per channel of the TIFF files, in file order)",
        )?;
        for (i, name) in data.channel_names.iter().enumerate() {
            let key = format!("data.channel_names[{i}]");
            v.check(!name.is_empty(), &key, "channel names must not be empty")?;
            v.check(
                !name.contains('_') && !name.contains('/'),
                &key,
                &format!("channel name {name:?} must not contain '_' or '/' (they are used in folder names)"),
            )?;
            if data.channel_names[..i].contains(name) {
                return Err(v
                    .err(&key, &format!("channel name {name:?} appears twice"))
                    .into());
            }
        }
        v.check(
            !data.channel_combinations.is_empty(),
            "data.channel_combinations",
            "list at least one channel combination, e.g. \"01234\" for all five channels",
        )?;
        let mut channel_sets = Vec::with_capacity(data.channel_combinations.len());
        for (i, combo) in data.channel_combinations.iter().enumerate() {
            let key = format!("data.channel_combinations[{i}]");
            let set = channel_set(combo).map_err(|m| v.err(&key, &m))?;
            for &c in &set {
                v.check(
                    c < n_channels,
                    &key,
                    &format!(
                        "channel {c} does not exist: the images have {n_channels} channels ({}), numbered 0 to {}",
                        data.channel_names.join(", "),
                        n_channels - 1
                    ),
                )?;
            }
            if channel_sets.contains(&set) {
                return Err(v
                    .err(&key, "this channel combination is listed twice")
                    .into());
            }
            channel_sets.push(set);
        }

        v.check(
            model.patch_size > 0 && model.patch_size <= 64,
            "model.patch_size",
            "must be between 1 and 64 pixels (scDINO uses 8 or 16)",
        )?;
        v.check(model.out_dim > 0, "model.out_dim", "must be positive")?;
        v.check(
            model.channels != ChannelMode::Bag || data.order == SampleOrder::Exact,
            "model.channels",
            "bag trains on every channel of every image as its own sample, in an exact shuffle of those; data.order: shard_sequential is not supported with it",
        )?;
        v.check(
            model.channels.is_fixed() || n_channels <= 64,
            "model.channels",
            &format!(
                "{} takes at most 64 channels (the images have {n_channels})",
                model.channels.name()
            ),
        )?;
        v.check(
            (0.0..1.0).contains(&model.drop_path_rate),
            "model.drop_path_rate",
            "must be in [0, 1)",
        )?;
        v.check(
            !model.name.trim().is_empty(),
            "model.name",
            "must not be empty",
        )?;
        v.check(
            !model.name.contains('/'),
            "model.name",
            "is a folder name and must not contain '/'",
        )?;

        v.check(train.epochs > 0, "train.epochs", "must be at least 1")?;
        v.check(
            train.checkpoint_every > 0,
            "train.checkpoint_every",
            "must be at least 1",
        )?;
        v.check(train.num_gpus > 0, "train.num_gpus", "must be at least 1")?;
        v.check(
            train.batch_size_per_gpu > 0,
            "train.batch_size_per_gpu",
            "must be at least 1",
        )?;
        v.check(
            train.dist_url == "env://" || train.dist_url.starts_with("tcp://"),
            "train.dist_url",
            "must be \"env://\" or \"tcp://HOST:PORT\"",
        )?;
        v.check(
            (0.0..=1.0).contains(&train.momentum_teacher),
            "train.momentum_teacher",
            "must be in [0, 1] (0.996 is typical)",
        )?;
        v.positive(train.warmup_teacher_temp, "train.warmup_teacher_temp")?;
        v.positive(train.teacher_temp, "train.teacher_temp")?;
        v.check(
            train.warmup_teacher_temp_epochs <= train.epochs,
            "train.warmup_teacher_temp_epochs",
            &format!(
                "is {} but training has only {} epochs",
                train.warmup_teacher_temp_epochs, train.epochs
            ),
        )?;
        v.non_negative(train.weight_decay, "train.weight_decay")?;
        v.non_negative(train.weight_decay_end, "train.weight_decay_end")?;
        v.non_negative(train.clip_grad, "train.clip_grad")?;
        v.non_negative(train.koleo_weight, "train.koleo_weight")?;
        v.positive(train.lr, "train.lr")?;
        v.non_negative(train.min_lr, "train.min_lr")?;
        v.check(
            train.min_lr <= train.lr,
            "train.min_lr",
            &format!(
                "is {} but must not exceed train.lr ({})",
                train.min_lr, train.lr
            ),
        )?;
        v.check(
            train.warmup_epochs <= train.epochs,
            "train.warmup_epochs",
            &format!(
                "is {} but training has only {} epochs",
                train.warmup_epochs, train.epochs
            ),
        )?;
        v.check(
            train.freeze_last_layer <= train.epochs,
            "train.freeze_last_layer",
            &format!(
                "is {} but training has only {} epochs: the head's last layer would never train",
                train.freeze_last_layer, train.epochs
            ),
        )?;

        v.check(train.log_every > 0, "train.log_every", "must be at least 1")?;
        v.check(
            train.peak_tflops.is_none_or(|p| p.is_finite() && p > 0.0),
            "train.peak_tflops",
            "must be a positive number of TFLOP/s (or left out)",
        )?;
        ibot_settings(&v, &train.ibot, model, aug, train.batch_size_per_gpu)?;

        crop_scale(&v, aug.global_crops_scale, "augment.global_crops_scale")?;
        crop_scale(&v, aug.local_crops_scale, "augment.local_crops_scale")?;
        for (size, key) in [
            (aug.global_crop_size, "augment.global_crop_size"),
            (aug.local_crop_size, "augment.local_crop_size"),
        ] {
            v.check(
                size >= model.patch_size,
                key,
                &format!(
                    "is {size} px, smaller than one {} px patch",
                    model.patch_size
                ),
            )?;
        }

        let f = &down.features;
        v.check(
            f.num_gpus > 0,
            "downstream.features.num_gpus",
            "must be at least 1",
        )?;
        v.check(
            f.batch_size_per_gpu > 0,
            "downstream.features.batch_size_per_gpu",
            "must be at least 1",
        )?;
        v.check(
            f.resize_length >= model.patch_size,
            "downstream.features.resize_length",
            "must be at least one patch",
        )?;
        v.check(
            !f.use_mean_patch_embedding || f.custom_embedding_map.is_empty(),
            "downstream.features.custom_embedding_map",
            "cannot be combined with use_mean_patch_embedding: choose one way to adapt the patch embedding",
        )?;
        for (set, key) in [
            (
                f.use_mean_patch_embedding,
                "downstream.features.use_mean_patch_embedding",
            ),
            (
                !f.custom_embedding_map.is_empty(),
                "downstream.features.custom_embedding_map",
            ),
        ] {
            v.check(
                !set || model.channels.is_fixed(),
                key,
                &format!(
                    "adapts a fixed model's patch embedding to other channels; model.channels: {} takes any subset of channels as it is",
                    model.channels.name()
                ),
            )?;
        }
        if f.missing_channels == MissingChannels::Zeros {
            v.check(
                model.channels.is_fixed(),
                "downstream.features.missing_channels",
                &format!(
                    "zeros stands in for channels a fixed model lacks; model.channels: {} takes any subset of channels as it is",
                    model.channels.name()
                ),
            )?;
            v.check(
                f.is_unadapted(),
                "downstream.features.missing_channels",
                "zeros cannot be combined with use_mean_patch_embedding or custom_embedding_map: choose one way to use a model on other channels",
            )?;
        }
        v.check(
            f.bag_pool == BagPool::Concat || model.channels == ChannelMode::Bag,
            "downstream.features.bag_pool",
            &format!(
                "{} pools the per-channel features of model.channels: bag; model.channels: {} gives one feature per image (leave bag_pool out, or train with channels: bag)",
                f.bag_pool.name(),
                model.channels.name()
            ),
        )?;
        for &c in f.custom_embedding_map.keys() {
            v.check(
                c < n_channels,
                "downstream.features.custom_embedding_map",
                &format!(
                    "maps channel {c}, but the images have {n_channels} channels ({}), numbered 0 to {}",
                    data.channel_names.join(", "),
                    n_channels - 1
                ),
            )?;
        }
        v.check(
            down.attention.image_size >= model.patch_size,
            "downstream.attention.image_size",
            "must be at least one patch",
        )?;
        v.check(
            !down.knn.k.is_empty(),
            "downstream.knn.k",
            "list at least one k",
        )?;
        for (i, &k) in down.knn.k.iter().enumerate() {
            v.check(
                k > 0,
                &format!("downstream.knn.k[{i}]"),
                "k must be at least 1",
            )?;
        }
        v.positive(down.knn.temperature, "downstream.knn.temperature")?;
        metrics_validate::validate_metrics(&v, &down.metrics)?;
        let probe = &down.linear_probe;
        v.check(
            !probe.l2.is_empty(),
            "downstream.linear_probe.l2",
            "list at least one L2 strength",
        )?;
        for (i, &l2) in probe.l2.iter().enumerate() {
            v.check(
                l2.is_finite() && l2 >= 0.0,
                &format!("downstream.linear_probe.l2[{i}]"),
                "must be a finite number ≥ 0",
            )?;
        }
        v.fraction_open(
            probe.validation_fraction,
            "downstream.linear_probe.validation_fraction",
        )?;
        v.check(
            probe.max_iterations > 0,
            "downstream.linear_probe.max_iterations",
            "must be at least 1",
        )?;
        let u = &down.umap;
        v.check(
            u.n_neighbors >= 2,
            "downstream.umap.n_neighbors",
            "must be at least 2",
        )?;
        v.non_negative(u.min_dist, "downstream.umap.min_dist")?;
        v.positive(u.spread, "downstream.umap.spread")?;
        v.check(
            u.min_dist <= u.spread,
            "downstream.umap.min_dist",
            &format!(
                "is {} but must not exceed spread ({})",
                u.min_dist, u.spread
            ),
        )?;
        v.check(
            u.n_components == 2,
            "downstream.umap.n_components",
            "must be 2: the embedding exists to be plotted in 2-D",
        )?;
        v.check(
            !u.topometry_plots,
            "downstream.umap.topometry_plots",
            "is not supported (TopOMetry is a Python library); set it to false",
        )?;
        v.check(
            u.epochs >= 1,
            "downstream.umap.epochs",
            "must be at least 1",
        )?;

        Ok(Config(std::sync::Arc::new(Values {
            run: s.run,
            data: s.data,
            model: s.model,
            train: s.train,
            augment: s.augment,
            downstream: s.downstream,
            channel_sets,
        })))
    }
}

/// Parses `"01234"` or `[0, 1]` into channel indices (order kept, duplicates refused).
fn channel_set(combo: &ChannelCombination) -> Result<Vec<usize>, String> {
    let set: Vec<usize> = match combo {
        ChannelCombination::Digits(s) => s
            .chars()
            .map(|ch| {
                ch.to_digit(10).map(|d| d as usize).ok_or_else(|| {
                    format!("{s:?} must be channel digits like \"024\" (found {ch:?}); use a list like [10, 11] for channels above 9")
                })
            })
            .collect::<Result<_, _>>()?,
        ChannelCombination::Indices(v) => v.clone(),
    };
    if set.is_empty() {
        return Err("a channel combination needs at least one channel".into());
    }
    for (i, c) in set.iter().enumerate() {
        if set[..i].contains(c) {
            return Err(format!("channel {c} is selected twice"));
        }
    }
    Ok(set)
}

/// Both ends of a crop scale are fractions of the image area, smaller first.
/// `train.ibot`, when on: masks that can exist at this batch and crop size, and a head layout
/// the patches can go through.
fn ibot_settings(
    v: &Validator,
    ibot: &IbotSection,
    model: &ModelSection,
    aug: &AugmentSection,
    batch_size_per_gpu: usize,
) -> Result<(), Invalid> {
    v.non_negative(ibot.weight, "train.ibot.weight")?;
    v.check(
        ibot.out_dim.is_none() || ibot.separate_head,
        "train.ibot.out_dim",
        "sets the prototypes of a separate iBOT head: set train.ibot.separate_head: true too (the shared head has model.out_dim)",
    )?;
    if !ibot.enabled() {
        return Ok(());
    }
    v.check(
        (0.0..=1.0).contains(&ibot.mask_probability),
        "train.ibot.mask_probability",
        "must be in [0, 1] (0.5 in DINOv2)",
    )?;
    let masked_images = (2.0 * batch_size_per_gpu as f64 * ibot.mask_probability) as usize;
    v.check(
        masked_images > 0,
        "train.ibot.mask_probability",
        &format!(
            "is {} but with train.batch_size_per_gpu {batch_size_per_gpu} no global crop of a step would be masked (2 × batch × probability < 1)",
            ibot.mask_probability
        ),
    )?;
    let [lo, hi] = ibot.mask_ratio;
    v.check(
        0.0 <= lo && lo <= hi && hi <= 1.0,
        "train.ibot.mask_ratio",
        &format!("is [{lo}, {hi}]; needs 0 <= min <= max <= 1 ([0.1, 0.5] in DINOv2)"),
    )?;
    let grid = aug.global_crop_size / model.patch_size.max(1);
    let most = (grid * grid) as f64 * hi;
    v.check(
        grid >= 3 && most >= 4.0,
        "train.ibot.mask_ratio",
        &format!(
            "masks at most {most:.1} of the {} patches of a global crop ({} px, patch {}), but a mask is made of rectangles of at least 4 patches: raise the ratio or the crop size",
            grid * grid,
            aug.global_crop_size,
            model.patch_size
        ),
    )?;
    v.positive(ibot.student_temp, "train.ibot.student_temp")?;
    if let Some(t) = ibot.teacher_temp {
        v.positive(t, "train.ibot.teacher_temp")?;
    }
    if let Some(k) = ibot.out_dim {
        v.check(k > 0, "train.ibot.out_dim", "must be at least 1")?;
    }
    v.check(
        !(ibot.separate_head && model.use_bn_in_head),
        "train.ibot.separate_head",
        "a separate iBOT head with model.use_bn_in_head would batch-normalise one rank's few masked patches (possibly none): use the shared head, or no BatchNorm in the head",
    )
}

fn crop_scale(v: &Validator, (lo, hi): (f64, f64), key: &str) -> Result<(), Invalid> {
    v.check(
        lo > 0.0 && hi <= 1.0,
        key,
        &format!("[{lo}, {hi}]: both ends are fractions of the image area and must lie in (0, 1]"),
    )?;
    v.check(
        lo <= hi,
        key,
        &format!("[{lo}, {hi}]: the smaller scale must come first"),
    )
}

impl From<Unparsed> for ConfigError {
    fn from(u: Unparsed) -> Self {
        ConfigError::Parse {
            origin: u.origin,
            message: u.message,
        }
    }
}

impl From<Invalid> for ConfigError {
    fn from(i: Invalid) -> Self {
        ConfigError::Invalid {
            origin: i.origin,
            key: i.key,
            line: i.line,
            message: i.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(yaml: &str) -> (String, Option<usize>, String) {
        match Config::from_yaml(yaml, "t.yaml") {
            Err(ConfigError::Invalid {
                key, line, message, ..
            }) => (key, line, message),
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn an_edit_is_validated_and_leaves_the_original_alone() {
        let c = Config::from_yaml("train:\n  epochs: 6\n", "t").unwrap();
        let longer = c.edit("longer", |s| s.train.epochs = 8).unwrap();
        assert_eq!((c.train.epochs, longer.train.epochs), (6, 8));
        assert_eq!(longer.channel_sets, c.channel_sets);
        match c.edit("bad edit", |s| s.data.train_fraction = 1.5) {
            Err(ConfigError::Invalid { origin, key, .. }) => {
                assert_eq!(
                    (origin.as_str(), key.as_str()),
                    ("bad edit", "data.train_fraction")
                )
            }
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn dataset_locations_are_parsed_once_and_refused_with_key_and_line() {
        let c = Config::from_yaml(
            "data:\n  dataset_dir: s3://bkt/pbmc/\n  test_dir: /fsx/Test\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            c.data.dataset_dir,
            DatasetLocation::S3(S3Url::parse("s3://bkt/pbmc").unwrap())
        );
        assert_eq!(
            c.data.test_dir,
            Some(DatasetLocation::Local("/fsx/Test".into()))
        );
        // Written back as the YAML spells it, and read again to the same value.
        let yaml = c.to_yaml();
        assert!(yaml.contains("dataset_dir: s3://bkt/pbmc\n"), "{yaml}");
        assert!(yaml.contains("test_dir: /fsx/Test\n"), "{yaml}");
        assert_eq!(Config::from_yaml(&yaml, "back").unwrap(), c);
        let (key, line, msg) = invalid("run:\n  seed: 1\ndata:\n  dataset_dir: s3:///x\n");
        assert_eq!((key.as_str(), line), ("data.dataset_dir", Some(4)));
        assert_eq!(msg, "an s3:// dataset needs a bucket: s3://bucket/prefix");
        let (key, line, _) = invalid("data: {test_dir: 's3://'}\n");
        assert_eq!((key.as_str(), line), ("data.test_dir", Some(1)));
        let (key, _, msg) = invalid("data:\n  dataset_dir: gs://b/x\n");
        assert_eq!(key, "data.dataset_dir");
        assert!(msg.contains("only local paths and s3://"), "{msg}");
    }

    #[test]
    fn empty_file_gives_scdino_defaults() {
        let c = Config::from_yaml("", "t").unwrap();
        assert_eq!(c.run.seed, 40);
        assert_eq!(c.train.warmup_epochs, 5);
        assert_eq!(c.train.teacher_temp, 0.04);
        assert_eq!(c.augment.global_crops_scale, (0.14, 1.0));
        assert_eq!(c.channel_sets[0], vec![0, 1, 2, 3, 4]);
        assert_eq!(c.channel_sets.len(), 6);
        assert_eq!(c.downstream.knn.k, vec![5, 10, 50, 100, 200, 500]);
    }

    #[test]
    fn misspelled_key_is_an_error_naming_key_and_line() {
        let e = Config::from_yaml("train:\n  lr: 0.001\n  warump_epochs: 3\n", "cfg.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("warump_epochs"), "{e}");
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("cfg.yaml"), "{e}");
    }

    #[test]
    fn validation_errors_name_key_and_line() {
        let (key, line, msg) =
            invalid("run:\n  seed: 1\naugment:\n  local_crops_scale: [0.4, 0.05]\n");
        assert_eq!(key, "augment.local_crops_scale");
        assert_eq!(line, Some(4));
        assert!(msg.contains("smaller scale must come first"), "{msg}");

        let (key, line, msg) =
            invalid("data:\n  channel_names: [A, B, C]\n  channel_combinations: [\"01\", \"3\"]\n");
        assert_eq!(key, "data.channel_combinations[1]");
        assert_eq!(line, Some(3));
        assert!(msg.contains("channel 3 does not exist"), "{msg}");

        let (key, _, _) =
            invalid("data:\n  channel_names: [A_1, B]\n  channel_combinations: [\"0\"]\n");
        assert_eq!(key, "data.channel_names[0]");
        let (key, line, _) = invalid("train:\n  epochs: 3\n  warmup_epochs: 4\n");
        assert_eq!((key.as_str(), line), ("train.warmup_epochs", Some(3)));
        let (key, line, _) = invalid("data:\n  train_fraction: 1.0\n");
        assert_eq!((key.as_str(), line), ("data.train_fraction", Some(2)));
        let (key, _, _) = invalid("run:\n  seed: 4294967296\n");
        assert_eq!(key, "run.seed");
        // A default that becomes invalid through another key has no line of its own.
        let (key, line, _) = invalid("model:\n  patch_size: 32\naugment:\n  local_crop_size: 16\n");
        assert_eq!((key.as_str(), line), ("augment.local_crop_size", Some(4)));
    }

    #[test]
    fn ibot_is_off_by_default_and_its_keys_are_validated() {
        let d = Config::from_yaml("", "t").unwrap();
        assert!(!d.train.ibot.enabled());
        assert_eq!(d.train.ibot.mask_ratio, [0.1, 0.5]);
        let on = Config::from_yaml("train:\n  ibot:\n    weight: 1.0\n", "t").unwrap();
        assert!(on.train.ibot.enabled() && !on.train.ibot.separate_head);
        let (key, line, _) =
            invalid("train:\n  ibot:\n    weight: 1.0\n    mask_ratio: [0.5, 0.1]\n");
        assert_eq!((key.as_str(), line), ("train.ibot.mask_ratio", Some(4)));
        let (key, _, msg) = invalid("train:\n  ibot:\n    out_dim: 128\n");
        assert_eq!(key, "train.ibot.out_dim");
        assert!(msg.contains("separate_head: true"), "{msg}");
        // One image per rank and probability 0.5: ⌊2 · 1 · 0.4⌋ = 0 masked crops.
        let (key, _, msg) = invalid(
            "train:\n  batch_size_per_gpu: 1\n  ibot:\n    weight: 1.0\n    mask_probability: 0.4\n",
        );
        assert_eq!(key, "train.ibot.mask_probability");
        assert!(msg.contains("no global crop"), "{msg}");
        // A 32 px crop of 16 px patches: a 2 × 2 grid has no room for a 4-patch rectangle.
        let (key, _, msg) = invalid(
            "augment:\n  global_crop_size: 32\n  local_crop_size: 16\ntrain:\n  ibot:\n    weight: 1.0\n",
        );
        assert_eq!(key, "train.ibot.mask_ratio");
        assert!(msg.contains("4 patches"), "{msg}");
        let (key, _, _) = invalid(
            "model:\n  use_bn_in_head: true\ntrain:\n  ibot:\n    weight: 1.0\n    separate_head: true\n",
        );
        assert_eq!(key, "train.ibot.separate_head");
        for mode in ["bag", "tokens"] {
            let c = Config::from_yaml(
                &format!("data:\n  channel_names: [a, b]\n  channel_combinations: [\"01\"]\nmodel:\n  channels: {mode}\ntrain:\n  ibot:\n    weight: 1.0\n"),
                "t",
            );
            assert!(c.is_ok(), "{mode}: {c:?}");
        }
        assert!(Config::from_yaml("train:\n  ibot:\n    wieght: 1.0\n", "t").is_err());
    }

    #[test]
    fn evaluation_and_collapse_keys_are_validated() {
        let c = Config::from_yaml(
            "data:\n  test_dir: s3://b/Test\ntrain:\n  on_collapse: stop\ndownstream:\n  linear_probe:\n    l2: [0.0, 0.01]\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.train.on_collapse, OnCollapse::Stop);
        assert_eq!(c.downstream.linear_probe.l2, vec![0.0, 0.01]);
        assert_eq!(
            Config::from_yaml("", "t").unwrap().train.on_collapse,
            OnCollapse::Warn
        );
        let (key, line, _) = invalid("downstream:\n  linear_probe:\n    l2: [0.1, -1]\n");
        assert_eq!(
            (key.as_str(), line),
            ("downstream.linear_probe.l2[1]", Some(3))
        );
        let (key, _, _) = invalid("downstream:\n  linear_probe:\n    validation_fraction: 1.0\n");
        assert_eq!(key, "downstream.linear_probe.validation_fraction");
        let (key, _, msg) = invalid("data:\n  test_dir: http://x/Test\n");
        assert_eq!(key, "data.test_dir");
        assert!(msg.contains("only local paths and s3://"), "{msg}");
        assert!(Config::from_yaml("train:\n  on_collapse: ignore\n", "t").is_err());
        assert_eq!(
            Config::from_yaml("train:\n  peak_tflops: 989\n", "t")
                .unwrap()
                .train
                .peak_tflops,
            Some(989.0)
        );
        assert_eq!(Config::from_yaml("", "t").unwrap().train.peak_tflops, None);
        let (key, line, _) = invalid("run:\n  seed: 1\ntrain:\n  peak_tflops: -1\n");
        assert_eq!((key.as_str(), line), ("train.peak_tflops", Some(4)));
    }

    #[test]
    fn list_channel_combinations_are_accepted() {
        let c = Config::from_yaml(
            "data:\n  channel_names: [a, b, c, d, e, f, g, h, i, j, k, l]\n  channel_combinations: [[11, 0], \"29\"]\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.channel_sets, vec![vec![11, 0], vec![2, 9]]);
        assert_eq!(c.model_dir_name(&[11, 0]), "name_of_model_channel_l_a");
    }

    #[test]
    fn missing_channels_zeros_is_for_unadapted_fixed_models() {
        let c = Config::from_yaml(
            "downstream:\n  features:\n    missing_channels: zeros\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            c.downstream.features.missing_channels,
            MissingChannels::Zeros
        );
        assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
        assert_eq!(
            Config::from_yaml("", "t")
                .unwrap()
                .downstream
                .features
                .missing_channels,
            MissingChannels::Refuse
        );
        let (key, line, msg) = invalid(
            "model:\n  channels: tokens\ndownstream:\n  features:\n    missing_channels: zeros\n",
        );
        assert_eq!(
            (key.as_str(), line),
            ("downstream.features.missing_channels", Some(5))
        );
        assert!(msg.contains("model.channels: tokens"), "{msg}");
        let (key, _, msg) = invalid(
            "downstream:\n  features:\n    missing_channels: zeros\n    use_mean_patch_embedding: true\n",
        );
        assert_eq!(key, "downstream.features.missing_channels");
        assert!(msg.contains("use_mean_patch_embedding"), "{msg}");
        let e = Config::from_yaml(
            "downstream:\n  features:\n    missing_channels: mean\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("missing_channels"), "{e}");
    }

    /// `bag_pool: mean` is for bag models only; concat is the default everywhere.
    #[test]
    fn bag_pool_is_validated_against_the_channel_mode() {
        let bag = "data:\n  channel_names: [a, b]\n  channel_combinations: [\"01\", \"1\"]\nmodel:\n  channels: bag\n";
        let c = Config::from_yaml(
            &format!("{bag}downstream:\n  features:\n    bag_pool: mean\n"),
            "t",
        )
        .unwrap();
        assert_eq!(c.downstream.features.bag_pool, BagPool::Mean);
        assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
        for text in ["", bag] {
            let d = Config::from_yaml(text, "t").unwrap();
            assert_eq!(d.downstream.features.bag_pool, BagPool::Concat);
        }
        for mode in ["fixed", "tokens"] {
            let (key, line, msg) = invalid(&format!(
                "model:\n  channels: {mode}\ndownstream:\n  features:\n    bag_pool: mean\n"
            ));
            assert_eq!(
                (key.as_str(), line),
                ("downstream.features.bag_pool", Some(5))
            );
            assert!(msg.contains(&format!("model.channels: {mode}")), "{msg}");
        }
        // Concat written out for a fixed model (as `config show` writes it) is fine.
        assert!(Config::from_yaml("downstream:\n  features:\n    bag_pool: concat\n", "t").is_ok());
        let e = Config::from_yaml("downstream:\n  features:\n    bag_pool: max\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn patch_embedding_options() {
        let c = Config::from_yaml(
            "downstream:\n  features:\n    custom_embedding_map: {2: 0, 4: 1}\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            c.downstream.features.custom_embedding_map,
            [(2, 0), (4, 1)].into_iter().collect()
        );
        assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
        let (key, line, msg) =
            invalid("downstream:\n  features:\n    use_mean_patch_embedding: true\n    custom_embedding_map: {0: 0}\n");
        assert_eq!(
            (key.as_str(), line),
            ("downstream.features.custom_embedding_map", Some(4))
        );
        assert!(msg.contains("use_mean_patch_embedding"), "{msg}");
        let (key, line, msg) =
            invalid("downstream:\n  features:\n    custom_embedding_map: {5: 0}\n");
        assert_eq!(
            (key.as_str(), line),
            ("downstream.features.custom_embedding_map", Some(3))
        );
        assert!(msg.contains("maps channel 5"), "{msg}");
        let e = Config::from_yaml(
            "downstream:\n  features:\n    use_custom_embedding_map: true\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("use_custom_embedding_map"), "{e}");
    }

    /// `model.channels`: fixed stays scDINO; the adaptive modes train
    /// one model on every channel, name their folders by mode and refuse scDINO's
    /// patch-embedding adapters.
    #[test]
    fn channel_modes() {
        let five = "data:\n  channel_names: [a, b, c, d, e]\n  channel_combinations: [\"01234\", \"0\", \"13\"]\n";
        let fixed = Config::from_yaml(five, "t").unwrap();
        assert_eq!(fixed.model.channels, ChannelMode::Fixed);
        assert!(
            fixed.to_yaml().contains("channels: fixed"),
            "`config show` lists it"
        );
        assert_eq!(fixed.training_channels(2), Some(vec![1, 3]));
        assert_eq!(fixed.trained_models(), 3);
        assert_eq!(fixed.used_channels(), vec![0, 1, 2, 3, 4]);
        assert_eq!(fixed.model_dir_name(&[1, 3]), "name_of_model_channel_b_d");
        let only = Config::from_yaml(
            "data:\n  channel_names: [a, b, c, d, e]\n  channel_combinations: [\"13\"]\n",
            "t",
        )
        .unwrap();
        assert_eq!(only.used_channels(), vec![1, 3]);
        for (mode, name) in [(ChannelMode::Bag, "bag"), (ChannelMode::Tokens, "tokens")] {
            let text = format!("model:\n  channels: {name}\n{five}");
            let c = Config::from_yaml(&text, "t").unwrap();
            assert_eq!(c.model.channels, mode);
            assert!(c.to_yaml().contains(&format!("channels: {name}")));
            assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
            for combination in 0..3 {
                assert_eq!(c.training_channels(combination), Some(vec![0, 1, 2, 3, 4]));
            }
            assert_eq!(c.trained_models(), 1);
            assert_eq!(c.training_channels(3), None);
            assert_eq!(
                c.model_dir_name(&[1, 3]),
                format!("name_of_model_{name}_channel_b_d")
            );
            let (key, line, msg) = invalid(&format!(
                "{text}downstream:\n  features:\n    use_mean_patch_embedding: true\n"
            ));
            assert_eq!(
                (key.as_str(), line),
                ("downstream.features.use_mean_patch_embedding", Some(8))
            );
            assert!(msg.contains(&format!("model.channels: {name}")), "{msg}");
        }
        let e = Config::from_yaml("model:\n  channels: rgb\n", "t")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rgb") && e.contains("tokens") && e.contains("line 2"),
            "{e}"
        );
    }

    #[test]
    fn resolved_yaml_round_trips() {
        let c = Config::from_yaml(
            "run:\n  name: demo\ntrain:\n  min_lr: 1.0e-7\n  precision: bf16\n",
            "t",
        )
        .unwrap();
        let again = Config::from_yaml(&c.to_yaml(), "shown").unwrap();
        assert_eq!(c, again);
    }
}
