//! The `knn` stage: scDINO's global weighted kNN on each checkpoint's features.
use crate::analysis::features::{self, FeatureSet};
use crate::analysis::knn::{self, KnnReport};
use crate::config::Stage;
use crate::data::DataError;
use crate::pipeline::stage::{At, Flow, PipelineStage};
use crate::pipeline::stage_error::StageError;
use crate::pipeline::target::Target;
use crate::plot;
use scdino_base::fs::write_atomic;
use std::path::{Path, PathBuf};

/// The k whose top-1 accuracy is highest (the smallest such k): the confusion matrix shown.
pub fn best_k(report: &KnnReport) -> Option<&knn::KnnKResult> {
    report.results.iter().fold(None, |best, r| match best {
        Some(b) if b.top1_percent >= r.top1_percent => Some(b),
        _ => Some(r),
    })
}

/// scDINO's global weighted kNN on the features of `tag`: `{tag}_knn_metrics.json`,
/// `{tag}_confusion.png`, and `global_kNN.txt` rebuilt from every tag's block in epoch order
/// (scDINO appended; rebuilding keeps reruns from duplicating blocks).
pub fn run_knn(t: &Target, tag: &str) -> Result<KnnReport, StageError> {
    run_knn_on(t, tag, features::read_bundle(&t.files.bundle(tag))?)
}

/// [`run_knn`] on the rows of `set` (the features stage's, or a profile table's).
pub fn run_knn_on(t: &Target, tag: &str, set: FeatureSet) -> Result<KnnReport, StageError> {
    let (checkpoint, checkpoint_epoch) = (set.checkpoint.clone(), set.checkpoint_epoch);
    let input = knn::KnnInput::new(set.features, set.labels)?;
    let cfg = knn::KnnConfig {
        seed: t.cfg.run.seed as u32,
        ks: t.cfg.downstream.knn.k.clone(),
        temperature: t.cfg.downstream.knn.temperature,
        ..knn::KnnConfig::default()
    };
    let mut report = knn::run_global_knn(&input, &cfg)?;
    report.checkpoint = (!checkpoint.is_empty()).then_some(checkpoint);
    report.checkpoint_epoch = checkpoint_epoch;
    for w in &report.warnings {
        tracing::warn!("kNN {tag}: {w}");
    }
    let dir = t.files.knn_dir();
    std::fs::create_dir_all(&dir).map_err(|source| StageError::Io {
        path: dir.clone(),
        source,
    })?;
    if let Some(best) = best_k(&report) {
        plot::confusion_png(
            &t.files.confusion_png(tag),
            &best.confusion,
            &report.classes,
        )?;
    }
    let path = t.files.knn_json(tag);
    write_atomic(&path, report.to_json().as_bytes()).map_err(DataError::writing(&path))?;
    rebuild_global_knn_txt(t)?;
    Ok(report)
}

fn rebuild_global_knn_txt(t: &Target) -> Result<(), StageError> {
    let mut text = String::new();
    for tag in t.feature_tags() {
        let path = t.files.knn_json(&tag);
        if !path.exists() {
            continue;
        }
        let report = read_knn_json(&path)?;
        let run_name = format!(
            "{}/{}_{tag}",
            t.cfg.run_dir().display(),
            t.cfg.model_dir_name(&t.channels)
        );
        text.push_str(&report.txt_block(&run_name));
    }
    let path = t.files.knn_dir().join(knn::GLOBAL_KNN_TXT);
    write_atomic(&path, text.as_bytes()).map_err(DataError::writing(&path))?;
    Ok(())
}

pub fn read_knn_json(path: &Path) -> Result<KnnReport, StageError> {
    crate::pipeline::stage_error::read_json(path)
}

/// The `knn` stage, on rank 0.
pub struct Knn;

impl PipelineStage for Knn {
    fn stage(&self) -> Stage {
        Stage::Knn
    }

    fn about(&self) -> &'static str {
        "scDINO's global weighted kNN on the extracted features (+ per-class metrics)."
    }

    fn inputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.t.files.bundle(at.checkpoint().0)]
    }

    fn outputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.t.files.knn_json(at.checkpoint().0)]
    }

    fn run(&self, at: &At) -> Result<Flow, StageError> {
        run_knn(at.t, at.checkpoint().0)?;
        Ok(Flow::Continue)
    }

    fn reported(&self, at: &At) -> Vec<PathBuf> {
        self.outputs(at)
    }
}
