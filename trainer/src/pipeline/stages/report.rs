//! `report.html`: one self-contained page per model (every figure embedded as a data URI, so
//! the file can be mailed or opened from a login node without the output tree). It is built
//! only from files the stages wrote (and the dataset's split, which the caller already has),
//! so it can be regenerated at any time. One function per section, in page order.
use super::attention::{self, BesideMaps};
use super::evaluate::read_evaluation;
use super::knn::{best_k, read_knn_json};
use super::umap::UmapSummary;
use crate::analysis::attention::AttentionImage;
use crate::analysis::evaluate::EvaluationReport;
use crate::analysis::knn::KnnReport;
use crate::config::Config;
use crate::config::Stage;
use crate::data::DataError;
use crate::pipeline::stage::{At, Flow, PipelineStage, Scope};
use crate::pipeline::stage_error::read_json;
use crate::pipeline::stage_error::StageError;
use crate::pipeline::target::{Dataset, Target};
use crate::plot::{self, Curve};
use base64::Engine;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn img_tag(path: &Path, alt: &str, width: Option<u32>) -> Result<String, StageError> {
    let bytes = std::fs::read(path).map_err(|source| StageError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    let w = width.map(|w| format!(" width=\"{w}\"")).unwrap_or_default();
    Ok(format!(
        "<img alt=\"{}\" title=\"{}\"{w} src=\"data:image/png;base64,{b64}\">",
        esc(alt),
        esc(alt)
    ))
}

/// Per-epoch values from scDINO's `log.txt` (JSON lines).
#[derive(Debug, Default)]
struct EpochLog {
    epoch: Vec<f64>,
    loss: Vec<f64>,
    lr: Vec<f64>,
    wd: Vec<f64>,
}

fn read_log(path: &Path) -> Result<EpochLog, StageError> {
    let mut log = EpochLog::default();
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(log);
    };
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|source| StageError::LogLine {
                path: path.to_path_buf(),
                line: n + 1,
                source,
            })?;
        let num = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        log.epoch.push(num("epoch"));
        log.loss.push(num("train_loss"));
        log.lr.push(num("train_lr"));
        log.wd.push(num("train_wd"));
    }
    Ok(log)
}

/// The last component of a checkpoint path, for the tables (the full path is in the JSON).
fn file_name(path: &str) -> String {
    std::path::Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |f| f.to_string_lossy().into_owned())
}

/// Writes `{analyses}/report.html` (and the curve PNGs it embeds under `report_assets/`);
/// `dataset` is the dataset `t` trained on, split as training split it.
pub fn write_report(t: &Target, dataset: &Dataset) -> Result<PathBuf, StageError> {
    let mut h = head(&format!(
        "scDINO report: {}",
        t.cfg.model_dir_name(&t.channels)
    ));
    let tags = t.feature_tags();
    let mut page = Page {
        t,
        dataset,
        knn: vec![],
        evaluations: vec![],
        tags,
    };
    for (_, section) in SECTIONS {
        h.push_str(&section(&mut page)?);
    }
    h.push_str(&footer(t.cfg));
    let out = t.files.report_html();
    std::fs::create_dir_all(t.files.analyses()).map_err(|source| StageError::Io {
        path: t.files.analyses().to_path_buf(),
        source,
    })?;
    scdino_base::fs::write_atomic(&out, h.as_bytes()).map_err(DataError::writing(&out))?;
    Ok(out)
}

/// What the sections read: the model, its dataset, the tags with features, and the reports two
/// sections share (read by the first of them).
struct Page<'a> {
    t: &'a Target<'a>,
    dataset: &'a Dataset,
    tags: Vec<String>,
    knn: Vec<(String, KnnReport)>,
    evaluations: Vec<(String, EvaluationReport)>,
}

type Section = fn(&mut Page) -> Result<String, StageError>;

/// The report's sections in page order, each with the stage whose files it shows: a stage's
/// section is a function in this file and its line here.
const SECTIONS: &[(Stage, Section)] = &[
    (Stage::MeanStd, |p| Ok(dataset_section(p.t, p.dataset))),
    (Stage::Train, |p| training_section(p.t)),
    (Stage::Knn, |p| {
        let t = p.t;
        p.knn = read_tagged(&p.tags, |tag| t.files.knn_json(tag), read_knn_json)?;
        Ok(knn_section(&p.knn))
    }),
    (Stage::Evaluate, |p| {
        let t = p.t;
        p.evaluations = read_tagged(&p.tags, |tag| t.files.evaluation_json(tag), read_evaluation)?;
        Ok(evaluation_section(&p.evaluations))
    }),
    (Stage::Evaluate, |p| scores_section(p.t, &p.tags)),
    (Stage::Knn, |p| knn_per_class_section(p.t, &p.knn)),
    (Stage::Profiling, |p| profiling_section(p.t, &p.tags)),
    (Stage::Umap, |p| umap_section(p.t, &p.tags)),
    (Stage::Attention, |p| attention_section(p.t)),
];

/// The `report` stage, on rank 0, once per model: it reads every file the stages before it
/// show ([`At::reported`]).
pub struct Report;

impl PipelineStage for Report {
    fn stage(&self) -> Stage {
        Stage::Report
    }

    fn about(&self) -> &'static str {
        "One self-contained HTML report of the model's training and analyses."
    }

    fn scope(&self) -> Scope {
        Scope::Model
    }

    fn inputs(&self, at: &At) -> Vec<PathBuf> {
        at.reported.to_vec()
    }

    fn outputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.t.files.report_html()]
    }

    fn run(&self, at: &At) -> Result<Flow, StageError> {
        write_report(at.t, at.t.dataset()?)?;
        Ok(Flow::Continue)
    }
}

/// The reports of the `tags` whose file (`path_of`) exists, in tag order.
fn read_tagged<R>(
    tags: &[String],
    path_of: impl Fn(&str) -> PathBuf,
    read: impl Fn(&Path) -> Result<R, StageError>,
) -> Result<Vec<(String, R)>, StageError> {
    tags.iter()
        .filter(|tag| path_of(tag).exists())
        .map(|tag| Ok((tag.clone(), read(&path_of(tag))?)))
        .collect()
}

fn num(v: &serde_json::Value) -> String {
    v.as_f64().map_or_else(|| "–".into(), |x| format!("{x:.3}"))
}

/// The profiling field's scores (`downstream.metrics`, docs/scoring.md): replicate-retrieval
/// mAP and the batch scores of every evaluated checkpoint, next to the shuffled-batch control
/// that says what "no batch effect" reads as; from each tag's `<tag>_scores.json` (tags without one are left out).
pub fn scores_section(t: &Target, tags: &[String]) -> Result<String, StageError> {
    let mut h = String::from("<h2>Profiling scores: replicate retrieval and batch effects</h2>");
    h.push_str(&look(
        "mAP near 1 = images find the other images of their class (across donors where the \
         table has several) before any other class. Batch silhouette: 1 = the donors are mixed \
         within each class; read it against its shuffled control (the same table with the \
         donors shuffled, what no batch effect reads as): a silhouette clearly below the \
         control (by 0.05 or more), or a leave-one-donor-out F1 well below the \
         in-distribution F1, means the embedding separates donors (a batch effect) rather \
         than only biology. On trainer synth data the donors differ by their illumination, \
         which even untrained features separate (the control well above the silhouette); \
         watch whether training closes that gap or widens it.",
    ));
    let mut rows = String::new();
    let mut skipped = String::new();
    for tag in tags {
        let path = t.files.scores_json(tag);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| StageError::Json {
                path: path.clone(),
                source,
            })?;
        let (m, b) = (&v["map"], &v["batch"]);
        let _ = write!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(tag),
            num(&m["mean_map"]),
            num(&m["fraction_retrieved"]),
            num(&b["silhouette_batch"]),
            num(&b["silhouette_batch_shuffled"]),
            num(&b["graph_connectivity"]),
            num(&b["f1_in_distribution"]),
            num(&b["f1_leave_one_batch_out"]),
            num(&b["f1_leave_one_batch_out_shuffled"]),
        );
        for key in ["map_skipped", "batch_skipped"] {
            if let Some(why) = v[key].as_str() {
                let _ = write!(
                    skipped,
                    "<li>{}: {} skipped: {}</li>",
                    esc(tag),
                    &key[..key.len() - 8],
                    esc(why)
                );
            }
        }
    }
    if rows.is_empty() {
        h.push_str(
            "<p>No scores yet (<code>downstream.metrics</code>, written with each evaluation).</p>",
        );
        return Ok(h);
    }
    let _ = write!(
        h,
        "<table id=\"scores\"><tr><th>checkpoint</th><th>mAP</th><th>groups retrieved \
         (q &lt; 0.05)</th><th>batch silhouette</th><th>shuffled control</th><th>graph \
         connectivity</th><th>1-NN F1 in-distribution</th><th>leave-one-batch-out</th>\
         <th>shuffled control</th></tr>{rows}</table>"
    );
    if !skipped.is_empty() {
        let _ = write!(h, "<ul>{skipped}</ul>");
    }
    Ok(h)
}

/// The screen's answer per profiled checkpoint (`downstream.profiling`, docs/scoring.md): each
/// tag's `profile/summary.json` as one row, then the newest one's figures; nothing when the
/// stage is off and never ran.
pub fn profiling_section(t: &Target, tags: &[String]) -> Result<String, StageError> {
    let profiled: Vec<&String> = tags
        .iter()
        .filter(|tag| t.files.profiling_record(tag).exists())
        .collect();
    if profiled.is_empty() && !t.cfg.downstream.profiling.enabled {
        return Ok(String::new());
    }
    let mut h = String::from("<h2>Profiling a screen: replicate retrieval and activity</h2>");
    h.push_str(&look(
        "each row is the recipe run on the screen's cells embedded with that checkpoint: \
         aggregated per well, normalised to the negative controls, features selected. \
         Replicate mAP near 1 = a perturbation's wells find each other on other plates before \
         any other perturbation's; activity mAP near 1 = its wells stand apart from the \
         negative controls; the fraction retrieved is the share of perturbations whose mAP \
         beats random rankings (corrected p below the threshold). In the mAP-vs-p plots the \
         points above the dashed line are retrieved; per plate, a plate far below the others \
         points at a plate effect the normalisation did not remove.",
    ));
    if profiled.is_empty() {
        h.push_str("<p>No profile yet (the <code>profiling</code> stage writes it).</p>");
        return Ok(h);
    }
    h.push_str(
        "<table id=\"profiling\"><tr><th>checkpoint</th><th>cells</th><th>wells</th>\
         <th>features kept</th><th>replicate mAP</th><th>retrieved</th><th>activity mAP</th>\
         <th>retrieved</th></tr>",
    );
    let mut newest = None;
    for tag in profiled {
        let dir = t.files.profile_dir(tag);
        let v: serde_json::Value = read_json(&dir.join("summary.json"))?;
        let steps = v["steps"].as_array().cloned().unwrap_or_default();
        let count = |i: usize, key: &str| steps.get(i).map_or("–".into(), |s| s[key].to_string());
        let task = |name: &str| {
            let m = &v[name]["map"];
            format!(
                "<td>{}</td><td>{}</td>",
                num(&m["mean_map"]),
                num(&m["fraction_retrieved"])
            )
        };
        let _ = write!(
            h,
            "<tr><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td>{}{}</tr>",
            esc(&format!("profiling/{tag}/profile/index.html")),
            esc(tag),
            v["cells_rows"],
            count(0, "rows"),
            count(steps.len().saturating_sub(1), "features"),
            task("replicate"),
            task("activity")
        );
        newest = Some((tag, dir, v));
    }
    h.push_str("</table>");
    if let Some((tag, dir, v)) = newest {
        let _ = write!(
            h,
            "<p>{}: the figures of <code>{}</code>.</p>",
            esc(tag),
            esc(&dir.display().to_string())
        );
        let figures = [
            &v["replicate"]["figure"],
            &v["activity"]["figure"],
            &v["plate_figure"],
        ];
        for name in figures.iter().filter_map(|f| f.as_str()) {
            h.push_str(&img_tag(
                &dir.join(name),
                &format!("{tag} {name}"),
                Some(560),
            )?);
        }
    }
    Ok(h)
}

/// The document head, the style sheet and the title.
fn head(title: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse;margin:.5em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;\
         text-align:right}}th{{background:#f3f3f3}}pre{{background:#f7f7f7;padding:1em;overflow:auto;\
         max-height:30em}}figure{{display:inline-block;margin:4px;text-align:center;font-size:80%}}\
         img{{image-rendering:pixelated}}.look{{background:#eef5ff;border-left:4px solid #5b8def;\
         padding:.4em .8em}}</style></head><body>\n<h1>{}</h1>\n",
        esc(title),
        esc(title)
    )
}

/// The section's one line on what to read from it, so a first-time reader knows what good
/// and bad look like.
fn look(text: &str) -> String {
    format!("<p class=\"look\"><b>What to look at:</b> {text}</p>")
}

/// Images per class, the split, and the channels' mean/std (when computed).
fn dataset_section(t: &Target, dataset: &Dataset) -> String {
    let cfg = t.cfg;
    let index = dataset.source.index();
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for s in &index.samples {
        *counts.entry(s.label.as_str()).or_default() += 1;
    }
    let mut h = String::new();
    let _ = write!(
        h,
        "<h2>Dataset</h2><p>{} images in {} at <code>{}</code>; training split {} images, \
         held-out {} (seed {}).</p>{}<table><tr><th>class</th><th>images</th></tr>",
        index.len(),
        counts.len(),
        esc(&cfg.data.dataset_dir.to_string()),
        dataset.split.train.len(),
        dataset.split.held_out.len(),
        cfg.run.seed,
        look(
            "classes of very different sizes weigh unequally in top-1 accuracy (the \
             evaluation's balanced accuracy and macro-F1 correct for it); a channel whose std \
             is 0 carries no signal."
        )
    );
    for (c, n) in &counts {
        let _ = write!(h, "<tr><td>{}</td><td>{n}</td></tr>", esc(c));
    }
    h.push_str("</table>");
    if let Ok(ms) = t.mean_std() {
        h.push_str("<table><tr><th>channel</th><th>mean</th><th>std</th></tr>");
        for (i, name) in cfg.data.channel_names.iter().enumerate() {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{:.4}</td><td>{:.4}</td></tr>",
                esc(name),
                ms.mean.get(i).copied().unwrap_or(f64::NAN),
                ms.std.get(i).copied().unwrap_or(f64::NAN)
            );
        }
        h.push_str("</table>");
    }
    h
}

/// The epoch curves of `log.txt` (written as PNGs next to the report) and their table.
fn training_section(t: &Target) -> Result<String, StageError> {
    let log = read_log(&t.files.log())?;
    let mut h = String::from("<h2>Training</h2>");
    h.push_str(&look(&format!(
        "the loss falls, then flattens. A loss that stays at ln(out_dim) = {:.2} is uniform \
         collapse, one that falls towards 0 while kNN does not improve is one prototype taking \
         over (docs/troubleshooting.md); lr warms up, then decays.",
        (t.cfg.model.out_dim as f64).ln()
    )));
    if log.epoch.is_empty() {
        h.push_str("<p>No <code>log.txt</code> yet.</p>");
        return Ok(h);
    }
    let assets = t.files.report_assets();
    for (name, values, log_y) in [
        ("loss", &log.loss, false),
        ("lr", &log.lr, true),
        ("wd", &log.wd, false),
    ] {
        let path = assets.join(format!("train_{name}.png"));
        let points = log
            .epoch
            .iter()
            .copied()
            .zip(values.iter().copied())
            .collect();
        plot::lines_png(
            &path,
            &format!("train_{name} (epoch mean)"),
            "epoch",
            &[Curve {
                name: name.to_string(),
                points,
            }],
            log_y,
        )?;
        h.push_str(&img_tag(&path, &format!("train_{name}"), Some(590))?);
    }
    h.push_str("<table><tr><th>epoch</th><th>loss</th><th>lr</th><th>wd</th></tr>");
    for i in 0..log.epoch.len() {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{:.4}</td><td>{:.3e}</td><td>{:.4}</td></tr>",
            log.epoch[i], log.loss[i], log.lr[i], log.wd[i]
        );
    }
    h.push_str("</table>");
    Ok(h)
}

/// The weighted kNN accuracies of every checkpoint, one row each.
fn knn_section(reports: &[(String, KnnReport)]) -> String {
    let mut h = String::from("<h2>Weighted kNN (held-out split)</h2>");
    let classes = reports.last().map_or(0, |(_, r)| r.classes.len());
    h.push_str(&look(&format!(
        "top-1 rising from the first checkpoint (barely trained) to the last; chance is \
         1/{classes}. A score that falls over training points at collapse."
    )));
    let Some((_, first)) = reports.first() else {
        h.push_str("<p>No kNN results yet.</p>");
        return h;
    };
    let _ = write!(
        h,
        "<p>{} held-out feature rows: {} as kNN train, {} as test (seed {}, T = {}).</p>\
         <table id=\"knn\"><tr><th>checkpoint</th><th>from file</th>",
        first.n_samples, first.n_train, first.n_test, first.seed, first.temperature
    );
    for r in &first.results {
        let _ = write!(h, "<th>{}-NN top-1</th><th>top-2</th>", r.k);
    }
    h.push_str("</tr>");
    for (tag, rep) in reports {
        let from = match (&rep.checkpoint, rep.checkpoint_epoch) {
            (Some(c), Some(e)) => format!("{} ({e} epochs done)", file_name(c)),
            (Some(c), None) => file_name(c),
            _ => "?".to_string(),
        };
        let _ = write!(h, "<tr><td>{}</td><td>{}</td>", esc(tag), esc(&from));
        for r in &rep.results {
            let _ = write!(
                h,
                "<td>{:.1}</td><td>{:.1}</td>",
                r.top1_percent, r.top2_percent
            );
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    h
}

/// kNN and linear probe on the test folder (or the held-out split) for every checkpoint,
/// then the newest checkpoint's probe per class.
fn evaluation_section(evaluations: &[(String, EvaluationReport)]) -> String {
    let mut h = String::from("<h2>Evaluation: kNN and linear probe</h2>");
    h.push_str(&look(
        "the scores on images training never saw, against chance (one over the number of \
         classes); the linear probe usually scores at or above kNN, and macro-F1 below top-1 \
         means small classes are missed.",
    ));
    let Some((_, first)) = evaluations.first() else {
        h.push_str("<p>No evaluation yet (<code>trainer evaluate</code>).</p>");
        return h;
    };
    let _ = write!(
        h,
        "<p>{} training images → {} queries from the {}; kNN T = {}; linear probe = \
         multinomial logistic regression on frozen CLS features, L2 chosen on a validation \
         split. Percentages unrounded.</p><table id=\"evaluation\"><tr><th>checkpoint</th>\
         <th>epoch</th><th>method</th><th>top-1</th><th>top-5</th><th>balanced acc.</th>\
         <th>macro-F1</th></tr>",
        first.n_train,
        first.n_queries,
        esc(&first.queries_from),
        first.knn_temperature
    );
    for (_, e) in evaluations {
        evaluation_rows(&mut h, e);
    }
    h.push_str("</table>");
    if let Some((tag, e)) = evaluations.last() {
        probe_per_class(&mut h, tag, e);
    }
    h
}

/// One row per kNN k and one for the linear probe, of one checkpoint.
fn evaluation_rows(h: &mut String, e: &EvaluationReport) {
    let file = file_name(&e.provenance.checkpoint);
    let epoch = e
        .provenance
        .epoch
        .map_or("?".to_string(), |x| x.to_string());
    let rows = e
        .knn
        .iter()
        .map(|k| (format!("{}-NN", k.k), &k.scores))
        .chain(std::iter::once((
            format!("linear probe (λ {:e})", e.linear_probe.l2),
            &e.linear_probe.scores,
        )));
    for (method, s) in rows {
        let _ = write!(
            h,
            "<tr><td title=\"sha256 {}\">{}</td><td>{}</td><td>{}</td><td>{:.3}</td>\
             <td>{:.3}</td><td>{:.3}</td><td>{:.4}</td></tr>",
            esc(&e.provenance.checkpoint_sha256),
            esc(&file),
            esc(&epoch),
            esc(&method),
            s.top1_percent,
            s.top5_percent,
            s.balanced_accuracy_percent,
            s.macro_f1
        );
    }
}

/// The query classes no training image has, and the linear probe's scores per class.
fn probe_per_class(h: &mut String, tag: &str, e: &EvaluationReport) {
    if !e.unseen_classes.is_empty() {
        let list: Vec<String> = e
            .unseen_classes
            .iter()
            .map(|(c, n)| format!("{} ({n})", esc(c)))
            .collect();
        let _ = write!(
            h,
            "<p>Query classes without training images: {}.</p>",
            list.join(", ")
        );
    }
    let _ = write!(
        h,
        "<h3>Linear probe per class, {} (<code>{}</code>)</h3><table id=\"probe-per-class\">\
         <tr><th>class</th><th>support</th><th>precision</th><th>recall</th><th>F1</th></tr>",
        esc(tag),
        esc(&e.provenance.checkpoint)
    );
    for m in &e.linear_probe.scores.per_class {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{:.4}</td><td>{:.4}</td><td>{:.4}</td></tr>",
            esc(&m.class),
            m.support,
            m.precision,
            m.recall,
            m.f1
        );
    }
    h.push_str("</table>");
}

/// The newest checkpoint's kNN per class at its best k, and its confusion matrix.
fn knn_per_class_section(
    t: &Target,
    reports: &[(String, KnnReport)],
) -> Result<String, StageError> {
    let mut h = String::new();
    let Some((tag, best)) = reports
        .last()
        .and_then(|(tag, rep)| best_k(rep).map(|best| (tag, best)))
    else {
        return Ok(h);
    };
    let _ = write!(
        h,
        "<h3>Per class, {} at k = {} (top-1 {:.1} %)</h3><table id=\"per-class\"><tr>\
         <th>class</th><th>support</th><th>precision</th><th>recall</th><th>F1</th></tr>",
        esc(tag),
        best.k,
        best.top1_percent
    );
    for c in &best.per_class {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td></tr>",
            esc(&c.class),
            c.support,
            c.precision,
            c.recall,
            c.f1
        );
    }
    h.push_str("</table>");
    let png = t.files.confusion_png(tag);
    if png.exists() {
        h.push_str(&img_tag(
            &png,
            &format!("confusion matrix {tag}"),
            Some(600),
        )?);
    }
    Ok(h)
}

/// The UMAP of the newest tag that has one.
fn umap_section(t: &Target, tags: &[String]) -> Result<String, StageError> {
    let mut h = String::from("<h2>UMAP</h2>");
    h.push_str(&look(
        "cells of a class together and classes apart. Trustworthiness near 1 means the 2-D \
         map keeps each cell's neighbours; the layout itself changes with the seed.",
    ));
    let Some(tag) = tags
        .iter()
        .rev()
        .find(|tag| t.files.umap_json(tag).exists())
    else {
        h.push_str("<p>No UMAP yet.</p>");
        return Ok(h);
    };
    let u: UmapSummary = read_json(&t.files.umap_json(tag))?;
    let _ = write!(
        h,
        "<p>{} · {} rows · n_neighbors {} · min_dist {} · spread {} · {} epochs · \
         {:?} · seed {} · trustworthiness {:.3} (k = {}, {} rows)</p>",
        esc(tag),
        u.rows,
        u.n_neighbors,
        u.min_dist,
        u.spread,
        u.epochs,
        u.metric,
        u.seed,
        u.trustworthiness,
        u.trust_k,
        u.trust_rows
    );
    h.push_str(&img_tag(
        Path::new(&u.png),
        &format!("UMAP {tag}"),
        Some(1100),
    )?);
    Ok(h)
}

/// The attention maps of the newest checkpoint that has them, and under each image the maps of the
/// same image by the runs of `downstream.attention.beside`.
fn attention_section(t: &Target) -> Result<String, StageError> {
    let mut h = String::from("<h2>Attention maps (last block, CLS token)</h2>");
    h.push_str(&look(
        "heads that attend to the cell, or to parts of it such as the nucleus, rather than \
         to the background or to one corner.",
    ));
    if t.cfg.model.channels.is_adaptive() {
        h.push_str(&look(
            "one map per channel (the CLS attention to that channel's patches, averaged over \
             the heads, each map scaled to its own range): where the model looks in each \
             channel; the percentage under a map is how much of the CLS's attention its \
             patches get. A bag model looks at every channel alone, so each map shows that \
             channel's own objects and its percentage is of that channel's own pass; a tokens \
             model reads the channels in one attention, so the percentages of one image say \
             which channel it reads most, and a channel's map can pick out where its signal \
             is absent, or where another channel's lies (docs/channels.md, \"Reading \
             per-channel attention maps\").",
        ));
    }
    let registers = t.cfg.model.num_register_tokens;
    if registers > 0 {
        let _ = write!(
            h,
            "<p>The model has {registers} register token{} (DINOv2); the maps show the CLS token's attention to the image patches only, without the registers.</p>",
            if registers == 1 { "" } else { "s" }
        );
    }
    let beside = attention::beside_maps(t)?;
    for b in &beside {
        match (&b.tag, &b.missing) {
            (_, Some(why)) => {
                let _ = write!(h, "<p>Beside: {}: {}.</p>", esc(&b.label), esc(why));
            }
            (None, None) => {
                let _ = write!(
                    h,
                    "<p>Beside: {}: no attention maps of these channels yet.</p>",
                    esc(&b.label)
                );
            }
            (Some(tag), None) => {
                let _ = write!(
                    h,
                    "<p>Beside: {}, {}: its maps of the same images under this run's.</p>",
                    esc(&b.label),
                    esc(tag)
                );
            }
        }
    }
    let Some(tag) = attention::attention_tags(t).pop() else {
        h.push_str("<p>No attention maps yet.</p>");
        return Ok(h);
    };
    let tag = tag.as_str();
    let dir = t.files.attention_dir(tag);
    let images: Vec<AttentionImage> = read_json(&t.files.attention_manifest(tag))?;
    let _ = write!(h, "<p>{}</p>", esc(tag));
    let this = format!("this run, {}", t.cfg.model_dir_name(&t.channels));
    for img in &images {
        let _ = write!(
            h,
            "<h4>{} / {} ({} px)</h4>",
            esc(&img.class),
            esc(&img.file),
            img.size
        );
        let shown: Vec<&BesideMaps> = beside.iter().filter(|b| b.tag.is_some()).collect();
        if !shown.is_empty() {
            let _ = write!(h, "<p><em>{}, {}</em></p>", esc(&this), esc(tag));
        }
        figures(&mut h, &dir, img)?;
        for b in shown {
            let _ = write!(
                h,
                "<p><em>{}, {}</em></p>",
                esc(&b.label),
                esc(b.tag.as_deref().unwrap_or_default())
            );
            match b.of(img) {
                Some(other) => figures(&mut h, &b.dir, other)?,
                None => h.push_str(
                    "<p>not among its maps (it picked other images: another seed, split or \
                     images_per_class).</p>",
                ),
            }
        }
    }
    Ok(h)
}

/// One image's channel and map PNGs in a row, captioned with their file names and each map
/// with its share of the CLS token's attention.
fn figures(h: &mut String, dir: &Path, img: &AttentionImage) -> Result<(), StageError> {
    h.push_str("<div>");
    let shares = (img.map_shares.len() == img.head_pngs.len()).then_some(&img.map_shares);
    let maps = img
        .head_pngs
        .iter()
        .enumerate()
        .map(|(i, rel)| (rel, shares.map(|s| s[i])));
    for (rel, share) in img.channel_pngs.iter().map(|rel| (rel, None)).chain(maps) {
        let name = Path::new(rel)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let caption = match share {
            Some(share) => format!("{name} · {:.1} %", 100.0 * share),
            None => name.clone(),
        };
        let _ = write!(
            h,
            "<figure>{}<figcaption>{}</figcaption></figure>",
            img_tag(&dir.join(rel), &name, Some(128))?,
            esc(&caption)
        );
    }
    h.push_str("</div>");
    Ok(())
}

/// The resolved config and the trainer's version, and the end of the document.
fn footer(cfg: &Config) -> String {
    format!(
        "<h2>Configuration</h2><pre>{}</pre>\n<p>trainer {}</p></body></html>\n",
        esc(&cfg.to_yaml()),
        env!("CARGO_PKG_VERSION")
    )
}
