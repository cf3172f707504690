//! pycytominer 1.7's `consensus` (`operation="median"` or `"mean"`): one profile per
//! replicate group (a perturbation, a well), the median or mean of each feature over the
//! group's rows — the level-5 profiles a screen is scored on. pycytominer computes it as
//! `aggregate(strata=replicate_columns)`: pandas' `groupby(strata, dropna=False)` then
//! `median()`/`mean()`, so NaN values are skipped (a feature NaN on every row of a group is
//! NaN), a null key is a group of its own, sorted after the others, and only the replicate
//! columns and the features are kept. Computed in float64, written as float32.
use std::collections::BTreeMap;

use super::{ProfileTable, ScoringError};

/// How a group's values become one.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "lowercase")]
pub enum Operation {
    Median,
    Mean,
}

/// A group key that sorts as pandas' `groupby(sort=True, dropna=False)` sorts text keys:
/// values in code-point order, nulls last.
type Key = Vec<(bool, String)>;

/// The consensus profiles of `table` by `replicate` (see the module doc): the replicate
/// columns (groups in sorted order of their text, nulls last) and the features.
pub fn consensus(
    table: &ProfileTable,
    replicate: &[String],
    operation: Operation,
) -> Result<ProfileTable, ScoringError> {
    table.need_rows(1, "consensus")?;
    if replicate.is_empty() {
        return Err(ScoringError::invalid(
            table,
            "consensus needs at least one replicate column",
        ));
    }
    let cols = replicate
        .iter()
        .map(|c| table.column(c))
        .collect::<Result<Vec<_>, _>>()?;
    let mut groups: BTreeMap<Key, Vec<usize>> = BTreeMap::new();
    for r in 0..table.rows {
        let key = cols
            .iter()
            .map(|c| match &c[r] {
                Some(v) => (false, v.clone()),
                None => (true, String::new()),
            })
            .collect();
        groups.entry(key).or_default().push(r);
    }
    let d = table.dim();
    let mut features = Vec::with_capacity(groups.len() * d);
    let mut meta: Vec<(String, Vec<Option<String>>)> =
        replicate.iter().map(|c| (c.clone(), vec![])).collect();
    let mut values = Vec::new();
    for (key, rows) in &groups {
        for (m, (null, v)) in meta.iter_mut().zip(key) {
            m.1.push((!null).then(|| v.clone()));
        }
        for j in 0..d {
            values.clear();
            values.extend(
                rows.iter()
                    .map(|&r| f64::from(table.row(r)[j]))
                    .filter(|v| !v.is_nan()),
            );
            features.push(reduce(&mut values, operation) as f32);
        }
    }
    Ok(ProfileTable {
        path: table.path.clone(),
        meta,
        feature_names: table.feature_names.clone(),
        features,
        rows: groups.len(),
        nested: vec![],
    })
}

/// The median (mean of the two middle values for an even count) or mean of `values`; NaN
/// when there are none.
fn reduce(values: &mut [f64], operation: Operation) -> f64 {
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    match operation {
        Operation::Mean => values.iter().sum::<f64>() / n as f64,
        Operation::Median => {
            values.sort_by(f64::total_cmp);
            if n % 2 == 1 {
                values[n / 2]
            } else {
                (values[n / 2 - 1] + values[n / 2]) / 2.0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_even_counts_is_the_mean_of_the_middle_two() {
        assert_eq!(reduce(&mut [3.0, 1.0, 2.0, 10.0], Operation::Median), 2.5);
        assert_eq!(reduce(&mut [3.0], Operation::Median), 3.0);
        assert!(reduce(&mut [], Operation::Mean).is_nan());
    }
}
