//! Why training stopped with an error: one type for setup, data, steps, collectives and
//! checkpoints, so the epoch loop and the strategies return the same thing.
use crate::data;
use crate::data::mean_std;
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
    Metrics(#[from] crate::monitoring::MetricsError),
    #[error(transparent)]
    Step(#[from] super::step::StepError),
    #[error(transparent)]
    Dist(#[from] crate::distributed::group::DistError),
    #[error(transparent)]
    Fsdp(#[from] super::strategy::fsdp_error::FsdpError),
    #[error(transparent)]
    Load(#[from] super::loader::LoadError),
    #[error(transparent)]
    DistEnv(#[from] crate::distributed::env::DistEnvError),
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    #[error(transparent)]
    Precision(#[from] crate::precision::PrecisionError),
    #[error(transparent)]
    SampleOrder(#[from] super::sampler::OrderError),
    #[error(transparent)]
    Init(#[from] super::init::InitError),
    /// A stop signal arrived while this rank waited for the others at the start; not an
    /// error to the user: [`crate::train::run::train`] reports it as a stop.
    #[error("stopped by a signal before the ranks met")]
    StoppedBeforeStart,
    /// A strategy asked to restore shards without a shard folder (a bug, not a user error).
    #[error("rank 0 could not write the checkpoint (its log says why); stopping this rank too")]
    CheckpointNotWritten,
    #[error("FSDP: no shard folder was given")]
    NoShardFolder,
    #[error("channel combination {index} does not exist (data.channel_combinations has {count})")]
    NoCombination { index: usize, count: usize },
    #[error("the training split is empty (data.train_fraction leaves no image to train on)")]
    EmptySplit,
    #[error("mean/std lists {found} channels but data.channel_names lists {expected}")]
    MeanStdChannels { found: usize, expected: usize },
    #[error("augment: {0}")]
    Augment(crate::augment::AugmentError),
    #[error("stopped (train.on_collapse: stop): {0}")]
    Collapsed(String),
    /// A resume whose `data.dataset_dir` is another place than the checkpoint's dataset.
    #[error(
        "cannot resume from {}: it was trained on {trained_on}, but data.dataset_dir is now {now}; \
         resuming would continue its sample order, split and schedules on other images. \
         Pass --allow-new-data (`trainer train` or `trainer pipeline`) to resume this run on \
         the new data, or give the new data a run of its own (another run.name); starting a \
         new run from this run's weights is what `model.init` (format: run) does",
        checkpoint.display()
    )]
    OtherDataset {
        checkpoint: PathBuf,
        trained_on: String,
        now: String,
    },
    #[error("cannot resume from {path}: {source}")]
    Resume {
        path: PathBuf,
        #[source]
        source: crate::checkpoint::RestoreError,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
