//! One YAML file drives every stage. `Sections` is the schema as written (with scDINO's
//! defaults); `Config` is the same after validation, plus the values derived from it. A `Config`
//! only exists validated: build it with [`Config::load`] or [`Config::from_yaml`].
//!
//! Its own crate, without libtorch, because two programs must apply the same rules: the trainer
//! (re-exported as `trainer::config`) and the launcher, which validates a config before it
//! bakes it into an image.
mod compat;
mod dichavit;
mod locate;
mod location;
mod parse;
pub mod reference;
pub mod scdino;
mod sections;
mod source_layout;
mod stage;
mod validate;

pub use compat::{IgnoredKey, RenamedKey, IGNORED_KEYS, RENAMED_KEYS};
pub use dichavit::{ChannelSampling, DiChaViTSection};
pub use locate::KeyLines;
pub use location::{DatasetLocation, LocationError, Scheme, StoreUrl};
pub use parse::{parse_yaml, Unparsed};
pub use sections::*;
pub use source_layout::{ReadLayout, SourceLayout};
pub use stage::{JobKind, Stage, StageFacts, UnknownStage, PIPELINE_STAGES, STAGES};
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
        Self::read_file(path, None)
    }

    /// [`Config::load`], with the `model:` keys that a `model.init.from` source fixes taken
    /// from `source` where the file does not write them, and refused where it writes them
    /// otherwise ([`SourceLayout`]). The trainer reads a user's file this way.
    pub fn load_with(path: &Path, source: &dyn ReadLayout) -> Result<Self, ConfigError> {
        Self::read_file(path, Some(source))
    }

    fn read_file(path: &Path, source: Option<&dyn ReadLayout>) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let origin = path.display().to_string();
        let lines = KeyLines::scan(&text);
        let cfg = Self::read(&text, &lines, &origin, source)?;
        for (key, line) in compat::ignored_keys_written(&lines) {
            tracing::warn!("{}", compat::ignored_key_notice(&origin, &key, line));
        }
        Ok(cfg)
    }

    /// `origin` names the source in messages (a file path, or `<stdin>`).
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::read(text, &KeyLines::scan(text), origin, None)
    }

    /// [`Config::from_yaml`] with the layout of `model.init.from` ([`Config::load_with`]).
    pub fn from_yaml_with(
        text: &str,
        origin: &str,
        source: &dyn ReadLayout,
    ) -> Result<Self, ConfigError> {
        Self::read(text, &KeyLines::scan(text), origin, Some(source))
    }

    /// The text is read twice: once for the line of each key (`lines`, which errors and
    /// notices need), once by the schema, which parses every value, locations included.
    fn read(
        text: &str,
        lines: &KeyLines,
        origin: &str,
        source: Option<&dyn ReadLayout>,
    ) -> Result<Self, ConfigError> {
        let v = Validator::new(origin, lines);
        if let Some(key) = compat::renamed_key_written(lines) {
            return Err(v.err(key.old, &compat::renamed_key_message(&key)).into());
        }
        let (parsed, refused) = location::refused_during(|| parse_yaml::<Sections>(text, origin));
        let mut sections = match (parsed, refused) {
            (Ok(sections), _) => sections,
            (Err(_), Some((key, e))) => return Err(v.err(key, &e.to_string()).into()),
            (Err(e), None) => return Err(e.into()),
        };
        let init = &sections.model.init;
        if let (Some(source), Some(from)) = (source, init.from.clone()) {
            if !from.trim().is_empty() {
                let layout = source.read_layout(init).map_err(|e| {
                    v.err(
                        "model.init.from",
                        &format!("cannot read the model {from} fixes: {e}"),
                    )
                })?;
                layout.resolve(&mut sections.model, &v, &from)?;
            }
        }
        Self::validate(sections, origin, lines)
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

    /// Each section checks itself (`validate/<section>.rs`), in this order: the first value
    /// refused is the one reported. A new section adds its call here.
    fn validate(s: Sections, origin: &str, lines: &KeyLines) -> Result<Self, ConfigError> {
        let v = Validator::new(origin, lines);
        s.run.validate(&v)?;
        let channel_sets = s.data.validate(&v)?;
        s.model.validate(&v, &s.data)?;
        s.train.validate(&v, &s.model, &s.augment)?;
        s.augment.validate(&v, &s.model)?;
        s.downstream.validate(&v, &s.model, &s.data)?;
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
            DatasetLocation::Remote(StoreUrl::parse("s3://bkt/pbmc").unwrap())
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
        let (key, _, msg) = invalid("data:\n  dataset_dir: hdfs://b/x\n");
        assert_eq!(key, "data.dataset_dir");
        assert!(
            msg.contains("only local paths (or file:///path), s3://"),
            "{msg}"
        );
        let (key, line, msg) = invalid("data:\n  test_dir: gs:///x\n");
        assert_eq!((key.as_str(), line), ("data.test_dir", Some(2)));
        assert_eq!(msg, "a gs:// dataset needs a bucket: gs://bucket/prefix");
        // The key's line, not the value's, whatever the YAML style.
        let (key, line, _) = invalid("data:\n  test_dir: >\n    http://x\n");
        assert_eq!((key.as_str(), line), ("data.test_dir", Some(2)));
        // A refusal reported once does not name a key in the next file's syntax error.
        assert!(matches!(
            Config::from_yaml("data: [", "t"),
            Err(ConfigError::Parse { .. })
        ));
        // Another kind of value where a location goes is the schema's error, as before.
        assert!(matches!(
            Config::from_yaml("data:\n  dataset_dir: [a]\n", "t"),
            Err(ConfigError::Parse { .. })
        ));
    }

    /// `data.s3` is refused naming `data.object_store`, where the same keys are read now (the
    /// schema alone would only call `s3` unknown), and the new key reads them.
    #[test]
    fn the_old_object_store_key_is_refused_naming_the_new_one() {
        let (key, line, msg) = invalid("run:\n  seed: 1\ndata:\n  s3:\n    max_concurrency: 4\n");
        assert_eq!((key.as_str(), line), ("data.s3", Some(4)));
        assert!(msg.starts_with("renamed to `data.object_store` ("), "{msg}");
        let (key, line, _) = invalid("data: {s3: {}}\n");
        assert_eq!((key.as_str(), line), ("data.s3", Some(1)));
        let c = Config::from_yaml("data:\n  object_store:\n    max_concurrency: 4\n", "t").unwrap();
        assert_eq!(c.data.object_store.max_concurrency, 4);
        assert!(c.to_yaml().contains("  object_store:\n"));
        // Only the section itself: a key named `s3` elsewhere is the schema's to judge.
        assert!(matches!(
            Config::from_yaml("run:\n  s3: 1\n", "t"),
            Err(ConfigError::Parse { .. })
        ));
    }

    /// Every refusal no other test reaches, each as a one-line file: the section that checks it
    /// names the key, the line and this exact message.
    #[test]
    fn each_section_refuses_its_values_with_key_line_and_message() {
        let cases: &[(&str, &str, &str)] = &[
            ("run: {name: ' '}", "run.name", "must not be empty"),
            (
                "run: {name: a/b}",
                "run.name",
                "is a folder name and must not contain '/'",
            ),
            (
                "data: {mean_std_fraction: 0}",
                "data.mean_std_fraction",
                "is 0 but must be in (0, 1]: the share of images used to estimate mean/std",
            ),
            (
                "data: {images_are_rgb: true}",
                "data.images_are_rgb",
                "RGB images are not supported yet; multi-channel TIFFs only",
            ),
            (
                "data: {screen: {layout: chammi, objects: o.csv}}",
                "data.screen.objects",
                "does not apply to `layout: chammi` (each image is one whole cell)",
            ),
            (
                "data: {screen: {objects: o.csv, image_root: /chammi}}",
                "data.screen.image_root",
                "is for `layout: chammi` only (CHAMMI's tiled crops)",
            ),
            (
                "data: {screen: {layout: chammi, dataset_channels: {CP: []}}}",
                "data.screen.dataset_channels.CP",
                "names no channels",
            ),
            (
                "model: {patch_size: 0}",
                "model.patch_size",
                "must be between 1 and 64 pixels (scDINO uses 8 or 16)",
            ),
            ("model: {out_dim: 0}", "model.out_dim", "must be positive"),
            (
                "model: {drop_path_rate: 1.0}",
                "model.drop_path_rate",
                "must be in [0, 1)",
            ),
            ("model: {name: ''}", "model.name", "must not be empty"),
            (
                "model: {name: a/b}",
                "model.name",
                "is a folder name and must not contain '/'",
            ),
            (
                "train: {batch_size_per_gpu: 0}",
                "train.batch_size_per_gpu",
                "must be at least 1",
            ),
            (
                "train: {momentum_teacher: 1.5}",
                "train.momentum_teacher",
                "must be in [0, 1] (0.996 is typical)",
            ),
            (
                "train: {warmup_teacher_temp: 0}",
                "train.warmup_teacher_temp",
                "is 0 but must be a positive number",
            ),
            (
                "train: {warmup_teacher_temp_epochs: 11}",
                "train.warmup_teacher_temp_epochs",
                "is 11 but training has only 10 epochs",
            ),
            (
                "train: {weight_decay: -1}",
                "train.weight_decay",
                "is -1 but must be zero or positive",
            ),
            (
                "train: {weight_decay_end: -1}",
                "train.weight_decay_end",
                "is -1 but must be zero or positive",
            ),
            (
                "train: {lr: 0}",
                "train.lr",
                "is 0 but must be a positive number",
            ),
            (
                "train: {min_lr: -1}",
                "train.min_lr",
                "is -1 but must be zero or positive",
            ),
            (
                "train: {lr: 0.001, min_lr: 0.01}",
                "train.min_lr",
                "is 0.01 but must not exceed train.lr (0.001)",
            ),
            (
                "train: {freeze_last_layer: 11}",
                "train.freeze_last_layer",
                "is 11 but training has only 10 epochs: the head's last layer would never train",
            ),
            (
                "train: {log_every: 0}",
                "train.log_every",
                "must be at least 1",
            ),
            (
                "train: {ibot: {weight: 1, student_temp: 0}}",
                "train.ibot.student_temp",
                "is 0 but must be a positive number",
            ),
            (
                "train: {ibot: {weight: 1, teacher_temp: 0}}",
                "train.ibot.teacher_temp",
                "is 0 but must be a positive number",
            ),
            (
                "augment: {global_crop_size: 8}",
                "augment.global_crop_size",
                "is 8 px, smaller than one 16 px patch",
            ),
            (
                "downstream: {attention: {image_size: 8}}",
                "downstream.attention.image_size",
                "must be at least one patch",
            ),
            (
                "downstream: {knn: {temperature: 0}}",
                "downstream.knn.temperature",
                "is 0 but must be a positive number",
            ),
            (
                "downstream: {linear_probe: {max_iterations: 0}}",
                "downstream.linear_probe.max_iterations",
                "must be at least 1",
            ),
            (
                "downstream: {umap: {n_neighbors: 1}}",
                "downstream.umap.n_neighbors",
                "must be at least 2",
            ),
            (
                "downstream: {umap: {min_dist: -1}}",
                "downstream.umap.min_dist",
                "is -1 but must be zero or positive",
            ),
            (
                "downstream: {umap: {spread: 0}}",
                "downstream.umap.spread",
                "is 0 but must be a positive number",
            ),
            (
                "downstream: {umap: {min_dist: 2}}",
                "downstream.umap.min_dist",
                "is 2 but must not exceed spread (1.1)",
            ),
            (
                "downstream: {umap: {n_components: 3}}",
                "downstream.umap.n_components",
                "must be 2: the embedding exists to be plotted in 2-D",
            ),
            (
                "downstream: {metrics: {label: Class}}",
                "downstream.metrics.label",
                "must name a metadata column of the profile table (`Metadata_…`)",
            ),
            (
                "downstream: {metrics: {batch: Metadata_}}",
                "downstream.metrics.batch",
                "must name a metadata column of the profile table (`Metadata_…`)",
            ),
            (
                "downstream: {metrics: {batch: Metadata_Class}}",
                "downstream.metrics.batch",
                "must differ from downstream.metrics.label",
            ),
            (
                "downstream: {metrics: {null_size: 0}}",
                "downstream.metrics.null_size",
                "must be at least 1",
            ),
            (
                "downstream: {metrics: {n_neighbors: 1}}",
                "downstream.metrics.n_neighbors",
                "must be at least 2",
            ),
            (
                "downstream: {umap: {topometry_plots: true}}",
                "downstream.umap.topometry_plots",
                "is not supported (TopOMetry is a Python library); set it to false",
            ),
            (
                "downstream: {umap: {epochs: 0}}",
                "downstream.umap.epochs",
                "must be at least 1",
            ),
            (
                "downstream: {profiling: {screen: ''}}",
                "downstream.profiling.screen",
                "must not be empty (leave it out instead)",
            ),
            (
                "downstream: {profiling: {screen: s.yaml, images: cells/}}",
                "downstream.profiling.images",
                "cannot be combined with downstream.profiling.screen: name one set of cells to embed",
            ),
            (
                "downstream: {profiling: {path_pattern: '{Plate}/{Well}.tiff'}}",
                "downstream.profiling.path_pattern",
                "applies to downstream.profiling.images only (a screen's cells carry their plate, well and site)",
            ),
            (
                "downstream: {profiling: {screen: s.yaml, metadata: m.csv}}",
                "downstream.profiling.metadata",
                "applies to downstream.profiling.images only (a screen's cells carry their plate, well and site)",
            ),
            (
                "downstream: {profiling: {enabled: true}}",
                "downstream.profiling.enabled",
                "profiles a screen, and this run's data is not one (data.screen is not set): name one with downstream.profiling.screen (a config with data.screen) or per-cell images with downstream.profiling.images",
            ),
            (
                "downstream: {profiling: {recipe: [a, b]}}",
                "downstream.profiling.recipe",
                "must be the path of a recipe file or the recipe as a mapping (docs/scoring.md, \"The recipe file\")",
            ),
        ];
        for &(yaml, key, message) in cases {
            let got = invalid(&format!("\n{yaml}\n"));
            assert_eq!(
                got,
                (key.to_string(), Some(2), message.to_string()),
                "{yaml}"
            );
        }
    }

    /// `downstream.profiling.recipe` is a path or a mapping kept as written (the trainer
    /// checks its keys), and the section's own keys are strict.
    #[test]
    fn profiling_takes_a_recipe_path_or_an_inline_recipe() {
        let c = Config::from_yaml("", "t").unwrap();
        assert!(!c.downstream.profiling.enabled);
        assert_eq!(
            c.downstream.profiling.checkpoints,
            ProfiledCheckpoints::Last
        );
        let c = Config::from_yaml(
            "downstream:\n  profiling:\n    enabled: true\n    images: cells/\n    path_pattern: '{Plate}/{Well}/{Cell}.tiff'\n    recipe: recipe.yaml\n    checkpoints: all\n",
            "t",
        )
        .unwrap();
        let p = &c.downstream.profiling;
        assert_eq!(p.recipe, Some(serde_json::json!("recipe.yaml")));
        assert_eq!(p.checkpoints, ProfiledCheckpoints::All);
        let c = Config::from_yaml(
            "downstream:\n  profiling:\n    enabled: true\n    screen: s.yaml\n    recipe:\n      perturbation: Metadata_Treatment\n      normalize: {by: []}\n      map: {null_size: 100}\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            c.downstream.profiling.recipe,
            Some(serde_json::json!({
                "perturbation": "Metadata_Treatment",
                "normalize": {"by": []},
                "map": {"null_size": 100}
            }))
        );
        assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
        let e = Config::from_yaml("downstream:\n  profiling:\n    recipes: r.yaml\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("recipes") && e.contains("line 3"), "{e}");
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
        // A BatchNorm DINO head with a separate iBOT head (built without BatchNorm).
        let both = Config::from_yaml(
            "model:\n  use_bn_in_head: true\ntrain:\n  ibot:\n    weight: 1.0\n    separate_head: true\n",
            "t",
        )
        .unwrap();
        assert!(both.model.use_bn_in_head && both.train.ibot.separate_head);
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
    fn cuda_graphs_is_off_by_default_a_bool_and_strict() {
        assert!(!Config::from_yaml("", "t").unwrap().train.cuda_graphs);
        let on = Config::from_yaml("train:\n  cuda_graphs: true\n", "t").unwrap();
        assert!(on.train.cuda_graphs);
        let e = Config::from_yaml("train:\n  cuda_graphs: sometimes\n", "g.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cuda_graphs") && e.contains("line 2"), "{e}");
        let e = Config::from_yaml("train:\n  cuda_graph: true\n", "g.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cuda_graph") && e.contains("line 2"), "{e}");
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
        assert!(
            msg.contains("only local paths (or file:///path), s3://"),
            "{msg}"
        );
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

    /// `tokens_pool: cls_and_channels` and `joint_and_alone` are for tokens models only; cls is
    /// the default everywhere.
    #[test]
    fn tokens_pool_is_validated_against_the_channel_mode() {
        let tokens = "data:\n  channel_names: [a, b]\n  channel_combinations: [\"01\", \"1\"]\nmodel:\n  channels: tokens\n";
        for (name, pool) in [
            ("cls_and_channels", TokensPool::ClsAndChannels),
            ("joint_and_alone", TokensPool::JointAndAlone),
        ] {
            let c = Config::from_yaml(
                &format!("{tokens}downstream:\n  features:\n    tokens_pool: {name}\n"),
                "t",
            )
            .unwrap();
            assert_eq!(c.downstream.features.tokens_pool, pool);
            assert_eq!(pool.name(), name);
            assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
            for mode in ["fixed", "bag"] {
                let (key, line, msg) = invalid(&format!(
                    "model:\n  channels: {mode}\ndownstream:\n  features:\n    tokens_pool: {name}\n"
                ));
                assert_eq!(
                    (key.as_str(), line),
                    ("downstream.features.tokens_pool", Some(5))
                );
                assert!(msg.contains(&format!("model.channels: {mode}")), "{msg}");
            }
        }
        for text in ["", tokens] {
            let d = Config::from_yaml(text, "t").unwrap();
            assert_eq!(d.downstream.features.tokens_pool, TokensPool::Cls);
        }
        assert!(Config::from_yaml("downstream:\n  features:\n    tokens_pool: cls\n", "t").is_ok());
        let e = Config::from_yaml("downstream:\n  features:\n    tokens_pool: patches\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("patches") && e.contains("line 3"), "{e}");
    }

    /// `teacher_channels: all` is for tokens models only; `step` is the default everywhere.
    #[test]
    fn teacher_channels_is_validated_against_the_channel_mode() {
        let tokens = "data:\n  channel_names: [a, b]\n  channel_combinations: [\"01\", \"1\"]\nmodel:\n  channels: tokens\n";
        let c =
            Config::from_yaml(&format!("{tokens}train:\n  teacher_channels: all\n"), "t").unwrap();
        assert_eq!(c.train.teacher_channels, TeacherChannels::All);
        assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
        for text in ["", tokens] {
            let d = Config::from_yaml(text, "t").unwrap();
            assert_eq!(d.train.teacher_channels, TeacherChannels::Step);
        }
        for mode in ["fixed", "bag"] {
            let (key, line, msg) = invalid(&format!(
                "model:\n  channels: {mode}\ntrain:\n  teacher_channels: all\n"
            ));
            assert_eq!((key.as_str(), line), ("train.teacher_channels", Some(4)));
            assert!(
                msg.contains(&format!("this run has {mode}"))
                    && msg.contains("model.channels: tokens"),
                "{msg}"
            );
        }
        assert!(Config::from_yaml(
            "model:\n  channels: bag\ntrain:\n  teacher_channels: step\n",
            "t"
        )
        .is_ok());
        let e = Config::from_yaml("train:\n  teacher_channels: every\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("every") && e.contains("line 2"), "{e}");
    }

    /// `channel_dino_weight` is for tokens models whose teacher sees the student's channels;
    /// 0 (off) is the default everywhere and accepted with any mode.
    #[test]
    fn channel_dino_weight_needs_tokens_and_the_step_teacher() {
        let tokens = "data:\n  channel_names: [a, b]\n  channel_combinations: [\"01\", \"1\"]\nmodel:\n  channels: tokens\n";
        let c = Config::from_yaml(
            &format!("{tokens}train:\n  channel_dino_weight: 0.5\n"),
            "t",
        )
        .unwrap();
        assert_eq!(c.train.channel_dino_weight, 0.5);
        assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
        assert_eq!(
            Config::from_yaml("", "t")
                .unwrap()
                .train
                .channel_dino_weight,
            0.0
        );
        for mode in ["fixed", "bag"] {
            let (key, line, msg) = invalid(&format!(
                "model:\n  channels: {mode}\ntrain:\n  channel_dino_weight: 1.0\n"
            ));
            assert_eq!((key.as_str(), line), ("train.channel_dino_weight", Some(4)));
            assert!(
                msg.contains(&format!("this run has {mode}"))
                    && msg.contains("model.channels: tokens"),
                "{msg}"
            );
            let off = format!("model:\n  channels: {mode}\ntrain:\n  channel_dino_weight: 0\n");
            assert!(Config::from_yaml(&off, "t").is_ok());
        }
        let (key, line, msg) = invalid(&format!(
            "{tokens}train:\n  teacher_channels: all\n  channel_dino_weight: 1.0\n"
        ));
        assert_eq!((key.as_str(), line), ("train.channel_dino_weight", Some(8)));
        assert!(msg.contains("teacher_channels: all"), "{msg}");
        let (key, _, msg) = invalid(&format!("{tokens}train:\n  channel_dino_weight: -1\n"));
        assert_eq!(key, "train.channel_dino_weight");
        assert!(msg.contains("-1"), "{msg}");
    }

    /// `single_channel_steps` is a fraction, for tokens models only; 0 (off) is the default
    /// everywhere and accepted with any mode.
    #[test]
    fn single_channel_steps_is_a_fraction_for_tokens_only() {
        let tokens = "data:\n  channel_names: [a, b]\n  channel_combinations: [\"01\", \"1\"]\nmodel:\n  channels: tokens\n";
        for f in ["0.5", "1", "0"] {
            let c = Config::from_yaml(
                &format!("{tokens}train:\n  single_channel_steps: {f}\n"),
                "t",
            )
            .unwrap();
            assert_eq!(c.train.single_channel_steps, f.parse::<f64>().unwrap());
            assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
        }
        assert_eq!(
            Config::from_yaml("", "t")
                .unwrap()
                .train
                .single_channel_steps,
            0.0
        );
        for bad in ["1.5", "-0.1", ".nan"] {
            let (key, line, msg) =
                invalid(&format!("{tokens}train:\n  single_channel_steps: {bad}\n"));
            assert_eq!(
                (key.as_str(), line),
                ("train.single_channel_steps", Some(7))
            );
            assert!(msg.contains("from 0 to 1"), "{msg}");
        }
        for mode in ["fixed", "bag"] {
            let (key, line, msg) = invalid(&format!(
                "model:\n  channels: {mode}\ntrain:\n  single_channel_steps: 0.5\n"
            ));
            assert_eq!(
                (key.as_str(), line),
                ("train.single_channel_steps", Some(4))
            );
            assert!(
                msg.contains(&format!("this run has {mode}"))
                    && msg.contains("model.channels: tokens"),
                "{msg}"
            );
            let off = format!("model:\n  channels: {mode}\ntrain:\n  single_channel_steps: 0\n");
            assert!(Config::from_yaml(&off, "t").is_ok());
        }
    }

    /// `downstream.attention.beside` lists other runs' configs: none by default, each once.
    #[test]
    fn attention_beside_lists_other_runs_once() {
        assert!(Config::from_yaml("", "t")
            .unwrap()
            .downstream
            .attention
            .beside
            .is_empty());
        let c = Config::from_yaml(
            "downstream:\n  attention:\n    beside: [runs/bag.yaml, /abs/tokens.yaml]\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            c.downstream.attention.beside,
            [
                std::path::PathBuf::from("runs/bag.yaml"),
                std::path::PathBuf::from("/abs/tokens.yaml")
            ]
        );
        assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
        let (key, line, msg) =
            invalid("downstream:\n  attention:\n    beside:\n      - a.yaml\n      - a.yaml\n");
        assert_eq!(key, "downstream.attention.beside[1]");
        assert!(
            line.is_some() && msg.contains("listed twice"),
            "{line:?} {msg}"
        );
        let (key, _, msg) = invalid("downstream:\n  attention:\n    beside: ['']\n");
        assert_eq!(key, "downstream.attention.beside[0]");
        assert!(msg.contains("another run's config"), "{msg}");
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
        // The default position grid is not written, so a run's recorded config (in every
        // checkpoint) is what it was before `model.img_size` existed.
        assert!(!c.to_yaml().contains("img_size"), "{}", c.to_yaml());
    }
}
