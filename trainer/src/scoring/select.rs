//! pycytominer 1.7.1's `feature_select`: operations run in the given order, each on the
//! features the previous ones kept, and the table comes back with the excluded feature
//! columns dropped (the others in their order, metadata kept). Each operation as
//! pycytominer 1.7.1 computes it:
//!
//! * `variance_threshold`: scikit-learn's `VarianceThreshold(min_variance)` — a feature is
//!   kept when its population variance (NaN skipped) is above `min_variance`. (In 1.7 this
//!   is a variance test; the `freq_cut`/`unique_cut` test of pycytominer ≤ 1.6 is
//!   `frequency_threshold`.)
//! * `frequency_threshold`: dropped when the count of the second most frequent value over
//!   the most frequent one is below `freq_cut` (0 when there are fewer than two distinct
//!   values), or when the number of distinct values over the rows is below `unique_cut`
//!   (NaN not counted as a value, but counted in the rows).
//! * `correlation_threshold`: Pearson correlations of every pair (pairwise-complete where
//!   there are NaN); from each pair whose signed correlation is above `corr_threshold`, the
//!   feature with the larger sum of absolute correlations over all features is dropped (all
//!   pairs at once, not greedily). pandas sorts those sums with an unstable sort: on exactly
//!   equal sums this keeps the earlier column first, which pandas may not.
//! * `drop_na_columns`: dropped when the share of NaN is above `na_cutoff`.
//! * `blocklist`: dropped when named in the file's `blocklist` column (pycytominer's
//!   `blocklist_file` format).
use std::collections::HashSet;
use std::path::Path;

use super::{ProfileTable, ScoringError};

/// One operation of `feature_select`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Operation {
    VarianceThreshold,
    FrequencyThreshold,
    CorrelationThreshold,
    DropNaColumns,
    Blocklist,
}

/// pycytominer's parameters (its defaults in the CLI).
#[derive(Debug, Clone)]
pub struct SelectOptions {
    pub operations: Vec<Operation>,
    pub min_variance: f64,
    pub freq_cut: f64,
    pub unique_cut: f64,
    pub corr_threshold: f64,
    pub na_cutoff: f64,
    /// Feature names of the blocklist (the `blocklist` operation).
    pub blocklist: Vec<String>,
}

/// Reads pycytominer's blocklist file: a CSV whose `blocklist` column names features.
pub fn read_blocklist(path: &Path) -> Result<Vec<String>, ScoringError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScoringError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let col = header
        .iter()
        .position(|h| h.trim() == "blocklist")
        .ok_or_else(|| ScoringError::Invalid {
            path: path.to_path_buf(),
            what: "a blocklist file needs a column named `blocklist`".into(),
        })?;
    Ok(lines
        .filter_map(|l| l.split(',').nth(col).map(|v| v.trim().to_string()))
        .filter(|v| !v.is_empty())
        .collect())
}

/// `table` with only the features named in `kept` (in `kept`'s order), metadata unchanged:
/// what `feature_select` returns.
pub fn keep_features(table: &ProfileTable, kept: &[String]) -> ProfileTable {
    let idx: Vec<usize> = kept
        .iter()
        .filter_map(|k| table.feature_names.iter().position(|n| n == k))
        .collect();
    let mut features = Vec::with_capacity(table.rows * idx.len());
    for r in 0..table.rows {
        let row = table.row(r);
        features.extend(idx.iter().map(|&j| row[j]));
    }
    ProfileTable {
        feature_names: idx
            .iter()
            .map(|&j| table.feature_names[j].clone())
            .collect(),
        features,
        ..table.clone()
    }
}

/// The names of the features `feature_select` keeps, in table order.
pub fn select(table: &ProfileTable, opts: &SelectOptions) -> Result<Vec<String>, ScoringError> {
    table.need_rows(2, "feature selection")?;
    let n = table.rows;
    let column = |j: usize| -> Vec<f64> { (0..n).map(|r| f64::from(table.row(r)[j])).collect() };
    let mut kept: Vec<usize> = (0..table.dim()).collect();
    for op in &opts.operations {
        let excluded: HashSet<usize> = match op {
            Operation::VarianceThreshold => kept
                .iter()
                .copied()
                // Kept only above the threshold: a NaN variance (all NaN) is dropped.
                .filter(|&j| {
                    let v = variance(&column(j));
                    v.is_nan() || v <= opts.min_variance
                })
                .collect(),
            Operation::FrequencyThreshold => kept
                .iter()
                .copied()
                .filter(|&j| {
                    let (ratio, distinct) = frequency(&column(j));
                    ratio < opts.freq_cut || (distinct as f64 / n as f64) < opts.unique_cut
                })
                .collect(),
            Operation::DropNaColumns => kept
                .iter()
                .copied()
                .filter(|&j| {
                    column(j).iter().filter(|v| v.is_nan()).count() as f64 / n as f64
                        > opts.na_cutoff
                })
                .collect(),
            Operation::Blocklist => kept
                .iter()
                .copied()
                .filter(|&j| opts.blocklist.contains(&table.feature_names[j]))
                .collect(),
            Operation::CorrelationThreshold => {
                let cols: Vec<Vec<f64>> = kept.iter().map(|&j| column(j)).collect();
                correlated(&cols, opts.corr_threshold)
                    .into_iter()
                    .map(|i| kept[i])
                    .collect()
            }
        };
        kept.retain(|j| !excluded.contains(j));
    }
    if kept.is_empty() {
        return Err(ScoringError::invalid(
            table,
            "feature selection excluded every feature (pycytominer would return the metadata alone)",
        ));
    }
    Ok(kept
        .into_iter()
        .map(|j| table.feature_names[j].clone())
        .collect())
}

/// Population variance with NaN skipped (NaN when every value is NaN).
fn variance(x: &[f64]) -> f64 {
    let v: Vec<f64> = x.iter().copied().filter(|v| !v.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    v.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / v.len() as f64
}

/// pycytominer's `calculate_frequency` (second over first value count, 0 below two
/// distinct values) and the number of distinct values, NaN left out of both.
fn frequency(x: &[f64]) -> (f64, usize) {
    let mut v: Vec<f64> = x.iter().copied().filter(|v| !v.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    let mut counts: Vec<usize> = vec![];
    for (i, a) in v.iter().enumerate() {
        if i > 0 && v[i - 1] == *a {
            *counts.last_mut().expect("a count") += 1;
        } else {
            counts.push(1);
        }
    }
    let distinct = counts.len();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let ratio = if distinct < 2 {
        0.0
    } else {
        counts[1] as f64 / counts[0] as f64
    };
    (ratio, distinct)
}

/// Pearson correlation of `a` and `b` over the rows where both are defined (NaN when fewer
/// than two such rows or a constant side).
fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let pairs: Vec<(f64, f64)> = a
        .iter()
        .zip(b)
        .filter(|(x, y)| !x.is_nan() && !y.is_nan())
        .map(|(x, y)| (*x, *y))
        .collect();
    let n = pairs.len() as f64;
    if pairs.len() < 2 {
        return f64::NAN;
    }
    let (ma, mb) = (
        pairs.iter().map(|p| p.0).sum::<f64>() / n,
        pairs.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in &pairs {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    (sab / (saa * sbb).sqrt()).clamp(-1.0, 1.0)
}

/// Indices of `cols` that `correlation_threshold` drops (see the module doc).
fn correlated(cols: &[Vec<f64>], threshold: f64) -> HashSet<usize> {
    let k = cols.len();
    let mut r = vec![f64::NAN; k * k];
    for i in 0..k {
        for j in 0..=i {
            let c = pearson(&cols[i], &cols[j]);
            r[i * k + j] = c;
            r[j * k + i] = c;
        }
    }
    // Sum of |r| per feature (NaN skipped), and each feature's rank in that order.
    let sums: Vec<f64> = (0..k)
        .map(|i| {
            (0..k)
                .map(|j| r[i * k + j].abs())
                .filter(|v| !v.is_nan())
                .sum()
        })
        .collect();
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&a, &b| sums[a].total_cmp(&sums[b]));
    let mut rank = vec![0; k];
    for (p, &i) in order.iter().enumerate() {
        rank[i] = p;
    }
    let mut out = HashSet::new();
    // pycytominer's pairs: the lower triangle, pair_a the later column, pair_b the earlier.
    for a in 0..k {
        for b in 0..a {
            if r[a * k + b] > threshold {
                out.insert(if rank[a] > rank[b] { a } else { b });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequency_is_second_over_first_count_without_nan() {
        let (ratio, distinct) = frequency(&[1.0, 1.0, 1.0, 2.0, f64::NAN, 3.0, 2.0]);
        assert_eq!((ratio, distinct), (2.0 / 3.0, 3));
        assert_eq!(frequency(&[5.0, 5.0, f64::NAN]), (0.0, 1));
    }
}
