//! The CHAMMI benchmark score (Chen et al., NeurIPS 2023) on a profile table that carries
//! its dataset and task columns, computed as CHAMMI's own evaluation does it (MorphEm
//! `evaluation.py`/`benchmark.py`), so the numbers can be put next to a paper's:
//!
//! * Each test task is classified by 1-NN (cosine by default, as DiChaViT evaluates; `l2` is
//!   `run_benchmark`'s default) against its dataset's training rows,
//! * except the two leave-one-out tasks, HPA task 3 (by cell type) and CP task 4 (by plate):
//!   there, for each group of the task in turn, the queries are that group's rows and the
//!   reference is the training rows plus the task's rows of the *other* groups (the task's
//!   classes are novel: absent from the training rows, so only the other groups hold them),
//!   predictions pooled over the groups.
//! * A task's score is the macro-F1 over the labels present in its ground truth
//!   (`f1_score(truth, pred, labels=np.unique(truth), average="macro")`).
//! * The summary: WTC = task 2, HPA = mean of tasks 2–3, CP = mean of tasks 2–4, and
//!   `final_score` = their mean = WTC2/3 + (HPA2+HPA3)/6 + (CP2+CP3+CP4)/9.
//!
//! Table convention: the dataset column holds `WTC` (or CHAMMI's folder name `Allen`), `HPA`
//! or `CP`; the task column `train` for the training rows and `task1`…`task4` for the test
//! rows (or CHAMMI's `train_test_split` values `Train`, `Task_one`…`Task_four`).
use std::collections::BTreeMap;

use super::keys::label_codes;
use super::nn::{macro_f1_present, nearest, rows_f64, Metric};
use super::{ProfileTable, ScoringError};

/// Which tasks make each dataset's score.
pub const OFFICIAL: [(&str, &[&str]); 3] = [
    ("WTC", &["task2"]),
    ("HPA", &["task2", "task3"]),
    ("CP", &["task2", "task3", "task4"]),
];

/// Which columns the table has and how to classify.
#[derive(Debug, Clone)]
pub struct ChammiOptions {
    pub dataset: String,
    pub task: String,
    pub label: String,
    /// HPA task 3's leave-one-out groups (CHAMMI's `cell_type`).
    pub hpa_group: String,
    /// CP task 4's leave-one-out groups (CHAMMI's `Plate`).
    pub cp_group: String,
    pub metric: Metric,
}

/// Every task's macro-F1 and the official summary.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChammiScore {
    /// `(dataset, task) -> macro-F1`, every task the table has.
    pub tasks: BTreeMap<String, BTreeMap<String, f64>>,
    /// The leave-one-out tasks' groups, with their own macro-F1.
    pub leave_one_out_groups: BTreeMap<String, Vec<(String, f64)>>,
    pub wtc: f64,
    pub hpa: f64,
    pub cp: f64,
    pub final_score: f64,
    pub metric: Metric,
}

/// `WTC`/`Allen` as `WTC`, other datasets as they are.
fn canonical_dataset(v: &str) -> &str {
    match v {
        "Allen" => "WTC",
        v => v,
    }
}

/// CHAMMI's `Train`, `Task_one`… as `train`, `task1`…; our spelling as it is.
fn canonical_task(v: &str) -> &str {
    match v {
        "Train" => "train",
        "Task_one" => "task1",
        "Task_two" => "task2",
        "Task_three" => "task3",
        "Task_four" => "task4",
        v => v,
    }
}

/// Scores the table (see the module doc).
pub fn chammi(table: &ProfileTable, opts: &ChammiOptions) -> Result<ChammiScore, ScoringError> {
    table.need_rows(2, "the CHAMMI score (training and test rows)")?;
    table.check_finite()?;
    let dataset = table.key_column(&opts.dataset)?;
    let task = table.key_column(&opts.task)?;
    let (truth, _) = label_codes(&table.key_column(&opts.label)?);
    let mut rows: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    for r in 0..table.rows {
        let key = (canonical_dataset(&dataset[r]), canonical_task(&task[r]));
        rows.entry(key).or_default().push(r);
    }
    let mut tasks: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut groups_out = BTreeMap::new();
    for ((ds, t), test) in &rows {
        if *t == "train" {
            continue;
        }
        let train = rows.get(&(*ds, "train")).ok_or_else(|| {
            ScoringError::invalid(
                table,
                format!(
                    "dataset `{ds}` has {t} rows but no `train` rows in {}",
                    opts.task
                ),
            )
        })?;
        let leave_out = match (*ds, *t) {
            ("HPA", "task3") => Some(&opts.hpa_group),
            ("CP", "task4") => Some(&opts.cp_group),
            _ => None,
        };
        let (t_truth, pred) = match leave_out {
            None => {
                let nn = nearest(&rows_f64(table, test), &rows_f64(table, train), opts.metric);
                let pred = nn.iter().map(|&j| truth[train[j]]).collect();
                (test.iter().map(|&r| truth[r]).collect::<Vec<_>>(), pred)
            }
            Some(col) => {
                let (t_truth, pred, per_group) =
                    leave_one_group_out(table, opts, col, test, train, &truth)?;
                groups_out.insert(format!("{ds}/{t}"), per_group);
                (t_truth, pred)
            }
        };
        tasks
            .entry(ds.to_string())
            .or_default()
            .insert(t.to_string(), macro_f1_present(&t_truth, &pred));
    }
    let mut summary = [0.0; 3];
    for (k, (ds, needed)) in OFFICIAL.iter().enumerate() {
        let mut sum = 0.0;
        for t in *needed {
            sum += tasks
                .get(*ds)
                .and_then(|m| m.get(*t))
                .copied()
                .ok_or_else(|| {
                    ScoringError::invalid(
                        table,
                        format!(
                            "the CHAMMI score needs {}={ds} rows with {}={t}",
                            opts.dataset, opts.task
                        ),
                    )
                })?;
        }
        summary[k] = sum / needed.len() as f64;
    }
    Ok(ChammiScore {
        tasks,
        leave_one_out_groups: groups_out,
        wtc: summary[0],
        hpa: summary[1],
        cp: summary[2],
        final_score: summary.iter().sum::<f64>() / 3.0,
        metric: opts.metric,
    })
}

/// Truth and predictions of a leave-one-out task, and each group's own macro-F1.
type Pooled = (Vec<usize>, Vec<usize>, Vec<(String, f64)>);

/// Truth and predictions pooled over the groups of `test` by `column` (in order of first
/// appearance, as pandas' `unique`), each group classified against `train` and the task's
/// other groups; with each group's own macro-F1. A null in `column` is refused on the task's
/// rows only (the other datasets need no value there).
fn leave_one_group_out(
    table: &ProfileTable,
    opts: &ChammiOptions,
    column: &str,
    test: &[usize],
    train: &[usize],
    truth: &[usize],
) -> Result<Pooled, ScoringError> {
    let values = table.column(column)?;
    let mut names: Vec<&str> = vec![];
    let mut group_of = Vec::with_capacity(test.len());
    for &r in test {
        let v = values[r].as_deref().ok_or_else(|| ScoringError::NullKey {
            path: table.path.clone(),
            column: column.to_string(),
            row: r,
        })?;
        let g = names.iter().position(|n| *n == v).unwrap_or_else(|| {
            names.push(v);
            names.len() - 1
        });
        group_of.push(g);
    }
    let (mut t_truth, mut pred, mut per_group) = (vec![], vec![], vec![]);
    for (g, name) in names.iter().enumerate() {
        let held: Vec<usize> = (0..test.len())
            .filter(|&i| group_of[i] == g)
            .map(|i| test[i])
            .collect();
        let reference: Vec<usize> = train
            .iter()
            .copied()
            .chain(
                (0..test.len())
                    .filter(|&i| group_of[i] != g)
                    .map(|i| test[i]),
            )
            .collect();
        let nn = nearest(
            &rows_f64(table, &held),
            &rows_f64(table, &reference),
            opts.metric,
        );
        let p: Vec<usize> = nn.iter().map(|&j| truth[reference[j]]).collect();
        let t: Vec<usize> = held.iter().map(|&r| truth[r]).collect();
        per_group.push((name.to_string(), macro_f1_present(&t, &p)));
        t_truth.extend(t);
        pred.extend(p);
    }
    Ok((t_truth, pred, per_group))
}
