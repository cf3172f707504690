//! Why training stopped with an error: one type for setup, data, steps, collectives and
//! checkpoints, so the epoch loop and the strategies return the same thing.
use crate::analysis::mean_std;
use crate::data;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Data(#[from] data::DataError),
    #[error(transparent)]
    MeanStd(#[from] mean_std::MeanStdError),
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error(transparent)]
    Step(#[from] super::step::StepError),
    #[error(transparent)]
    Dist(#[from] crate::dist::group::DistError),
    #[error("{0}")]
    Setup(String),
    #[error("stopped (train.on_collapse: stop): {0}")]
    Collapsed(String),
    #[error("cannot resume from {path}: {reason}")]
    Resume { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
