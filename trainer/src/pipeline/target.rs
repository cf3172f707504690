//! One trained model of a run (a channel combination of a config, and where its files live)
//! and its dataset: what every stage works on, the single-stage commands and the pipeline alike.
use super::stage_error::StageError;
use crate::analysis::features;
use crate::config::Config;
use crate::data::mean_std::MeanStd;
use crate::data::{SharedSource, Split};
use crate::layout::{ModelLayout, RunLayout};
use std::cell::OnceCell;
use std::path::{Path, PathBuf};

/// One trained model: a channel combination of a config, and where its files live.
pub struct Target<'a> {
    pub cfg: &'a Config,
    pub combination: usize,
    pub channels: Vec<usize>,
    pub run: RunLayout,
    /// Checkpoints, logs and analyses of this combination.
    pub files: ModelLayout,
    /// Opened on first use: a listing (S3) and a shuffle that stages share.
    dataset: OnceCell<Dataset>,
}

/// The dataset of a config and its training / held-out split (the one training uses).
pub struct Dataset {
    pub source: SharedSource,
    pub split: Split,
}

impl Dataset {
    /// The dataset and its split for the analyses of the combination `channels` (where cells
    /// bring their own channels, the cells that hold all of them).
    pub fn open(cfg: &Config, channels: &[usize]) -> Result<Self, StageError> {
        let source = crate::data::open_source(&cfg.data)?;
        let split = crate::data::cell_channels::combination_split(
            source.as_ref(),
            &cfg.data,
            cfg.run.seed as u32,
            channels,
        )?;
        Ok(Self { source, split })
    }
}

impl<'a> Target<'a> {
    pub fn new(cfg: &'a Config, combination: usize) -> Result<Self, StageError> {
        let channels =
            cfg.channel_sets
                .get(combination)
                .cloned()
                .ok_or(StageError::NoCombination {
                    index: combination,
                    count: cfg.channel_sets.len(),
                })?;
        let run = RunLayout::new(cfg);
        Ok(Self {
            cfg,
            combination,
            files: run.model(cfg, &channels),
            run,
            channels,
            dataset: OnceCell::new(),
        })
    }

    /// The names of this combination's channels, in order.
    pub fn channel_names(&self) -> Vec<String> {
        self.channels
            .iter()
            .map(|&c| self.cfg.data.channel_names[c].clone())
            .collect()
    }

    /// The dataset and its split, opened once per target.
    pub fn dataset(&self) -> Result<&Dataset, StageError> {
        if let Some(d) = self.dataset.get() {
            return Ok(d);
        }
        let d = Dataset::open(self.cfg, &self.channels)?;
        Ok(self.dataset.get_or_init(|| d))
    }

    pub fn mean_std(&self) -> Result<MeanStd, StageError> {
        let path = self.run.mean_std();
        MeanStd::read(&path).map_err(|source| StageError::NoMeanStd { source })
    }

    /// The dataset mean/std that `ckpt` embeds with: none for a timm folder, which is
    /// normalised with its own `config.json` mean/std (so needs no `trainer mean-std`).
    pub fn mean_std_for(&self, ckpt: &Path) -> Result<MeanStd, StageError> {
        if crate::analysis::pretrained::is_timm_folder(ckpt) {
            return Ok(MeanStd {
                mean: vec![],
                std: vec![],
            });
        }
        self.mean_std()
    }

    /// The numbered checkpoints training kept (`saveckp_freq` epochs and the last), oldest
    /// first, with their feature tags.
    pub fn numbered_checkpoints(&self) -> Vec<(String, PathBuf)> {
        let mut found: Vec<(usize, PathBuf)> = std::fs::read_dir(self.files.dir())
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let path = e.ok()?.path();
                Some((ModelLayout::numbered_epoch(&path)?, path))
            })
            .collect();
        found.sort();
        let init = self.files.initial_checkpoint();
        init.exists()
            .then(|| ("init".to_string(), init))
            .into_iter()
            .chain(
                found
                    .into_iter()
                    .map(|(epoch, p)| (format!("epoch{epoch}"), p)),
            )
            .collect()
    }

    /// Feature tags with extracted features, in epoch order.
    pub fn feature_tags(&self) -> Vec<String> {
        let mut tags: Vec<String> = std::fs::read_dir(self.files.features_dir())
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| n.strip_suffix("_features.safetensors").map(str::to_string))
            .collect();
        sort_tags(&mut tags);
        tags
    }
}

/// Sorts tags in training order: `init` (the untrained network), `step{N}` (a checkpoint
/// in the middle of the first epoch) by N, `epoch{N}` by N, then anything else by name.
pub fn sort_tags(tags: &mut [String]) {
    let number = |t: &str, prefix: &str| t.strip_prefix(prefix)?.parse::<u64>().ok();
    tags.sort_by_key(|t| {
        let rank = if t == "init" {
            (0, 0)
        } else if let Some(n) = number(t, "step") {
            (1, n)
        } else if let Some(n) = number(t, "epoch") {
            (2, n)
        } else {
            (3, 0)
        };
        (rank, t.clone())
    });
}

/// scDINO names analyses after the checkpoint's epoch counted from 0 (`checkpoint{E}.pth`);
/// works for our checkpoints and PyTorch `.pth` files alike.
pub fn tag_of_checkpoint(path: &Path) -> Result<String, StageError> {
    Ok(crate::model::backbone::checkpoint_tag(path).map_err(features::FeaturesError::from)?)
}
