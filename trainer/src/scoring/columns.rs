//! Every column of a Parquet profile table, read for scoring: a profile table comes from
//! anyone's code, and a column the command never uses (a float concentration with a NaN, a
//! boolean flag, a file name with a gap) must not make the table unreadable.
//!
//! A float, double or half-float column not named `Metadata_*` is a feature: its nulls (how
//! pandas writes NaN) read as NaN, which the scores refuse naming column and row. Every other
//! column is metadata, read as text with its nulls kept as nulls ([`crate::parquet_columns`]
//! says how each type reads). Nested columns (lists, structs, maps) are not read: they are
//! listed in [`RawTable::nested`] so a command that asks for one can say why.
use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::parquet_columns::{each_column_on_threads, read_leaf, Leaf};

use super::ScoringError;
use crate::analysis::profiles::CHECKSUM_KEY;

/// A table's columns as read for scoring.
#[derive(Debug, Default)]
pub struct RawTable {
    pub rows: usize,
    /// Metadata columns in table order; `None` is a null.
    pub meta: Vec<(String, Vec<Option<String>>)>,
    /// Feature columns in table order, nulls as NaN.
    pub features: Vec<(String, Vec<f32>)>,
    /// Top-level names of the nested columns that were not read.
    pub nested: Vec<String>,
    /// The feature checksum stored with the table (tables this crate wrote).
    pub checksum: Option<String>,
}

/// Reads every column of the table at `path` (see the module doc).
pub fn read_table(path: &Path) -> Result<RawTable, ScoringError> {
    let pq = |source| ScoringError::Parquet {
        path: path.to_path_buf(),
        source,
    };
    let open = || {
        let file = std::fs::File::open(path).map_err(|source| ScoringError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        SerializedFileReader::new(file).map_err(pq)
    };
    let reader = open()?;
    let meta = reader.metadata();
    let rows = meta.file_metadata().num_rows().max(0) as usize;
    let mut out = RawTable {
        rows,
        checksum: meta
            .file_metadata()
            .key_value_metadata()
            .and_then(|kv| kv.iter().find(|k| k.key == CHECKSUM_KEY))
            .and_then(|k| k.value.clone()),
        ..RawTable::default()
    };
    let schema = meta.file_metadata().schema_descr();
    let mut flat = vec![];
    for (i, col) in schema.columns().iter().enumerate() {
        let parts = col.path().parts();
        if col.max_rep_level() > 0 || parts.len() > 1 {
            let top = parts[0].clone();
            if !out.nested.contains(&top) {
                out.nested.push(top);
            }
        } else {
            flat.push(i);
        }
    }
    let read = each_column_on_threads(&reader, &flat, open, |r, i| {
        read_leaf(r, i, &schema.column(i))
    })?;
    for (&i, values) in flat.iter().zip(read) {
        let name = schema.column(i).name().to_string();
        let values = values.map_err(pq)?;
        if values.len() != rows {
            return Err(ScoringError::Invalid {
                path: path.to_path_buf(),
                what: format!(
                    "column `{name}` has {} values but the table has {rows} rows (damaged file?)",
                    values.len()
                ),
            });
        }
        match values {
            Leaf::Numbers(v) if !name.starts_with("Metadata_") => out
                .features
                .push((name, v.into_iter().map(|x| x as f32).collect())),
            Leaf::Floats32(v) if !name.starts_with("Metadata_") => out.features.push((name, v)),
            other => out.meta.push((name, other.into_text())),
        }
    }
    if !out.nested.is_empty() {
        tracing::warn!(
            "{}: nested (list/struct/map) columns not read: {}",
            path.display(),
            out.nested.join(", ")
        );
    }
    Ok(out)
}
