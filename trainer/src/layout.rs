//! Every path of a run folder, in one place. Training writes here, the analyses read what
//! training wrote and write next to it, the pipeline decides from these files what is done, and
//! the report links them; a file name that differs between two of them would silently break a
//! resume or a report, so none of them spells a name itself.
//!
//! The tree is scDINO's (its outputs stay where its users and scripts look for them):
//!
//! ```text
//! {run.output_dir}/{run.name}/                     RunLayout
//!   mean_and_std_of_dataset.txt
//!   {model}_combinations.{html,json}                every combination's scores, one table
//!   scDINO_ViTs/{model}_channel_{names}/           ModelLayout::dir
//!     checkpoint.safetensors (+ .prev)             latest, for resume
//!     checkpoint{NNNN}.safetensors                 every checkpoint_every epochs and the last
//!     log.txt, run_log.txt, metrics.prom, tensorboard/
//!     fsdp/rank{r}of{w}/checkpoint.safetensors      FSDP shards
//!   {model}_channel_{names}_analyses/              ModelLayout::analyses
//!     CLS_features/{tag}_features.{safetensors,csv}, class_labels.csv, image_paths.csv
//!     kNN/{tag}_knn_metrics.json, {tag}_confusion.png, global_kNN.txt
//!     evaluation/{tag}_evaluation.json
//!     embedding_plots/{tag}_umap.{png,csv,json}
//!     attention_images/{tag}/attention_images.json
//!     report.html, report_assets/
//! ```
//!
//! With `model.channels: bag | tokens` the one model is `{model}_{mode}_channel_{all names}`
//! and each combination's analyses are in `{model}_{mode}_channel_{its names}_analyses`.
use crate::config::Config;
use std::path::{Path, PathBuf};

/// The checkpoint a resume starts from (written every epoch, atomically).
pub const LATEST_CHECKPOINT: &str = "checkpoint.safetensors";
/// The checkpoint before it, kept while the next one is written.
pub const PREVIOUS_CHECKPOINT: &str = "checkpoint.prev.safetensors";
/// The list of one checkpoint's attention images, in its attention folder.
pub const ATTENTION_MANIFEST: &str = "attention_images.json";

/// The run folder's folder of trained models.
const MODELS_DIR: &str = "scDINO_ViTs";

/// The folder of one run (`{output_dir}/{name}`): what all channel combinations share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLayout {
    root: PathBuf,
}

impl RunLayout {
    pub fn new(cfg: &Config) -> Self {
        Self {
            root: cfg.run_dir(),
        }
    }

    /// scDINO's dataset statistics, over every channel of the files.
    pub fn mean_std(&self) -> PathBuf {
        self.root.join("mean_and_std_of_dataset.txt")
    }

    /// The run's table of every channel combination's scores (see
    /// `pipeline::combinations`), named after the model (and its channel mode).
    pub fn combinations_html(&self, cfg: &Config) -> PathBuf {
        self.root
            .join(format!("{}_combinations.html", cfg.model_prefix()))
    }

    pub fn combinations_json(&self, cfg: &Config) -> PathBuf {
        self.root
            .join(format!("{}_combinations.json", cfg.model_prefix()))
    }

    /// The files of the model for the combination `channels`: trained on them (`fixed`), or
    /// the one model trained on every channel (`bag`, `tokens`), with the analyses of this
    /// combination in their own folder.
    pub fn model(&self, cfg: &Config, channels: &[usize]) -> ModelLayout {
        let trained: Vec<usize> = if cfg.model.channels.is_adaptive() {
            (0..cfg.file_channels()).collect()
        } else {
            channels.to_vec()
        };
        ModelLayout {
            dir: self
                .root
                .join(MODELS_DIR)
                .join(cfg.model_dir_name(&trained)),
            analyses: self
                .root
                .join(format!("{}_analyses", cfg.model_dir_name(channels))),
        }
    }
}

/// The files of one model (one channel combination): training outputs and analyses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelLayout {
    dir: PathBuf,
    analyses: PathBuf,
}

impl ModelLayout {
    /// `scDINO_ViTs/{model}`: checkpoints and training logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The layout of the model whose training folder is `dir` (`…/scDINO_ViTs/{model}`),
    /// without the config (a run folder that moved); None for a folder elsewhere.
    pub fn beside(dir: &Path) -> Option<Self> {
        let model = dir.file_name()?.to_str()?;
        let models = dir.parent()?;
        if models.file_name()? != MODELS_DIR {
            return None;
        }
        Some(Self {
            dir: dir.to_path_buf(),
            analyses: models.parent()?.join(format!("{model}_analyses")),
        })
    }

    /// `{model}_analyses`: features, kNN, evaluation, plots, attention, report.
    pub fn analyses(&self) -> &Path {
        &self.analyses
    }

    /// The checkpoint a resume starts from.
    pub fn latest_checkpoint(&self) -> PathBuf {
        self.dir.join(LATEST_CHECKPOINT)
    }

    /// The weights before the first step (`downstream.score_untrained`), tag `init`.
    pub fn initial_checkpoint(&self) -> PathBuf {
        self.dir.join("checkpoint_init.safetensors")
    }

    /// The kept checkpoint after `epoch` (0-based, scDINO's `checkpoint{epoch:04}.pth` names).
    pub fn numbered_checkpoint(&self, epoch: usize) -> PathBuf {
        self.dir.join(format!("checkpoint{epoch:04}.safetensors"))
    }

    /// The epoch of a numbered checkpoint's file name, `None` for any other file.
    pub fn numbered_epoch(path: &Path) -> Option<usize> {
        let digits = path
            .file_name()?
            .to_str()?
            .strip_prefix("checkpoint")?
            .strip_suffix(".safetensors")?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    /// One JSON line per finished epoch (scDINO's `log.txt`).
    pub fn log(&self) -> PathBuf {
        self.dir.join("log.txt")
    }

    /// scDINO's `run_log.txt`: the seed and every setting.
    pub fn run_log(&self) -> PathBuf {
        self.dir.join("run_log.txt")
    }

    /// Prometheus textfile-collector metrics, rewritten at every log step.
    pub fn metrics_prom(&self) -> PathBuf {
        self.dir.join("metrics.prom")
    }

    pub fn tensorboard(&self) -> PathBuf {
        self.dir.join("tensorboard")
    }

    /// The FSDP shard of `rank` in a world of `world` (a new world size gets a new folder and
    /// resumes from the consolidated checkpoint).
    pub fn fsdp_shards(&self, rank: usize, world: usize) -> PathBuf {
        self.dir.join("fsdp").join(format!("rank{rank}of{world}"))
    }

    pub fn features_dir(&self) -> PathBuf {
        self.analyses.join("CLS_features")
    }

    /// scDINO's headerless `%.18e` CSV of the features of `tag`.
    pub fn features_csv(&self, tag: &str) -> PathBuf {
        self.features_dir().join(format!("{tag}_features.csv"))
    }

    /// scDINO's label per feature row (of the last features written).
    pub fn class_labels_csv(&self) -> PathBuf {
        self.analyses.join("class_labels.csv")
    }

    /// scDINO's image path per feature row (of the last features written).
    pub fn image_paths_csv(&self) -> PathBuf {
        self.analyses.join("image_paths.csv")
    }

    /// The features of checkpoint `tag` with their labels and paths bound in.
    pub fn bundle(&self, tag: &str) -> PathBuf {
        self.features_dir()
            .join(format!("{tag}_features.safetensors"))
    }

    pub fn knn_dir(&self) -> PathBuf {
        self.analyses.join("kNN")
    }

    pub fn knn_json(&self, tag: &str) -> PathBuf {
        self.knn_dir().join(format!("{tag}_knn_metrics.json"))
    }

    pub fn confusion_png(&self, tag: &str) -> PathBuf {
        self.knn_dir().join(format!("{tag}_confusion.png"))
    }

    /// The features of `tag` as a Parquet profile table (one row per image, `Metadata_*`
    /// columns, then `DINO_CLS_*`), next to the CSV and the bundle.
    pub fn profiles(&self, tag: &str) -> PathBuf {
        self.features_dir().join(format!("{tag}_profiles.parquet"))
    }

    /// The training images' and the queries' features of an evaluation as one profile table
    /// (`Metadata_Split` tells them apart).
    pub fn evaluation_profiles(&self, tag: &str) -> PathBuf {
        self.evaluation_dir()
            .join(format!("{tag}_profiles.parquet"))
    }

    pub fn evaluation_dir(&self) -> PathBuf {
        self.analyses.join("evaluation")
    }

    /// The profiling field's scores of the evaluation profile table (`downstream.metrics`).
    pub fn scores_json(&self, tag: &str) -> PathBuf {
        self.evaluation_dir().join(format!("{tag}_scores.json"))
    }

    /// kNN + linear probe on the test folder (or the held-out split).
    pub fn evaluation_json(&self, tag: &str) -> PathBuf {
        self.evaluation_dir().join(format!("{tag}_evaluation.json"))
    }

    pub fn umap_dir(&self) -> PathBuf {
        self.analyses.join("embedding_plots")
    }

    pub fn umap_json(&self, tag: &str) -> PathBuf {
        self.umap_dir().join(format!("{tag}_umap.json"))
    }

    pub fn attention_dir(&self, tag: &str) -> PathBuf {
        self.analyses.join("attention_images").join(tag)
    }

    /// Written last by the attention stage: its presence means the stage is done.
    pub fn attention_manifest(&self, tag: &str) -> PathBuf {
        self.attention_dir(tag).join(ATTENTION_MANIFEST)
    }

    /// The profiling stage's folder for checkpoint `tag` (`downstream.profiling`).
    pub fn profiling_dir(&self, tag: &str) -> PathBuf {
        self.analyses.join("profiling").join(tag)
    }

    /// The screen's cells embedded with `tag` (`trainer embed`'s table; its parts and errors
    /// table beside it).
    pub fn profiling_cells(&self, tag: &str) -> PathBuf {
        self.profiling_dir(tag).join("cells.parquet")
    }

    /// `trainer metrics profile`'s output folder for `tag` (`summary.json`, `index.html`, ...).
    pub fn profile_dir(&self, tag: &str) -> PathBuf {
        self.profiling_dir(tag).join("profile")
    }

    /// Written last by the profiling stage: what was embedded and the recipe run; the stage
    /// is done while it matches the config.
    pub fn profiling_record(&self, tag: &str) -> PathBuf {
        self.profiling_dir(tag).join("profiling.json")
    }

    pub fn report_html(&self) -> PathBuf {
        self.analyses.join("report.html")
    }

    /// The PNGs the report embeds.
    pub fn report_assets(&self) -> PathBuf {
        self.analyses.join("report_assets")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_epochs_only_from_numbered_checkpoints() {
        let epoch = |n: &str| ModelLayout::numbered_epoch(Path::new(n));
        assert_eq!(epoch("/a/checkpoint0007.safetensors"), Some(7));
        assert_eq!(epoch("checkpoint12345.safetensors"), Some(12345));
        assert_eq!(epoch("checkpoint.safetensors"), None);
        assert_eq!(epoch("checkpoint.prev.safetensors"), None);
        assert_eq!(epoch("checkpoint0007.pth"), None);
        assert_eq!(epoch("checkpoint-1.safetensors"), None);
    }
}
