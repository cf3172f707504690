//! Every way a stage of the pipeline can fail, typed, so callers can tell a dead rank from a bad
//! file; the single-stage commands pass these on too.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Features(#[from] crate::analysis::features::FeaturesError),
    #[error(transparent)]
    Knn(#[from] crate::analysis::knn::KnnError),
    #[error(transparent)]
    Umap(#[from] crate::analysis::umap::UmapError),
    #[error(transparent)]
    Profiles(#[from] crate::analysis::profiles::ProfilesError),
    #[error(transparent)]
    Scoring(#[from] crate::scoring::ScoringError),
    #[error(transparent)]
    Attention(#[from] crate::analysis::attention::AttentionError),
    /// The profiling stage's embedding of a screen.
    #[error(transparent)]
    Embed(#[from] crate::embed::process::EmbedError),
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    #[error(transparent)]
    Plot(#[from] crate::plot::PlotError),
    #[error(transparent)]
    Train(#[from] crate::train::run::TrainError),
    #[error(transparent)]
    MeanStd(#[from] crate::data::mean_std::MeanStdError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    DistEnv(#[from] crate::distributed::env::DistEnvError),
    /// The features stage's rendezvous and barrier.
    #[error(transparent)]
    Dist(#[from] crate::distributed::group::DistError),
    #[error("gathering features: {source}")]
    GatherFeatures {
        #[source]
        source: crate::distributed::group::DistError,
    },
    /// A run listed in `downstream.attention.beside` whose config does not load.
    /// (The config's own error names the file and the line.)
    #[error("downstream.attention.beside: {source}")]
    BesideConfig {
        path: PathBuf,
        #[source]
        source: crate::config::ConfigError,
    },
    #[error("channel combination {index} does not exist (the config has {count})")]
    NoCombination { index: usize, count: usize },
    /// Every stage after training needs the dataset statistics.
    #[error("{source} (run `trainer mean-std` or `trainer pipeline` first)")]
    NoMeanStd {
        #[source]
        source: crate::data::mean_std::MeanStdError,
    },
    /// Nothing to analyse: training kept no checkpoint.
    #[error("training finished but {} has no numbered checkpoints", dir.display())]
    NoNumberedCheckpoints { dir: PathBuf },
    /// A JSON file a stage wrote that does not parse as what it should hold.
    #[error("{}: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: not an evaluation report: {source}", path.display())]
    NotEvaluationReport {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// An evaluation report without a value the combinations table shows.
    #[error("{}: {what}", path.display())]
    IncompleteEvaluation { path: PathBuf, what: &'static str },
    /// A line of `log.txt` that is not JSON (`line` counts from 1).
    #[error("{} line {line}: {source}", path.display())]
    LogLine {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    /// A stage failed; the source stays typed so callers can tell, e.g., a dead rank from a
    /// bad file.
    #[error("stage {label}: {source}")]
    Stage {
        label: String,
        #[source]
        source: Box<StageError>,
    },
}

/// A JSON file a stage wrote, read back (the report and the stages that gather earlier
/// outputs); an unreadable or malformed file is an error naming it.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T, StageError> {
    let text = std::fs::read_to_string(path).map_err(|source| StageError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| StageError::Json {
        path: path.to_path_buf(),
        source,
    })
}
