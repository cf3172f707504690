//! Any profile table, read for scoring, and the result tables written back.
//!
//! "Anyone's table" is decided by name and type ([`super::columns`]): every float, double or
//! half-float column not named `Metadata_*` is a feature, every other column is metadata, read
//! as text whatever its type (strings, booleans, integers, floats, dates, ...), nulls kept as
//! nulls; the scores refuse a null only in a column they pair or group rows by. So a table
//! from this pipeline (`DINO_CLS_*`), a CellProfiler/pycytominer profile or a JUMP profile,
//! written by pandas, polars or pyarrow, all read without options.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::basic::{Compression, LogicalType, Repetition, Type as PhysicalType};
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, FloatType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;

use super::columns::read_table;
use super::ScoringError;
use crate::analysis::profiles;

/// Rows per row group of the written tables.
const ROW_GROUP_ROWS: usize = 65_536;

/// A profile table: metadata columns as text (nulls `None`) and a row-major float32 feature
/// block.
#[derive(Debug, Clone)]
pub struct ProfileTable {
    /// Where it was read from (named in every error about it).
    pub path: PathBuf,
    pub meta: Vec<(String, Vec<Option<String>>)>,
    pub feature_names: Vec<String>,
    /// Row-major `[rows, dim]`.
    pub features: Vec<f32>,
    pub rows: usize,
    /// Nested (list/struct) columns of the file, which are not read.
    pub nested: Vec<String>,
}

impl ProfileTable {
    /// Reads the table at `path` (see the module doc for which columns are features).
    pub fn read(path: &Path) -> Result<Self, ScoringError> {
        let raw = read_table(path)?;
        if raw.features.is_empty() {
            return Err(ScoringError::NoFeatures {
                path: path.to_path_buf(),
            });
        }
        let rows = raw.rows;
        let dim = raw.features.len();
        let (feature_names, columns): (Vec<String>, Vec<Vec<f32>>) =
            raw.features.into_iter().unzip();
        let mut features = vec![0f32; rows * dim];
        let columns: Vec<&[f32]> = columns.iter().map(Vec::as_slice).collect();
        profiles::to_row_major(&columns, rows, &mut features);
        if let Some(sum) = raw.checksum {
            if sum != profiles::feature_checksum(&features) {
                return Err(profiles::ProfilesError::Checksum {
                    path: path.to_path_buf(),
                }
                .into());
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            meta: raw.meta,
            feature_names,
            features,
            rows,
            nested: raw.nested,
        })
    }

    /// The rows `rows` as a table of their own.
    pub fn subset(&self, rows: &[usize]) -> Self {
        let mut features = Vec::with_capacity(rows.len() * self.dim());
        for &r in rows {
            features.extend_from_slice(self.row(r));
        }
        Self {
            path: self.path.clone(),
            meta: self
                .meta
                .iter()
                .map(|(n, v)| (n.clone(), rows.iter().map(|&r| v[r].clone()).collect()))
                .collect(),
            feature_names: self.feature_names.clone(),
            features,
            rows: rows.len(),
            nested: self.nested.clone(),
        }
    }

    pub fn dim(&self) -> usize {
        self.feature_names.len()
    }

    /// Row `r` of the feature block.
    pub fn row(&self, r: usize) -> &[f32] {
        let d = self.dim();
        &self.features[r * d..(r + 1) * d]
    }

    /// The metadata column `name` (`None` = null); an error naming the file and the column
    /// (and the columns it has) where there is none.
    pub fn column(&self, name: &str) -> Result<&[Option<String>], ScoringError> {
        if let Some((_, v)) = self.meta.iter().find(|(n, _)| n == name) {
            return Ok(v);
        }
        if self.nested.iter().any(|n| n == name) {
            return Err(ScoringError::invalid(
                self,
                format!("column `{name}` is a nested (list/struct/map) column, which is not read; flatten it to a plain column"),
            ));
        }
        if self.feature_names.iter().any(|n| n == name) {
            return Err(ScoringError::invalid(
                self,
                format!("column `{name}` is a float column not named `Metadata_*`, so it is read as a feature; name it `Metadata_{name}` to use it as metadata"),
            ));
        }
        Err(ScoringError::MissingColumn {
            path: self.path.clone(),
            column: name.to_string(),
            have: self
                .meta
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// The column `name` where it must have a value on every row (a pairing or grouping
    /// key): a null is an error naming file, column and the first such row.
    pub fn key_column(&self, name: &str) -> Result<Vec<String>, ScoringError> {
        let col = self.column(name)?;
        col.iter()
            .enumerate()
            .map(|(row, v)| {
                v.clone().ok_or_else(|| ScoringError::NullKey {
                    path: self.path.clone(),
                    column: name.to_string(),
                    row,
                })
            })
            .collect()
    }

    /// Refuses a table of fewer than `need` rows for `what` (a score, a fit).
    pub fn need_rows(&self, need: usize, what: &str) -> Result<(), ScoringError> {
        if self.rows < need {
            return Err(ScoringError::TooFewRows {
                path: self.path.clone(),
                what: what.to_string(),
                need,
                have: self.rows,
            });
        }
        Ok(())
    }

    /// Refuses a key column with fewer than two distinct values where `what` compares its
    /// groups, naming the column and its one value.
    pub fn need_two_values(
        &self,
        column: &str,
        values: &[String],
        what: &str,
    ) -> Result<(), ScoringError> {
        let first = values.first();
        if values.iter().all(|v| Some(v) == first) {
            return Err(ScoringError::invalid(
                self,
                format!(
                    "column `{column}` has one value ({}) on every row: {what} needs at least two",
                    first.map_or("none".into(), |v| format!("`{v}`"))
                ),
            ));
        }
        Ok(())
    }

    /// Refuses NaN or infinite features, naming the first row and column that has one.
    pub fn check_finite(&self) -> Result<(), ScoringError> {
        if let Some(i) = self.features.iter().position(|v| !v.is_finite()) {
            return Err(ScoringError::NonFinite {
                path: self.path.clone(),
                row: i / self.dim(),
                column: self.feature_names[i % self.dim()].clone(),
            });
        }
        Ok(())
    }
}

/// One column of a result table.
#[derive(Debug, Clone)]
pub enum OutColumn {
    Text(Vec<String>),
    /// Text with nulls (`None`), written as an optional column.
    NullableText(Vec<Option<String>>),
    Int(Vec<i64>),
    Double(Vec<f64>),
    Float(Vec<f32>),
    Bool(Vec<bool>),
}

impl OutColumn {
    fn len(&self) -> usize {
        match self {
            OutColumn::Text(v) => v.len(),
            OutColumn::NullableText(v) => v.len(),
            OutColumn::Int(v) => v.len(),
            OutColumn::Double(v) => v.len(),
            OutColumn::Float(v) => v.len(),
            OutColumn::Bool(v) => v.len(),
        }
    }

    fn field(&self, name: &str) -> parquet::errors::Result<Arc<Type>> {
        let (physical, logical) = match self {
            OutColumn::Text(_) | OutColumn::NullableText(_) => {
                (PhysicalType::BYTE_ARRAY, Some(LogicalType::String))
            }
            OutColumn::Int(_) => (PhysicalType::INT64, None),
            OutColumn::Double(_) => (PhysicalType::DOUBLE, None),
            OutColumn::Float(_) => (PhysicalType::FLOAT, None),
            OutColumn::Bool(_) => (PhysicalType::BOOLEAN, None),
        };
        Ok(Arc::new(
            Type::primitive_type_builder(name, physical)
                .with_repetition(match self {
                    OutColumn::NullableText(_) => Repetition::OPTIONAL,
                    _ => Repetition::REQUIRED,
                })
                .with_logical_type(logical)
                .build()?,
        ))
    }
}

/// Writes `columns` as one Parquet table at `path`, atomically. `checksum` (the SHA-256 of a
/// float32 feature block) rides in the key-value metadata as the profile tables carry it.
pub fn write_table(
    path: &Path,
    columns: &[(String, OutColumn)],
    checksum: Option<String>,
) -> Result<(), ScoringError> {
    let bytes = encode(columns, checksum).map_err(|source| ScoringError::Parquet {
        path: path.to_path_buf(),
        source,
    })?;
    scdino_base::fs::write_atomic(path, &bytes).map_err(|source| ScoringError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn encode(
    columns: &[(String, OutColumn)],
    checksum: Option<String>,
) -> parquet::errors::Result<Vec<u8>> {
    let rows = columns.first().map(|(_, c)| c.len()).unwrap_or(0);
    let fields = columns
        .iter()
        .map(|(n, c)| c.field(n))
        .collect::<parquet::errors::Result<Vec<_>>>()?;
    let schema = Type::group_type_builder("schema")
        .with_fields(fields)
        .build()?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_key_value_metadata(
            checksum.map(|c| vec![KeyValue::new(profiles::CHECKSUM_KEY.to_string(), c)]),
        )
        .build();
    let mut out = Vec::new();
    let mut writer = SerializedFileWriter::new(&mut out, Arc::new(schema), Arc::new(props))?;
    for start in (0..rows.max(1)).step_by(ROW_GROUP_ROWS) {
        let range = start..(start + ROW_GROUP_ROWS).min(rows);
        let mut group = writer.next_row_group()?;
        let mut k = 0;
        while let Some(mut col) = group.next_column()? {
            match &columns[k].1 {
                OutColumn::Text(v) => {
                    let v: Vec<ByteArray> =
                        v[range.clone()].iter().map(|s| s.as_str().into()).collect();
                    col.typed::<ByteArrayType>().write_batch(&v, None, None)?;
                }
                OutColumn::NullableText(v) => {
                    let v = &v[range.clone()];
                    let defs: Vec<i16> = v.iter().map(|s| i16::from(s.is_some())).collect();
                    let values: Vec<ByteArray> =
                        v.iter().flatten().map(|s| s.as_str().into()).collect();
                    col.typed::<ByteArrayType>()
                        .write_batch(&values, Some(&defs), None)?;
                }
                OutColumn::Int(v) => {
                    col.typed::<Int64Type>()
                        .write_batch(&v[range.clone()], None, None)?;
                }
                OutColumn::Double(v) => {
                    col.typed::<DoubleType>()
                        .write_batch(&v[range.clone()], None, None)?;
                }
                OutColumn::Float(v) => {
                    col.typed::<FloatType>()
                        .write_batch(&v[range.clone()], None, None)?;
                }
                OutColumn::Bool(v) => {
                    col.typed::<BoolType>()
                        .write_batch(&v[range.clone()], None, None)?;
                }
            }
            col.close()?;
            k += 1;
        }
        group.close()?;
    }
    writer.close()?;
    Ok(out)
}

/// Writes a profile table: `meta` as text columns (nulls kept), then `feature_names` as float32 columns
/// from the row-major `features`, with their checksum.
pub fn write_profiles(
    path: &Path,
    meta: &[(String, Vec<Option<String>>)],
    feature_names: &[String],
    features: &[f32],
) -> Result<(), ScoringError> {
    let dim = feature_names.len();
    let rows = features.len().checked_div(dim).unwrap_or(0);
    let mut columns: Vec<(String, OutColumn)> = meta
        .iter()
        .map(|(n, v)| (n.clone(), OutColumn::NullableText(v.clone())))
        .collect();
    for (j, name) in feature_names.iter().enumerate() {
        let col = (0..rows).map(|r| features[r * dim + j]).collect();
        columns.push((name.clone(), OutColumn::Float(col)));
    }
    write_table(path, &columns, Some(profiles::feature_checksum(features)))
}

/// Splits a comma-separated column list (`--pos-sameby A,B`), dropping empty entries.
pub fn split_columns(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}
