//! The `umap` stage: a 2-D UMAP of each checkpoint's features.
use crate::analysis::features::{self, FeatureSet};
use crate::analysis::umap::{self, UmapParams};
use crate::config::Stage;
use crate::data::DataError;
use crate::pipeline::stage::{At, Flow, PipelineStage};
use crate::pipeline::stage_error::StageError;
use crate::pipeline::target::Target;
use crate::plot;
use scdino_base::fs::write_atomic;
use std::path::PathBuf;

/// What `trainer umap` computed, next to its PNG (the report reads it).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct UmapSummary {
    pub tag: String,
    pub rows: usize,
    pub dim: usize,
    pub n_neighbors: usize,
    pub min_dist: f64,
    pub spread: f64,
    pub epochs: usize,
    pub metric: crate::config::UmapMetric,
    pub seed: u64,
    /// sklearn-compatible trustworthiness at k = `trust_k` on `trust_rows` rows.
    pub trustworthiness: f64,
    pub trust_k: usize,
    pub trust_rows: usize,
    pub png: String,
    pub csv: String,
}

/// 2-D UMAP of the features of `tag`: `embedding_plots/{tag}_umap.{png,csv,json}`.
pub fn run_umap(t: &Target, tag: &str) -> Result<UmapSummary, StageError> {
    run_umap_on(t, tag, features::read_bundle(&t.files.bundle(tag))?)
}

/// [`run_umap`] on the rows of `set` (the features stage's, or a profile table's).
pub fn run_umap_on(t: &Target, tag: &str, set: FeatureSet) -> Result<UmapSummary, StageError> {
    let u = &t.cfg.downstream.umap;
    let rows = set.labels.len();
    let n_neighbors = u.n_neighbors.min(rows.saturating_sub(1));
    if n_neighbors < u.n_neighbors {
        tracing::warn!(
            "UMAP {tag}: only {rows} rows; n_neighbors lowered from {} to {n_neighbors}",
            u.n_neighbors
        );
    }
    let params = UmapParams {
        n_neighbors,
        min_dist: u.min_dist as f32,
        spread: u.spread as f32,
        epochs: u.epochs,
        metric: u.metric,
        seed: t.cfg.run.seed,
        negative_sample_rate: 5,
    };
    let emb = umap::fit(&set.features, &params)?;
    let trust_k = n_neighbors.min(rows.saturating_sub(2) / 2).max(1);
    let (trust, trust_rows) =
        umap::trustworthiness_sample(&set.features, &emb, trust_k, 2000, t.cfg.run.seed)?;
    let mut classes: Vec<String> = set.labels.clone();
    classes.sort();
    classes.dedup();
    let label_idx: Vec<usize> = set
        .labels
        .iter()
        .map(|l| classes.binary_search(l).expect("label present"))
        .collect();
    let dir = t.files.umap_dir();
    let png = dir.join(format!("{tag}_umap.png"));
    // scDINO also writes `pdf_format/epoch{E}_umap.pdf`: the same figure, 14×10 in.
    let pdf = dir.join("pdf_format").join(format!("{tag}_umap.pdf"));
    let dim = set.features.size()[1] as usize;
    plot::scatter_png_and_pdf(
        &png,
        &pdf,
        100.0,
        &plot::ScatterSpec {
            points: &emb,
            labels: &label_idx,
            class_names: &classes,
            title: &format!("CLS Token embedding of {rows} cells with a dimensionality of {dim}"),
            subtitle: &format!(
                "{tag} · n_neighbors={n_neighbors} · min_dist={} · spread={} · epochs={} · \
                 metric={:?} · seed={} · trustworthiness@{trust_k}={trust:.3}",
                u.min_dist, u.spread, u.epochs, u.metric, t.cfg.run.seed
            ),
            width: 1400,
            height: 1000,
        },
    )?;
    let csv_path = dir.join(format!("{tag}_umap.csv"));
    let mut csv = String::from("x,y,label,path\n");
    for ((p, label), path) in emb.iter().zip(&set.labels).zip(&set.paths) {
        csv.push_str(&format!(
            "{},{},{},{}\n",
            p[0],
            p[1],
            csv_field(label),
            csv_field(path)
        ));
    }
    write_atomic(&csv_path, csv.as_bytes()).map_err(DataError::writing(&csv_path))?;
    let summary = UmapSummary {
        tag: tag.to_string(),
        rows,
        dim,
        n_neighbors,
        min_dist: u.min_dist,
        spread: u.spread,
        epochs: u.epochs,
        metric: u.metric,
        seed: t.cfg.run.seed,
        trustworthiness: trust,
        trust_k,
        trust_rows,
        png: png.display().to_string(),
        csv: csv_path.display().to_string(),
    };
    let json = serde_json::to_string_pretty(&summary).expect("serialisable");
    let path = t.files.umap_json(tag);
    write_atomic(&path, json.as_bytes()).map_err(DataError::writing(&path))?;
    Ok(summary)
}

/// RFC 4180 quoting when needed (paths may hold commas or quotes).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The `umap` stage, on rank 0.
pub struct Umap;

impl PipelineStage for Umap {
    fn stage(&self) -> Stage {
        Stage::Umap
    }

    fn about(&self) -> &'static str {
        "2-D UMAP of the features, coloured by class (PNG + CSV + trustworthiness)."
    }

    fn inputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.t.files.bundle(at.checkpoint().0)]
    }

    fn outputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.t.files.umap_json(at.checkpoint().0)]
    }

    fn run(&self, at: &At) -> Result<Flow, StageError> {
        run_umap(at.t, at.checkpoint().0)?;
        Ok(Flow::Continue)
    }

    fn reported(&self, at: &At) -> Vec<PathBuf> {
        self.outputs(at)
    }
}
