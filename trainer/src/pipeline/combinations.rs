//! The run's table of channel combinations: for every combination and checkpoint, the kNN top-1
//! at each configured k, the linear probe's top-1 and its macro-F1 on the evaluation queries,
//! read from each combination's evaluation JSON. With `model.channels: bag | tokens` every row
//! comes from the same checkpoint (what one adaptive model scores on each subset); with `fixed`
//! each combination's own model. Written next to the run's models, as HTML for people and JSON
//! for scripts, by the pipeline and `trainer report` once the combinations' evaluations exist.
use super::stage_error::StageError;
use super::target::Target;
use crate::config::Config;
use crate::layout::RunLayout;
use std::path::PathBuf;

/// One row: a combination at one checkpoint.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    pub combination: String,
    pub tag: String,
    /// (k, top-1 %) for every configured k.
    pub knn_top1_percent: Vec<(usize, f64)>,
    pub probe_top1_percent: f64,
    pub probe_macro_f1: f64,
    /// Replicate-retrieval mAP and scib batch silhouette (`downstream.metrics`), where
    /// computed.
    pub map: Option<f64>,
    pub batch_silhouette: Option<f64>,
}

/// `(mAP, batch silhouette)` from a checkpoint's scores JSON, where it has them.
fn scores_of(t: &Target, tag: &str) -> (Option<f64>, Option<f64>) {
    let Ok(text) = std::fs::read_to_string(t.files.scores_json(tag)) else {
        return (None, None);
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    (
        v["map"]["mean_map"].as_f64(),
        v["batch"]["silhouette_batch"].as_f64(),
    )
}

/// The rows of every combination's evaluations present now, in combination then epoch order.
pub fn rows(cfg: &Config) -> Result<Vec<Row>, StageError> {
    let mut rows = Vec::new();
    for combination in 0..cfg.channel_sets.len() {
        let t = Target::new(cfg, combination)?;
        let names: Vec<&str> = t
            .channels
            .iter()
            .map(|&c| cfg.data.channel_names[c].as_str())
            .collect();
        for (tag, _) in t.numbered_checkpoints() {
            let path = t.files.evaluation_json(&tag);
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let bad = |what| StageError::IncompleteEvaluation {
                path: path.clone(),
                what,
            };
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| StageError::Json {
                    path: path.clone(),
                    source,
                })?;
            let knn = v["knn"]
                .as_array()
                .ok_or_else(|| bad("no knn list"))?
                .iter()
                .map(|k| {
                    Some((
                        k["k"].as_u64()? as usize,
                        k["scores"]["top1_percent"].as_f64()?,
                    ))
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("a kNN entry without k or top-1"))?;
            let probe = &v["linear_probe"]["scores"];
            let (map, batch_silhouette) = scores_of(&t, &tag);
            rows.push(Row {
                combination: names.join("+"),
                tag,
                knn_top1_percent: knn,
                probe_top1_percent: probe["top1_percent"]
                    .as_f64()
                    .ok_or_else(|| bad("no linear-probe top-1"))?,
                probe_macro_f1: probe["macro_f1"]
                    .as_f64()
                    .ok_or_else(|| bad("no linear-probe macro-F1"))?,
                map,
                batch_silhouette,
            });
        }
    }
    Ok(rows)
}

/// Writes the table (`RunLayout::combinations_html` and `_json`); None when no combination
/// has an evaluation yet.
pub fn write_table(cfg: &Config) -> Result<Option<PathBuf>, StageError> {
    let rows = rows(cfg)?;
    if rows.is_empty() {
        return Ok(None);
    }
    let layout = RunLayout::new(cfg);
    let ks: Vec<usize> = rows[0].knn_top1_percent.iter().map(|(k, _)| *k).collect();
    let mut html = format!(
        "<!doctype html><meta charset=\"utf-8\"><title>{title}</title><h1>{title}</h1>\n<p>model.channels: {mode}; scores on the evaluation queries of each combination ({}).</p>\n<table border=\"1\" cellpadding=\"4\"><tr><th>combination</th><th>checkpoint</th>",
        if cfg.model.channels.is_adaptive() {
            "one checkpoint for every combination"
        } else {
            "each combination's own model"
        },
        title = super::stages::report::esc(&format!("{}: channel combinations", cfg.run.name)),
        mode = cfg.model.channels.name(),
    );
    for k in &ks {
        html.push_str(&format!("<th>{k}-NN top-1 %</th>"));
    }
    html.push_str("<th>linear probe top-1 %</th><th>linear probe macro-F1</th><th>mAP</th><th>batch silhouette</th></tr>\n");
    for r in &rows {
        html.push_str(&format!(
            "<tr><td>{}</td><td>{}</td>",
            super::stages::report::esc(&r.combination),
            super::stages::report::esc(&r.tag)
        ));
        for (_, top1) in &r.knn_top1_percent {
            html.push_str(&format!("<td>{top1:.1}</td>"));
        }
        let opt = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |x| format!("{x:.3}"));
        html.push_str(&format!(
            "<td>{:.1}</td><td>{:.3}</td><td>{}</td><td>{}</td></tr>\n",
            r.probe_top1_percent,
            r.probe_macro_f1,
            opt(r.map),
            opt(r.batch_silhouette)
        ));
    }
    html.push_str("</table>\n");
    let json = serde_json::to_string_pretty(&serde_json::json!({
        "model_channels": cfg.model.channels.name(),
        "rows": rows,
    }))
    .expect("rows serialise");
    let io = |path: PathBuf| move |source| StageError::Io { path, source };
    let (html_path, json_path) = (layout.combinations_html(cfg), layout.combinations_json(cfg));
    scdino_base::fs::write_atomic(&json_path, json.as_bytes()).map_err(io(json_path.clone()))?;
    scdino_base::fs::write_atomic(&html_path, html.as_bytes()).map_err(io(html_path.clone()))?;
    Ok(Some(html_path))
}
