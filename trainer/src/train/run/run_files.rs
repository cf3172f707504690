//! The files of a run besides checkpoints and telemetry, kept where scDINO kept them so its
//! downstream scripts still find them: the dataset's mean/std (shared by every channel
//! combination, so computed once per run folder, by [`mean_std::load_or_compute`]),
//! `run_log.txt` (the settings a model was trained with) and the trimming of `log.txt` a
//! resume needs.
use super::TrainError;
use crate::config::Config;
use crate::data::mean_std::{self, MeanStd};
use crate::data::{self, ImageSource};
use crate::layout::RunLayout;
use std::path::{Path, PathBuf};

/// `{output_dir}/{name}/scDINO_ViTs/{model}_channel_{names}` (see [`crate::layout`]).
pub fn model_dir(cfg: &Config, channels: &[usize]) -> PathBuf {
    RunLayout::new(cfg).model(cfg, channels).dir().to_path_buf()
}

/// Loads `mean_and_std_of_dataset.txt` from the run folder, computing it first if missing.
pub fn dataset_mean_std(cfg: &Config, source: &dyn ImageSource) -> Result<MeanStd, TrainError> {
    Ok(mean_std::load_or_compute(
        cfg,
        source,
        &RunLayout::new(cfg).mean_std(),
    )?)
}

/// What one training run's `run_log.txt` records besides the config.
pub struct RunLog<'a> {
    pub channels: &'a [usize],
    pub iters_per_epoch: usize,
    /// The peak lr after scaling to the global batch.
    pub scaled_lr: f64,
    pub resumed: bool,
}

impl RunLog<'_> {
    /// scDINO's `run_log.txt`: the seed line, then one `name : value` line per setting.
    pub fn write(&self, path: &Path, cfg: &Config) -> Result<(), TrainError> {
        let mut text = format!(
            "successfully computed features with seed {}: \nparameters: \n",
            cfg.run.seed
        );
        text.push_str(&format!("selected_channels : {:?} \n", self.channels));
        text.push_str(&format!(
            "iterations_per_epoch : {} \n",
            self.iters_per_epoch
        ));
        text.push_str(&format!("scaled_lr : {} \n", self.scaled_lr));
        text.push_str(&format!("resumed : {} \n", self.resumed));
        for line in cfg.to_yaml().lines() {
            text.push_str(line);
            text.push_str(" \n");
        }
        scdino_base::fs::write_atomic(path, text.as_bytes())
            .map_err(data::DataError::writing(path))?;
        Ok(())
    }
}

/// Keeps only the log lines of epochs before `epoch` (a resumed run rewrites the rest).
pub fn trim_log(path: &Path, epoch: usize) -> Result<(), TrainError> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["epoch"].as_u64())
                .is_some_and(|e| (e as usize) < epoch)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    if kept != text {
        scdino_base::fs::write_atomic(path, kept.as_bytes())
            .map_err(data::DataError::writing(path))?;
    }
    Ok(())
}
