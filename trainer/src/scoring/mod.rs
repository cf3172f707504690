//! Scoring embeddings the way the image-based profiling field does, on any profile table:
//! copairs' average precision and mean average precision ([`map`]), scib's batch silhouette
//! and graph connectivity and CHAMMI's leave-one-group-out 1-NN ([`batch`]), pycytominer's
//! single-cell aggregation, normalisations, feature selection and consensus profiles
//! ([`aggregate`], [`normalize`], [`select`], [`consensus`]), and the CHAMMI
//! benchmark score ([`chammi`]). Each follows its
//! Python library's definition line by line (the tests compare against the library pinned in
//! the venv), so a number from here means what the paper using that library means by it.
//!
//! (`crate::metrics` is the run's telemetry, Prometheus and TensorBoard; this is not that.)
pub mod aggregate;
pub mod batch;
pub mod chammi;
pub mod columns;
pub mod consensus;
pub mod keys;
pub mod map;
pub mod nn;
pub mod normalize;
pub mod plots;
pub mod profile;
mod rank;
pub mod recipe;
pub mod select;
pub mod summary;
pub mod table;

use std::path::PathBuf;

pub use table::ProfileTable;

#[derive(Debug, thiserror::Error)]
pub enum ScoringError {
    #[error(transparent)]
    Profiles(#[from] crate::analysis::profiles::ProfilesError),
    #[error("{path}: {source}")]
    Parquet {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no float feature column (features are the float/double columns not named `Metadata_*`)")]
    NoFeatures { path: PathBuf },
    #[error("{path}: no column `{column}` (the table has metadata columns: {have})")]
    MissingColumn {
        path: PathBuf,
        column: String,
        have: String,
    },
    #[error("{path}: column `{column}` is empty (null) in row {row}; a column used to pair or group rows needs a value on every row")]
    NullKey {
        path: PathBuf,
        column: String,
        row: usize,
    },
    #[error("{path}: feature `{column}` is NaN or infinite in row {row}")]
    NonFinite {
        path: PathBuf,
        row: usize,
        column: String,
    },
    #[error("{path}: {what} needs at least {need} row{}; the table has {}", if *need == 1 { "" } else { "s" }, if *have == 0 { "none (it is empty)".to_string() } else { have.to_string() })]
    TooFewRows {
        path: PathBuf,
        what: String,
        need: usize,
        have: usize,
    },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error(transparent)]
    Plot(#[from] crate::plot::PlotError),
}

impl ScoringError {
    pub(crate) fn invalid(table: &ProfileTable, what: impl Into<String>) -> Self {
        ScoringError::Invalid {
            path: table.path.clone(),
            what: what.into(),
        }
    }
}
