//! Metadata columns as integer codes, and rows grouped by them: the pairing rules of copairs
//! (`sameby`/`diffby`) and the per-group scores all compare rows by a few text columns.
use std::collections::HashMap;

use super::{ProfileTable, ScoringError};

/// The columns `names` of a table, each value replaced by a small integer (equal text, equal
/// code), column by column.
#[derive(Debug, Clone)]
pub struct Codes {
    pub names: Vec<String>,
    /// `codes[c][row]`.
    pub codes: Vec<Vec<u32>>,
}

impl Codes {
    /// Codes of `names` in `table`; missing or null columns are errors naming file and column.
    pub fn of(table: &ProfileTable, names: &[String]) -> Result<Self, ScoringError> {
        let mut codes = vec![];
        for name in names {
            let col = table.key_column(name)?;
            let mut seen: HashMap<&str, u32> = HashMap::new();
            codes.push(
                col.iter()
                    .map(|v| {
                        let next = seen.len() as u32;
                        *seen.entry(v.as_str()).or_insert(next)
                    })
                    .collect(),
            );
        }
        Ok(Self {
            names: names.to_vec(),
            codes,
        })
    }

    /// The key of `row` over every column.
    pub fn key(&self, row: usize) -> Vec<u32> {
        self.codes.iter().map(|c| c[row]).collect()
    }

    /// Whether `a` and `b` are equal in every column.
    pub fn all_equal(&self, a: usize, b: usize) -> bool {
        self.codes.iter().all(|c| c[a] == c[b])
    }

    /// Whether `a` and `b` differ in every column (copairs' `diffby`: each column differs).
    pub fn all_differ(&self, a: usize, b: usize) -> bool {
        self.codes.iter().all(|c| c[a] != c[b])
    }
}

/// Rows grouped by their key over `codes`, groups in order of first appearance; one group of
/// every row when there are no columns.
pub fn groups(codes: &Codes, rows: usize) -> Vec<Vec<usize>> {
    if codes.codes.is_empty() {
        return vec![(0..rows).collect()];
    }
    let mut index: HashMap<Vec<u32>, usize> = HashMap::new();
    let mut out: Vec<Vec<usize>> = vec![];
    for r in 0..rows {
        let g = *index.entry(codes.key(r)).or_insert_with(|| {
            out.push(vec![]);
            out.len() - 1
        });
        out[g].push(r);
    }
    out
}

/// Labels of `column` as codes `0..k` in sorted order of their text, with the texts.
pub fn label_codes(values: &[String]) -> (Vec<usize>, Vec<String>) {
    let mut names: Vec<String> = values.to_vec();
    names.sort();
    names.dedup();
    let codes = values
        .iter()
        .map(|v| names.binary_search(v).expect("value is among the names"))
        .collect();
    (codes, names)
}
