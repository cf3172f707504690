//! The scores of one profile table as one JSON document, with the line that says how to read
//! each: what `trainer metrics` prints and the pipeline writes per evaluated checkpoint.
use serde::Serialize;

use super::batch::{self, LogoScores};
use super::map::{self, ApRow, MapOptions, MapRow, PairRules};
use super::{ProfileTable, ScoringError};

/// How to read the replicate-retrieval mAP.
pub const READ_MAP: &str = "mAP: how well a profile retrieves its own group (same label) before the others; 1 = always first, a random embedding gives about the share of positives. Look at the fraction of groups with corrected p < threshold.";
/// How to read the batch scores.
pub const READ_BATCH: &str = "batch: silhouette 1 = batches mixed within each label, lower = the embedding separates by batch; compare with the shuffled-batch control (no batch effect). A leave-one-batch-out F1 well below the in-distribution F1 means labels are recognised through batch.";

/// Replicate-retrieval mAP summary.
#[derive(Debug, Clone, Serialize)]
pub struct MapSummary {
    pub pos_sameby: Vec<String>,
    pub map_by: Vec<String>,
    /// Mean of the groups' mAP.
    pub mean_map: f64,
    /// Share of groups with corrected p-value below the threshold.
    pub fraction_retrieved: f64,
    pub groups: usize,
    pub threshold: f64,
    pub read: &'static str,
}

/// AP, mAP and their summary.
pub fn map_summary(
    table: &ProfileTable,
    rules: &PairRules,
    map_by: &[String],
    opts: MapOptions,
) -> Result<(Vec<ApRow>, Vec<MapRow>, MapSummary), ScoringError> {
    let ap = map::average_precision(table, rules)?;
    let rows = map::mean_average_precision(table, &ap, map_by, opts)?;
    let n = rows.len().max(1) as f64;
    let summary = MapSummary {
        pos_sameby: rules.pos_sameby.clone(),
        map_by: map_by.to_vec(),
        mean_map: rows.iter().map(|r| r.mean_average_precision).sum::<f64>() / n,
        fraction_retrieved: rows.iter().filter(|r| r.below_corrected_p).count() as f64 / n,
        groups: rows.len(),
        threshold: opts.threshold,
        read: READ_MAP,
    };
    Ok((ap, rows, summary))
}

/// Batch-effect summary: the scores with the real batch column and with it shuffled.
#[derive(Debug, Clone, Serialize)]
pub struct BatchSummary {
    pub batch: String,
    pub label: String,
    /// scib batch ASW (NaN → null when no label has two batches).
    pub silhouette_batch: Option<f64>,
    pub silhouette_batch_shuffled: Option<f64>,
    pub silhouette_per_label: Vec<(String, f64)>,
    pub graph_connectivity: f64,
    pub n_neighbors: usize,
    pub f1_in_distribution: f64,
    pub f1_leave_one_batch_out: f64,
    pub f1_leave_one_batch_out_shuffled: f64,
    pub f1_per_batch: Vec<(String, f64)>,
    pub read: &'static str,
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// Every batch score of `batch_col` for the label `label_col`, and the shuffled control.
pub fn batch_summary(
    table: &ProfileTable,
    batch_col: &str,
    label_col: &str,
    n_neighbors: usize,
    seed: u64,
) -> Result<BatchSummary, ScoringError> {
    table.need_rows(2, "the batch scores")?;
    table.check_finite()?;
    let b = table.key_column(batch_col)?;
    let l = table.key_column(label_col)?;
    table.need_two_values(batch_col, &b, "the batch scores (batches compared)")?;
    table.need_two_values(
        label_col,
        &l,
        "the batch scores (labels recognised across batches)",
    )?;
    let shuffled = batch::shuffled(&b, seed);
    let per_label = batch::silhouette_batch(table, &b, &l);
    let logo: LogoScores = batch::logo_f1(table, &l, &b)?;
    let logo_shuffled = batch::logo_f1(table, &l, &shuffled)?;
    Ok(BatchSummary {
        batch: batch_col.into(),
        label: label_col.into(),
        silhouette_batch: finite(batch::mean_score(&per_label)),
        silhouette_batch_shuffled: finite(batch::mean_score(&batch::silhouette_batch(
            table, &shuffled, &l,
        ))),
        silhouette_per_label: per_label,
        graph_connectivity: batch::graph_connectivity(table, &l, n_neighbors)?,
        n_neighbors,
        f1_in_distribution: logo.in_distribution,
        f1_leave_one_batch_out: logo.leave_one_group_out,
        f1_leave_one_batch_out_shuffled: logo_shuffled.leave_one_group_out,
        f1_per_batch: logo.per_group,
        read: READ_BATCH,
    })
}

/// The scores the pipeline computes for one checkpoint (`downstream.metrics`): each present,
/// or skipped with the reason (a column the table lacks, one batch only).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PipelineScores {
    pub map: Option<MapSummary>,
    pub map_skipped: Option<String>,
    pub batch: Option<BatchSummary>,
    pub batch_skipped: Option<String>,
}

/// What `downstream.metrics` asks for.
#[derive(Debug, Clone)]
pub struct PipelineRequest {
    pub label: String,
    pub batch: String,
    pub null_size: usize,
    pub n_neighbors: usize,
    pub seed: u64,
}

/// Replicate-retrieval mAP (across batches where the table has two or more) and the batch
/// scores of `table`, on the rows that have a batch value.
pub fn pipeline_scores(table: &ProfileTable, req: &PipelineRequest) -> PipelineScores {
    let mut out = PipelineScores::default();
    let batch_rows: Option<Vec<usize>> = table.column(&req.batch).ok().map(|b| {
        (0..table.rows)
            .filter(|&r| b[r].as_deref().is_some_and(|v| !v.is_empty()))
            .collect()
    });
    let batches = |t: &ProfileTable| -> usize {
        let mut v: Vec<&Option<String>> = t
            .column(&req.batch)
            .map(|c| c.iter().collect())
            .unwrap_or_default();
        v.sort();
        v.dedup();
        v.len()
    };
    let with_batch = batch_rows.map(|rows| table.subset(&rows));
    let across = with_batch.as_ref().filter(|t| batches(t) >= 2);
    let rules = PairRules {
        pos_sameby: vec![req.label.clone()],
        pos_diffby: across.map(|_| vec![req.batch.clone()]).unwrap_or_default(),
        neg_sameby: vec![],
        neg_diffby: vec![req.label.clone()],
    };
    let opts = MapOptions {
        null_size: req.null_size,
        threshold: 0.05,
        seed: req.seed,
    };
    match map_summary(across.unwrap_or(table), &rules, &rules.pos_sameby, opts) {
        Ok((_, _, s)) => out.map = Some(s),
        Err(e) => out.map_skipped = Some(e.to_string()),
    }
    match across {
        None => {
            out.batch_skipped = Some(format!(
                "the table has fewer than two values of `{}`",
                req.batch
            ))
        }
        Some(t) => match batch_summary(
            t,
            &req.batch,
            &req.label,
            req.n_neighbors.min(t.rows),
            req.seed,
        ) {
            Ok(s) => out.batch = Some(s),
            Err(e) => out.batch_skipped = Some(e.to_string()),
        },
    }
    out
}
