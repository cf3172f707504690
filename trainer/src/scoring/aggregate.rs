//! pycytominer 1.7's `aggregate`: single-cell rows to one profile per stratum (per well by
//! default), the median or mean of each feature, streamed so a table larger than memory
//! aggregates in a small, known footprint.
//!
//! Semantics, as pycytominer computes them: the features are cast to float64; rows are grouped
//! by the strata columns with pandas' `groupby(strata, dropna=False)` (a null stratum value is
//! a group of its own) and the groups come out sorted (`sort=True`: numbers numerically, text
//! in code-point order, nulls last); `median`/`mean` skip NaN (a feature NaN on every row of a
//! group is NaN). The output is the strata columns, `Metadata_Object_Count` (the rows of the
//! group, pycytominer's `compute_object_count=True`) and the features; other metadata is
//! dropped, except the `keep` columns, which must be constant within each group and are carried
//! (what pycytominer's users do by merging the plate map back in). `ImageNumber` and
//! `ObjectNumber` are never features (pycytominer drops them after aggregating).
//!
//! Why streaming works without spill files: Parquet is columnar, so the table is read twice,
//! once for the strata columns (a group id per row) and then one feature column at a time.
//! A column of every row, laid out group after group, is all an exact median needs, so memory
//! is about 12 bytes per row (a row's slot and one float64 value) plus one chunk of
//! [`CHUNK_ROWS`] rows, independent of the number of features: 1M cells × 384 features
//! (1.5 GB of float32) aggregate in tens of megabytes.
use std::cmp::Ordering;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::ColumnDescriptor;

use super::consensus::Operation;
use super::table::{write_table, OutColumn};
use super::{ProfileTable, ScoringError};
use crate::parquet_columns::{numeric, read_leaf_chunks, Leaf, Numeric};

/// Rows read at a time from one column: bounds the transient buffers whatever row-group
/// size the writer chose.
const CHUNK_ROWS: usize = 65_536;

/// The name of the per-group row count (pycytominer's `compute_object_count`).
pub const OBJECT_COUNT: &str = "Metadata_Object_Count";

/// What to aggregate and how.
#[derive(Debug, Clone)]
pub struct AggregateOptions {
    /// Group-by columns (pycytominer's `strata`).
    pub strata: Vec<String>,
    /// Metadata constant within each group, carried into the output.
    pub keep: Vec<String>,
    /// Feature columns by name; `None` infers them (float columns not named `Metadata_*`).
    pub features: Option<Vec<String>>,
    pub operation: Operation,
}

/// The aggregated profiles, one row per group in pandas' sorted order.
#[derive(Debug, Clone)]
pub struct Aggregated {
    /// The table aggregated (named in errors).
    pub path: PathBuf,
    /// Strata columns then `keep` columns, as text (nulls `None`).
    pub meta: Vec<(String, Vec<Option<String>>)>,
    /// Rows per group.
    pub counts: Vec<i64>,
    pub feature_names: Vec<String>,
    /// Row-major `[groups, features]`, float64 as pycytominer returns them.
    pub features: Vec<f64>,
    /// Rows of the input.
    pub cells: usize,
}

impl Aggregated {
    pub fn groups(&self) -> usize {
        self.counts.len()
    }

    /// Writes the table (strata, keep, `Metadata_Object_Count`, float64 features), atomically.
    pub fn write(&self, path: &Path) -> Result<(), ScoringError> {
        let mut columns: Vec<(String, OutColumn)> = self
            .meta
            .iter()
            .map(|(n, v)| (n.clone(), OutColumn::NullableText(v.clone())))
            .collect();
        columns.push((OBJECT_COUNT.into(), OutColumn::Int(self.counts.clone())));
        let d = self.feature_names.len();
        for (j, name) in self.feature_names.iter().enumerate() {
            let col = (0..self.groups())
                .map(|k| self.features[k * d + j])
                .collect();
            columns.push((name.clone(), OutColumn::Double(col)));
        }
        write_table(path, &columns, None)
    }

    /// The profiles as a table for the next steps (float32 features, the count as text
    /// metadata, as reading the written file gives them); `path` names it in their errors.
    pub fn to_table(&self, path: &Path) -> ProfileTable {
        let mut meta = self.meta.clone();
        meta.push((
            OBJECT_COUNT.into(),
            self.counts.iter().map(|c| Some(c.to_string())).collect(),
        ));
        ProfileTable {
            path: path.to_path_buf(),
            meta,
            feature_names: self.feature_names.clone(),
            features: self.features.iter().map(|&v| v as f32).collect(),
            rows: self.groups(),
            nested: vec![],
        }
    }
}

/// A flat column of the file: its leaf index and descriptor.
struct Column {
    name: String,
    leaf: usize,
    desc: std::sync::Arc<ColumnDescriptor>,
}

/// The strata, kept and feature columns `opts` names (or, for features, infers).
struct Chosen<'a> {
    strata: Vec<&'a Column>,
    keep: Vec<&'a Column>,
    features: Vec<&'a Column>,
}

fn choose<'a>(
    flat: &'a [Column],
    opts: &AggregateOptions,
    path: &Path,
) -> Result<Chosen<'a>, ScoringError> {
    let invalid = |what: String| ScoringError::Invalid {
        path: path.to_path_buf(),
        what,
    };
    let is_float = |c: &Column| numeric(&c.desc) == Numeric::Float;
    let find = |name: &str| -> Result<&Column, ScoringError> {
        flat.iter()
            .find(|c| c.name == name)
            .ok_or_else(|| ScoringError::MissingColumn {
                path: path.to_path_buf(),
                column: name.to_string(),
                have: flat
                    .iter()
                    .filter(|c| c.name.starts_with("Metadata_") || !is_float(c))
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    };
    if opts.strata.is_empty() {
        return Err(invalid("aggregate needs at least one strata column".into()));
    }
    let strata = opts
        .strata
        .iter()
        .map(|n| find(n))
        .collect::<Result<Vec<_>, _>>()?;
    let keep = opts
        .keep
        .iter()
        .filter(|n| !opts.strata.contains(n))
        .map(|n| find(n))
        .collect::<Result<Vec<_>, _>>()?;
    let grouping: Vec<&str> = strata
        .iter()
        .chain(&keep)
        .map(|c| c.name.as_str())
        .collect();
    let features: Vec<&Column> = match &opts.features {
        Some(names) => {
            let mut out = vec![];
            for n in names {
                let c = find(n)?;
                if numeric(&c.desc) == Numeric::No {
                    return Err(invalid(format!(
                        "feature column `{n}` is not numeric ({:?}); pycytominer casts features to float",
                        c.desc.physical_type()
                    )));
                }
                if grouping.contains(&n.as_str()) {
                    return Err(invalid(format!(
                        "column `{n}` is both a feature and a strata/keep column"
                    )));
                }
                out.push(c);
            }
            out
        }
        None => flat
            .iter()
            .filter(|c| is_float(c) && !c.name.starts_with("Metadata_"))
            .filter(|c| !grouping.contains(&c.name.as_str()))
            .collect(),
    }
    .into_iter()
    .filter(|c| c.name != "ImageNumber" && c.name != "ObjectNumber")
    .collect();
    if features.is_empty() {
        return Err(ScoringError::NoFeatures {
            path: path.to_path_buf(),
        });
    }
    Ok(Chosen {
        strata,
        keep,
        features,
    })
}

/// Each row's group, numbered in output order (pandas' sorted strata), with the groups'
/// sizes and strata values.
struct Grouped {
    group_of: Vec<u32>,
    counts: Vec<i64>,
    meta: Vec<(String, Vec<Option<String>>)>,
}

fn group_rows(
    reader: &SerializedFileReader<File>,
    strata: &[&Column],
    rows: usize,
) -> Result<Grouped, parquet::errors::ParquetError> {
    let codes = strata
        .iter()
        .map(|c| Dictionary::read(reader, c, rows))
        .collect::<Result<Vec<_>, _>>()?;
    let mut index: HashMap<Vec<u32>, u32> = HashMap::new();
    let mut keys: Vec<Vec<u32>> = vec![];
    let mut group_of = Vec::with_capacity(rows);
    let mut key = Vec::with_capacity(codes.len());
    for r in 0..rows {
        key.clear();
        key.extend(codes.iter().map(|d| d.codes[r]));
        let g = match index.get(&key) {
            Some(&g) => g,
            None => {
                let g = keys.len() as u32;
                index.insert(key.clone(), g);
                keys.push(key.clone());
                g
            }
        };
        group_of.push(g);
    }
    drop(index);
    let groups = keys.len();
    let mut order: Vec<usize> = (0..groups).collect();
    order.sort_by(|&a, &b| {
        codes
            .iter()
            .enumerate()
            .map(|(c, d)| d.compare(keys[a][c], keys[b][c]))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    });
    let mut rank = vec![0u32; groups];
    for (k, &g) in order.iter().enumerate() {
        rank[g] = k as u32;
    }
    let mut counts = vec![0i64; groups];
    for g in group_of.iter_mut() {
        *g = rank[*g as usize];
        counts[*g as usize] += 1;
    }
    let meta = strata
        .iter()
        .zip(&codes)
        .enumerate()
        .map(|(c, (col, d))| {
            let values = order
                .iter()
                .map(|&g| d.values[keys[g][c] as usize].clone())
                .collect();
            (col.name.clone(), values)
        })
        .collect();
    Ok(Grouped {
        group_of,
        counts,
        meta,
    })
}

/// The one value of kept column `col` in each group; a second value in a group is an error
/// naming the group and the row.
fn kept_values(
    reader: &SerializedFileReader<File>,
    col: &Column,
    grouped: &Grouped,
    path: &Path,
) -> Result<Vec<Option<String>>, ScoringError> {
    let rows = grouped.group_of.len();
    let d = Dictionary::read(reader, col, rows).map_err(|source| ScoringError::Parquet {
        path: path.to_path_buf(),
        source,
    })?;
    let mut first: Vec<Option<u32>> = vec![None; grouped.counts.len()];
    for (r, (&g, &code)) in grouped.group_of.iter().zip(&d.codes).enumerate() {
        match first[g as usize] {
            None => first[g as usize] = Some(code),
            Some(c) if c != code => {
                let k = g as usize;
                let group: Vec<String> = grouped
                    .meta
                    .iter()
                    .map(|(n, v)| format!("{n}={}", v[k].as_deref().unwrap_or("null")))
                    .collect();
                return Err(ScoringError::Invalid {
                    path: path.to_path_buf(),
                    what: format!(
                        "`{}` is not constant within the group {} (row {r} has {}, an earlier row {}): only columns with one value per group can be kept",
                        col.name,
                        group.join(","),
                        d.show(code),
                        d.show(c)
                    ),
                });
            }
            Some(_) => {}
        }
    }
    Ok(first
        .iter()
        .map(|c| d.values[c.expect("every group has a row") as usize].clone())
        .collect())
}

/// Aggregates the Parquet table at `path` (see the module doc).
pub fn aggregate(path: &Path, opts: &AggregateOptions) -> Result<Aggregated, ScoringError> {
    let pq = |source| ScoringError::Parquet {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(|source| ScoringError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let reader = SerializedFileReader::new(file).map_err(pq)?;
    let meta = reader.metadata();
    let rows = meta.file_metadata().num_rows().max(0) as usize;
    let schema = meta.file_metadata().schema_descr();
    let flat: Vec<Column> = schema
        .columns()
        .iter()
        .enumerate()
        .filter(|(_, c)| c.max_rep_level() == 0 && c.path().parts().len() == 1)
        .map(|(leaf, c)| Column {
            name: c.name().to_string(),
            leaf,
            desc: c.clone(),
        })
        .collect();
    let Chosen {
        strata,
        keep,
        features,
    } = choose(&flat, opts, path)?;
    if rows == 0 {
        return Err(ScoringError::TooFewRows {
            path: path.to_path_buf(),
            what: "aggregate".into(),
            need: 1,
            have: 0,
        });
    }

    // Pass 1: each row's group (strata codes), the keep columns checked constant per group.
    let grouped = group_rows(&reader, &strata, rows).map_err(pq)?;
    let mut out_meta = grouped.meta.clone();
    for col in &keep {
        out_meta.push((col.name.clone(), kept_values(&reader, col, &grouped, path)?));
    }
    let Grouped {
        group_of, counts, ..
    } = grouped;
    let groups = counts.len();

    // Each row's slot: groups in output order, rows in table order within a group.
    let mut start = vec![0usize; groups + 1];
    for (k, &c) in counts.iter().enumerate() {
        start[k + 1] = start[k] + c as usize;
    }
    let mut next = start.clone();
    let slot: Vec<u32> = group_of
        .iter()
        .map(|&g| {
            let s = next[g as usize];
            next[g as usize] += 1;
            s as u32
        })
        .collect();
    drop(group_of);

    // Pass 2: one feature column at a time, laid out by group, reduced per group.
    let d = features.len();
    let mut out = vec![0f64; groups * d];
    let mut buf = vec![0f64; rows];
    for (j, col) in features.iter().enumerate() {
        read_numbers(&reader, col, |row, v| buf[slot[row] as usize] = v).map_err(pq)?;
        for k in 0..groups {
            out[k * d + j] = reduce(&mut buf[start[k]..start[k + 1]], opts.operation);
        }
    }
    tracing::info!(
        "{}: {rows} rows aggregated into {groups} groups by {} ({} features, {:?})",
        path.display(),
        opts.strata.join(","),
        d,
        opts.operation
    );
    Ok(Aggregated {
        path: path.to_path_buf(),
        meta: out_meta,
        counts,
        feature_names: features.iter().map(|c| c.name.clone()).collect(),
        features: out,
        cells: rows,
    })
}

/// A metadata column as a code per row and the distinct values (text, nulls `None`), with
/// how pandas sorts them.
struct Dictionary {
    codes: Vec<u32>,
    values: Vec<Option<String>>,
    /// The values as numbers where the column is numeric (pandas sorts those numerically).
    numbers: Option<Vec<f64>>,
}

impl Dictionary {
    fn read(
        reader: &SerializedFileReader<File>,
        col: &Column,
        rows: usize,
    ) -> parquet::errors::Result<Self> {
        let mut seen: HashMap<Option<String>, u32> = HashMap::new();
        let mut values = vec![];
        let mut codes = Vec::with_capacity(rows);
        for g in 0..reader.metadata().num_row_groups() {
            read_leaf_chunks(reader, g, col.leaf, &col.desc, CHUNK_ROWS, |leaf| {
                for v in leaf.into_text() {
                    let next = values.len() as u32;
                    let code = *seen.entry(v.clone()).or_insert_with(|| {
                        values.push(v);
                        next
                    });
                    codes.push(code);
                }
                Ok(())
            })?;
        }
        let numbers = matches!(numeric(&col.desc), Numeric::Float | Numeric::Integer).then(|| {
            values
                .iter()
                .map(|v| {
                    v.as_deref()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(f64::NAN)
                })
                .collect()
        });
        Ok(Self {
            codes,
            values,
            numbers,
        })
    }

    /// pandas' sort order of two codes: nulls last, numbers numerically, text by code point.
    fn compare(&self, a: u32, b: u32) -> Ordering {
        let (va, vb) = (&self.values[a as usize], &self.values[b as usize]);
        match (va, vb) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Greater,
            (Some(_), None) => Ordering::Less,
            (Some(x), Some(y)) => match &self.numbers {
                Some(n) => n[a as usize]
                    .total_cmp(&n[b as usize])
                    .then_with(|| x.cmp(y)),
                None => x.cmp(y),
            },
        }
    }

    fn show(&self, code: u32) -> String {
        match &self.values[code as usize] {
            Some(v) => format!("`{v}`"),
            None => "null".into(),
        }
    }
}

/// Hands every value of a numeric column to `put(row, value)` as float64 (pandas'
/// `astype(float)`: nulls NaN, booleans 0/1).
fn read_numbers(
    reader: &SerializedFileReader<File>,
    col: &Column,
    mut put: impl FnMut(usize, f64),
) -> parquet::errors::Result<()> {
    let mut row = 0;
    for g in 0..reader.metadata().num_row_groups() {
        read_leaf_chunks(reader, g, col.leaf, &col.desc, CHUNK_ROWS, |leaf| {
            match leaf {
                Leaf::Floats32(v) => v.into_iter().for_each(|x| {
                    put(row, f64::from(x));
                    row += 1
                }),
                Leaf::Numbers(v) => v.into_iter().for_each(|x| {
                    put(row, x);
                    row += 1
                }),
                Leaf::Text(v) => v.into_iter().for_each(|x| {
                    let x = match x.as_deref() {
                        None => f64::NAN,
                        Some("true") => 1.0,
                        Some("false") => 0.0,
                        Some(s) => s.parse().unwrap_or(f64::NAN),
                    };
                    put(row, x);
                    row += 1
                }),
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// pandas' groupby `median()` / `mean()` of one group's values (which it may reorder): NaN
/// skipped, NaN when none is left; the median of an even count is the mean of the two middle
/// values; the mean is pandas' Kahan-compensated sum in row order over the count.
fn reduce(values: &mut [f64], operation: Operation) -> f64 {
    match operation {
        Operation::Mean => {
            let (mut sum, mut comp, mut n) = (0f64, 0f64, 0usize);
            for &v in values.iter().filter(|v| !v.is_nan()) {
                n += 1;
                let y = v - comp;
                let t = sum + y;
                comp = t - sum - y;
                if comp.is_nan() {
                    // pandas GH#50367: an infinite value keeps the sum infinite, not NaN.
                    comp = 0.0;
                }
                sum = t;
            }
            if n == 0 {
                f64::NAN
            } else {
                sum / n as f64
            }
        }
        Operation::Median => {
            // NaN to the back, then select among the rest.
            let mut n = 0;
            for i in 0..values.len() {
                if !values[i].is_nan() {
                    values.swap(n, i);
                    n += 1;
                }
            }
            let v = &mut values[..n];
            if n == 0 {
                return f64::NAN;
            }
            let (lower, &mut mid, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
            if n % 2 == 1 {
                mid
            } else {
                let below = lower.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                (below + mid) / 2.0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_skips_nan_and_averages_the_middle_pair() {
        assert_eq!(
            reduce(&mut [3.0, f64::NAN, 1.0, 2.0, 10.0], Operation::Median),
            2.5
        );
        assert_eq!(reduce(&mut [2.0, 2.0, 1.0], Operation::Median), 2.0);
        assert!(reduce(&mut [f64::NAN, f64::NAN], Operation::Median).is_nan());
        assert_eq!(reduce(&mut [1.0, f64::NAN, 2.0, 6.0], Operation::Mean), 3.0);
        assert_eq!(
            reduce(&mut [1.0, f64::INFINITY, 2.0], Operation::Mean),
            f64::INFINITY
        );
        assert!(reduce(&mut [], Operation::Mean).is_nan());
    }
}
