//! `trainer metrics profile`: the profiling field's recipe, single cells to a screen's answer,
//! as one command. Each step is this crate's implementation of the pycytominer/copairs call
//! the field makes by hand (aggregate → normalize → feature_select → optional spherize →
//! mAP of replicate retrieval and of phenotypic activity), so the run equals those calls
//! made one after another; every intermediate table is written, so any step can be checked
//! or picked up by other tools, and one JSON summary, three figures and one HTML page say
//! what the screen shows.
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::aggregate::{self, AggregateOptions};
use super::map::{self, MapOptions, MapRow, PairRules};
use super::normalize::{self, Method, NormalizeOptions};
use super::plots::{self, Chart};
use super::recipe::Recipe;
use super::summary::{self, MapSummary};
use super::table::write_profiles;
use super::{select, ProfileTable, ScoringError};

/// One written step.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub step: &'static str,
    pub file: String,
    pub rows: usize,
    pub features: usize,
}

/// One mAP task's answer.
#[derive(Debug, Clone, Serialize)]
pub struct TaskSummary {
    pub map: MapSummary,
    /// The pairing rules used.
    pub pos_sameby: Vec<String>,
    pub pos_diffby: Vec<String>,
    pub neg_sameby: Vec<String>,
    pub neg_diffby: Vec<String>,
    /// Mean AP of each plate's wells (wells with a positive pair).
    pub map_per_plate: Vec<(String, f64)>,
    pub ap_file: String,
    pub map_file: String,
    pub figure: String,
}

/// What `summary.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileSummary {
    pub cells: PathBuf,
    pub cells_rows: usize,
    pub recipe: Recipe,
    pub steps: Vec<Step>,
    pub replicate: Option<TaskSummary>,
    pub activity: Option<TaskSummary>,
    pub plate_figure: Option<String>,
    pub html: String,
}

/// Runs `recipe` (read from `recipe_path`; `None`: the defaults) on the single-cell table
/// `cells`, writing into `out_dir`. A relative blocklist path is relative to the recipe file.
pub fn profile(
    cells: &Path,
    recipe: &Recipe,
    recipe_path: Option<&Path>,
    out_dir: &Path,
) -> Result<ProfileSummary, ScoringError> {
    let bad_recipe = |what: String| ScoringError::Invalid {
        path: recipe_path
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("the default recipe")),
        what,
    };
    let recipe_dir = recipe_path
        .and_then(Path::parent)
        .unwrap_or_else(|| Path::new("."));
    recipe.check().map_err(&bad_recipe)?;
    std::fs::create_dir_all(out_dir).map_err(|source| ScoringError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let mut steps = vec![];
    let file = |name: &str| out_dir.join(name);

    let agg = aggregate::aggregate(
        cells,
        &AggregateOptions {
            strata: recipe.aggregate.strata.clone(),
            keep: recipe.keep(),
            features: recipe.aggregate.features.clone(),
            operation: recipe.aggregate.operation,
        },
    )?;
    let path = file("aggregated.parquet");
    agg.write(&path)?;
    let mut table = agg.to_table(&path);
    steps.push(step("aggregate", &path, &table));

    let samples = recipe
        .samples(&recipe.normalize.samples, "normalize.samples")
        .map_err(&bad_recipe)?;
    let path = file("normalized.parquet");
    table = renamed(
        normalize::normalize(
            &table,
            &NormalizeOptions {
                method: recipe.normalize.method,
                controls: samples,
                by: recipe.normalize.by.clone(),
                spherize_method: normalize::SpherizeMethod::ZcaCor,
                spherize_epsilon: 1e-6,
                mad_epsilon: recipe.normalize.mad_robustize_epsilon,
            },
        )?,
        &path,
    );
    write(&path, &table)?;
    steps.push(step("normalize", &path, &table));

    let path = file("feature_selected.parquet");
    table = renamed(
        select::keep_features(&table, &selected(&table, recipe, recipe_dir, &bad_recipe)?),
        &path,
    );
    if table.dim() == 0 {
        return Err(ScoringError::invalid(
            &table,
            "feature selection kept no feature: nothing is left to profile",
        ));
    }
    write(&path, &table)?;
    steps.push(step("feature_select", &path, &table));

    if let Some(sph) = &recipe.spherize {
        let samples = recipe
            .samples(&sph.samples, "spherize.samples")
            .map_err(&bad_recipe)?;
        let path = file("spherized.parquet");
        table = renamed(
            normalize::normalize(
                &table,
                &NormalizeOptions {
                    method: Method::Spherize,
                    controls: samples,
                    by: sph.by.clone(),
                    spherize_method: sph.method,
                    spherize_epsilon: sph.epsilon,
                    mad_epsilon: 0.0,
                },
            )?,
            &path,
        );
        write(&path, &table)?;
        steps.push(step("spherize", &path, &table));
    }

    let plate = recipe.plate.as_str();
    let (replicate, activity) = map_tasks(&table, recipe, out_dir, &bad_recipe)?;
    let tasks: Vec<(&str, &TaskSummary)> = [("replicate", &replicate), ("activity", &activity)]
        .into_iter()
        .filter_map(|(n, t)| t.as_ref().map(|t| (n, t)))
        .collect();
    let plate_figure = plate_figure(&tasks, plate, out_dir)?;
    let summary = ProfileSummary {
        cells: cells.to_path_buf(),
        cells_rows: agg.cells,
        recipe: recipe.clone(),
        steps,
        replicate,
        activity,
        plate_figure,
        html: "index.html".into(),
    };
    let text = serde_json::to_string_pretty(&summary).expect("the summary serialises");
    write_file(&file("summary.json"), text.as_bytes())?;
    write_file(&file("index.html"), html(&summary).as_bytes())?;
    tracing::info!("profiled {}: {}", cells.display(), out_dir.display());
    Ok(summary)
}

/// The recipe's mAP tasks on the final table: replicate retrieval and phenotypic activity
/// against the negative controls, each when enabled.
fn map_tasks(
    table: &ProfileTable,
    recipe: &Recipe,
    out_dir: &Path,
    bad_recipe: &dyn Fn(String) -> ScoringError,
) -> Result<(Option<TaskSummary>, Option<TaskSummary>), ScoringError> {
    let opts = MapOptions {
        null_size: recipe.map.null_size,
        threshold: recipe.map.threshold,
        seed: recipe.map.seed,
    };
    let replicate = if recipe.map.replicate.enabled {
        Some(task(
            "replicate",
            "Replicate retrieval across plates",
            table,
            &recipe.replicate_rules(),
            recipe,
            opts,
            out_dir,
        )?)
    } else {
        None
    };
    let activity = if recipe.map.activity.enabled {
        let mut t = table.clone();
        let (c, v) = recipe.negcon_selection().map_err(bad_recipe)?;
        map::assign_reference_index(&mut t, &c, &v)?;
        Some(task(
            "activity",
            "Phenotypic activity against negative controls",
            &t,
            &recipe.activity_rules(),
            recipe,
            opts,
            out_dir,
        )?)
    } else {
        None
    };
    Ok((replicate, activity))
}

/// The features `recipe.feature_select` keeps of `table`.
fn selected(
    table: &ProfileTable,
    recipe: &Recipe,
    recipe_dir: &Path,
    bad_recipe: &dyn Fn(String) -> ScoringError,
) -> Result<Vec<String>, ScoringError> {
    let s = &recipe.feature_select;
    let blocklist = match &s.blocklist {
        Some(p) => select::read_blocklist(&recipe_dir.join(p))?,
        None if s.operations.contains(&select::Operation::Blocklist) => return Err(bad_recipe(
            "feature_select: the blocklist operation needs feature_select.blocklist (a CSV file)"
                .into(),
        )),
        None => vec![],
    };
    select::select(
        table,
        &select::SelectOptions {
            operations: s.operations.clone(),
            min_variance: s.min_variance,
            freq_cut: s.freq_cut,
            unique_cut: s.unique_cut,
            corr_threshold: s.corr_threshold,
            na_cutoff: s.na_cutoff,
            blocklist,
        },
    )
}

/// `map_per_plate.png`: each task's mean AP per plate; `None` when no task ran.
fn plate_figure(
    tasks: &[(&str, &TaskSummary)],
    plate: &str,
    out_dir: &Path,
) -> Result<Option<String>, ScoringError> {
    if tasks.is_empty() {
        return Ok(None);
    }
    let mut plates: Vec<String> = tasks
        .iter()
        .flat_map(|(_, t)| t.map_per_plate.iter().map(|(p, _)| p.clone()))
        .collect();
    plates.sort();
    plates.dedup();
    let mut points = vec![];
    for (k, (_, t)) in tasks.iter().enumerate() {
        for (p, m) in &t.map_per_plate {
            let x = plates.binary_search(p).unwrap_or(0) as f64;
            points.push((x, *m, k));
        }
    }
    let name = "map_per_plate.png";
    plots::scatter(
        &out_dir.join(name),
        &Chart {
            title: "Mean AP per plate",
            x_label: plate,
            y_label: "mean average precision",
            points: &points,
            classes: &tasks.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>(),
            x_names: Some(&plates),
            y_line: None,
        },
    )?;
    Ok(Some(name.to_string()))
}

/// The table named after the file it is written to (its errors then name that file).
fn renamed(mut t: ProfileTable, path: &Path) -> ProfileTable {
    t.path = path.to_path_buf();
    t
}

fn write(path: &Path, t: &ProfileTable) -> Result<(), ScoringError> {
    write_profiles(path, &t.meta, &t.feature_names, &t.features)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ScoringError> {
    scdino_base::fs::write_atomic(path, bytes).map_err(|source| ScoringError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn step(name: &'static str, path: &Path, t: &ProfileTable) -> Step {
    Step {
        step: name,
        file: path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        rows: t.rows,
        features: t.dim(),
    }
}

/// One mAP task: AP and mAP tables, the mAP-vs-p figure, the per-plate means.
fn task(
    name: &str,
    title: &str,
    table: &ProfileTable,
    rules: &PairRules,
    recipe: &Recipe,
    opts: MapOptions,
    out_dir: &Path,
) -> Result<TaskSummary, ScoringError> {
    let map_by = vec![recipe.perturbation.clone()];
    let (ap, rows, summary) =
        summary::map_summary(table, rules, &map_by, opts).map_err(|e| match e {
            ScoringError::Invalid { path, what } => ScoringError::Invalid {
                path,
                what: format!(
                    "map.{name} ({title}): {what} (change its pairing columns in the recipe, or set map.{name}.enabled: false)"
                ),
            },
            other => other,
        })?;
    let ap_file = format!("{name}_ap.parquet");
    let map_file = format!("{name}_map.parquet");
    map::write_ap_table(&out_dir.join(&ap_file), table, &ap)?;
    map::write_map_table(&out_dir.join(&map_file), &map_by, &rows)?;
    let plates = table.column(&recipe.plate)?;
    let mut per_plate: std::collections::BTreeMap<String, (f64, usize)> = Default::default();
    for (r, a) in ap.iter().enumerate() {
        if a.average_precision.is_nan() || a.n_pos_pairs == 0 {
            continue;
        }
        let e = per_plate
            .entry(plates[r].clone().unwrap_or_default())
            .or_default();
        e.0 += a.average_precision;
        e.1 += 1;
    }
    let figure = format!("{name}_map_vs_p.png");
    let points: Vec<plots::Point> = rows
        .iter()
        .map(|r: &MapRow| {
            (
                r.mean_average_precision,
                -r.p_value.log10(),
                usize::from(!r.below_corrected_p),
            )
        })
        .collect();
    let classes = [
        format!("corrected p < {}", opts.threshold),
        format!("corrected p ≥ {}", opts.threshold),
    ];
    plots::scatter(
        &out_dir.join(&figure),
        &Chart {
            title,
            x_label: &format!("mean average precision per {}", recipe.perturbation),
            y_label: "-log10 p-value",
            points: &points,
            classes: &classes,
            x_names: None,
            y_line: Some(-opts.threshold.log10()),
        },
    )?;
    Ok(TaskSummary {
        map: summary,
        pos_sameby: rules.pos_sameby.clone(),
        pos_diffby: rules.pos_diffby.clone(),
        neg_sameby: rules.neg_sameby.clone(),
        neg_diffby: rules.neg_diffby.clone(),
        map_per_plate: per_plate
            .into_iter()
            .map(|(p, (s, n))| (p, s / n as f64))
            .collect(),
        ap_file,
        map_file,
        figure,
    })
}

/// A recipe value as the recipe file spells it.
fn name<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v)
        .unwrap_or_default()
        .trim_matches('"')
        .to_string()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The one-page report: steps, answers, figures, links to every table.
fn html(s: &ProfileSummary) -> String {
    let mut h = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Profiling</title>\
         <style>body{font-family:sans-serif;max-width:960px;margin:2em auto}\
         table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}\
         img{max-width:100%}</style></head><body>",
    );
    h += &format!(
        "<h1>Profiling {}</h1><p>{} cells. Recipe: aggregate ({} by {}) → normalize ({} per {}, fitted on {}) → feature_select ({}){} → mAP (copairs).</p>",
        escape(&s.cells.display().to_string()),
        s.cells_rows,
        name(&s.recipe.aggregate.operation),
        escape(&s.recipe.aggregate.strata.join(", ")),
        name(&s.recipe.normalize.method),
        escape(&s.recipe.normalize.by.join(", ")),
        escape(&s.recipe.normalize.samples),
        escape(
            &s.recipe
                .feature_select
                .operations
                .iter()
                .map(name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        if s.recipe.spherize.is_some() {
            " → spherize"
        } else {
            ""
        }
    );
    h += "<h2>Steps</h2><table><tr><th>step</th><th>table</th><th>rows</th><th>features</th></tr>";
    for st in &s.steps {
        h += &format!(
            "<tr><td>{}</td><td><a href=\"{f}\">{f}</a></td><td>{}</td><td>{}</td></tr>",
            st.step,
            st.rows,
            st.features,
            f = escape(&st.file)
        );
    }
    h += "</table>";
    for (title, t) in [
        ("Replicate retrieval", &s.replicate),
        ("Phenotypic activity", &s.activity),
    ] {
        let Some(t) = t else { continue };
        h += &format!(
            "<h2>{title}</h2><p>mean mAP <b>{:.4}</b>; fraction retrieved (corrected p &lt; {}) <b>{:.4}</b> of {} groups. \
             Positives: same {}{}; negatives: different {}{}. \
             Tables: <a href=\"{ap}\">{ap}</a>, <a href=\"{mp}\">{mp}</a>.</p><img src=\"{fig}\" alt=\"{title}\">",
            t.map.mean_map,
            t.map.threshold,
            t.map.fraction_retrieved,
            t.map.groups,
            escape(&t.pos_sameby.join(", ")),
            if t.pos_diffby.is_empty() {
                String::new()
            } else {
                format!(", different {}", escape(&t.pos_diffby.join(", ")))
            },
            escape(&t.neg_diffby.join(", ")),
            if t.neg_sameby.is_empty() {
                String::new()
            } else {
                format!(", same {}", escape(&t.neg_sameby.join(", ")))
            },
            ap = escape(&t.ap_file),
            mp = escape(&t.map_file),
            fig = escape(&t.figure),
        );
    }
    if let Some(f) = &s.plate_figure {
        h += &format!(
            "<h2>Per plate</h2><img src=\"{f}\" alt=\"mean AP per plate\">",
            f = escape(f)
        );
    }
    h += &format!(
        "<p>{}</p><p>Summary: <a href=\"summary.json\">summary.json</a></p></body></html>\n",
        escape(summary::READ_MAP)
    );
    h
}
