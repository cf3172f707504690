//! The CHAMMI benchmark score (Chen et al., NeurIPS 2023) on a profile table that carries
//! its dataset and task columns: each task of each dataset is scored by a cosine 1-NN
//! classifier fitted on that dataset's training rows, as macro-F1 of the label. The official
//! summary: WTC = task 2, HPA = mean of tasks 2–3, CP = mean of tasks 2–4 (the
//! out-of-distribution tasks), final = the mean of the three.
//!
//! Table convention: `Metadata_Dataset` is `WTC`, `HPA` or `CP`; `Metadata_Task` is `train`
//! for the training rows and `task1`…`task4` for the test rows; the label column is given.
use std::collections::BTreeMap;

use super::keys::label_codes;
use super::nn::{macro_f1, nearest_cosine, rows_f64};
use super::{ProfileTable, ScoringError};

/// Which tasks make each dataset's score.
pub const OFFICIAL: [(&str, &[&str]); 3] = [
    ("WTC", &["task2"]),
    ("HPA", &["task2", "task3"]),
    ("CP", &["task2", "task3", "task4"]),
];

/// Every task's macro-F1 and the official summary.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChammiScore {
    /// `(dataset, task) -> macro-F1`, every task the table has.
    pub tasks: BTreeMap<String, BTreeMap<String, f64>>,
    pub wtc: f64,
    pub hpa: f64,
    pub cp: f64,
    pub final_score: f64,
}

/// Scores the table (`dataset_col`, `task_col`, `label_col` as above).
pub fn chammi(
    table: &ProfileTable,
    dataset_col: &str,
    task_col: &str,
    label_col: &str,
) -> Result<ChammiScore, ScoringError> {
    table.need_rows(2, "the CHAMMI score (training and test rows)")?;
    table.check_finite()?;
    let dataset = table.key_column(dataset_col)?;
    let task = table.key_column(task_col)?;
    let (truth, _) = label_codes(&table.key_column(label_col)?);
    let mut rows: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    for r in 0..table.rows {
        rows.entry((&dataset[r], &task[r])).or_default().push(r);
    }
    let mut tasks: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for ((ds, t), test) in &rows {
        if *t == "train" {
            continue;
        }
        let train = rows.get(&(*ds, "train")).ok_or_else(|| {
            ScoringError::invalid(
                table,
                format!("dataset `{ds}` has {t} rows but no `train` rows in {task_col}"),
            )
        })?;
        let nn = nearest_cosine(&rows_f64(table, test), &rows_f64(table, train), false);
        let pred: Vec<usize> = nn.iter().map(|&j| truth[train[j]]).collect();
        let t_truth: Vec<usize> = test.iter().map(|&r| truth[r]).collect();
        tasks
            .entry(ds.to_string())
            .or_default()
            .insert(t.to_string(), macro_f1(&t_truth, &pred));
    }
    let mut summary = [0.0; 3];
    for (k, (ds, needed)) in OFFICIAL.iter().enumerate() {
        let mut sum = 0.0;
        for t in *needed {
            sum +=
                tasks
                    .get(*ds)
                    .and_then(|m| m.get(*t))
                    .copied()
                    .ok_or_else(|| {
                        ScoringError::invalid(
                    table,
                    format!("the CHAMMI score needs {dataset_col}={ds} rows with {task_col}={t}"),
                )
                    })?;
        }
        summary[k] = sum / needed.len() as f64;
    }
    Ok(ChammiScore {
        tasks,
        wtc: summary[0],
        hpa: summary[1],
        cp: summary[2],
        final_score: summary.iter().sum::<f64>() / 3.0,
    })
}
