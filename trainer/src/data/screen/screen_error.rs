//! Errors of the screen layouts: each names the file, the table row or the key at fault.
use crate::data::DataError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ScreenError {
    /// Reading or decoding an image file or object failed.
    #[error(transparent)]
    Data(#[from] DataError),

    /// A CSV table that does not parse (the error names the file and line).
    #[error(transparent)]
    Csv(#[from] crate::data::csv::CsvError),

    /// A table (LoadData, object table, CHAMMI metadata) that cannot be read at all.
    #[error("{}: {reason}", path.display())]
    Table { path: PathBuf, reason: String },

    /// A row of a table that is wrong (a missing file, a value that is not a number...).
    /// `row` counts data rows from 1 (line `row + 1` of a CSV with a header).
    #[error("{}: row {row}: {reason}", path.display())]
    Row {
        path: PathBuf,
        row: usize,
        reason: String,
    },

    /// A channel the config names that the screen does not have.
    #[error("{}: no channel {channel:?} (it has {})", source_name, available.join(", "))]
    MissingChannel {
        source_name: String,
        channel: String,
        available: Vec<String>,
    },

    /// A store (OME-Zarr plate, object store) whose structure or metadata is wrong; `key`
    /// names the group/array/attribute.
    #[error("{source_name}: {key}: {reason}")]
    Store {
        source_name: String,
        key: String,
        reason: String,
    },

    /// A site whose pieces disagree (channels of other sizes, a label image of another size).
    #[error("site {site}: {reason}")]
    Site { site: String, reason: String },
}

impl ScreenError {
    pub fn table(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Table {
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub fn row(path: impl Into<PathBuf>, row: usize, reason: impl Into<String>) -> Self {
        Self::Row {
            path: path.into(),
            row,
            reason: reason.into(),
        }
    }

    pub fn store(
        source_name: impl Into<String>,
        key: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self::Store {
            source_name: source_name.into(),
            key: key.into(),
            reason: reason.into(),
        }
    }
}

impl From<ScreenError> for DataError {
    fn from(e: ScreenError) -> Self {
        match e {
            ScreenError::Data(d) => d,
            other => Self::Screen(Box::new(other)),
        }
    }
}
