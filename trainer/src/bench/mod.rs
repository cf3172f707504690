//! The work of `trainer bench` (bench/: the PyTorch peers run the same shapes and threads):
//! one module per benchmark, each with its options (the subcommand's flags, declared once
//! here as `clap::Args`), what it times and the JSON line it reports, so the command line
//! only parses, calls and prints.
pub mod loader;
pub mod matmul;
pub mod model;
pub mod probe;
pub mod profiles;
mod shape;
pub mod step;

pub use shape::BatchShape;

use crate::analysis::features::FeaturesError;
use crate::analysis::knn::KnnError;
use crate::analysis::profiles::ProfilesError;
use crate::augment::AugmentError;
use crate::config::Arch;
use crate::config::ConfigError;
use crate::data::mean_std::MeanStdError;
use crate::data::DataError;
use crate::precision::PrecisionError;
use crate::train::loader::LoadError;
use crate::train::sampler::OrderError;
use crate::train::step::StepError;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Options the bench cannot measure together, or a dataset too small for them; the
    /// message names the flags.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Precision(#[from] PrecisionError),
    #[error(transparent)]
    Step(#[from] StepError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    MeanStd(#[from] MeanStdError),
    #[error(transparent)]
    Augment(#[from] AugmentError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Order(#[from] OrderError),
    #[error("the loader ran out of batches")]
    OutOfBatches,
    #[error("warm-up reader panicked")]
    ReaderPanicked,
    #[error(transparent)]
    Tch(#[from] tch::TchError),
    #[error("{path}: {source}")]
    Tensors {
        path: PathBuf,
        source: tch::TchError,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Features(#[from] FeaturesError),
    #[error(transparent)]
    Knn(#[from] KnnError),
    #[error(transparent)]
    Profiles(#[from] ProfilesError),
    /// The process's CPU time could not be read (Linux's /proc/self/stat).
    #[error("reading /proc/self/stat: {0}")]
    CpuTime(String),
}

impl BenchError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A refusal of the options.
fn invalid(message: impl Into<String>) -> BenchError {
    BenchError::Invalid(message.into())
}

/// User + system CPU seconds of this process (all threads), from /proc/self/stat: a loader's
/// cost per image counts every worker thread.
pub fn process_cpu_seconds() -> Result<f64, BenchError> {
    let cpu = |what: &str| BenchError::CpuTime(what.to_string());
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(|e| cpu(&e.to_string()))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat
        .rsplit_once(')')
        .ok_or_else(|| cpu("malformed /proc/self/stat"))?
        .1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64, BenchError> {
        f.get(i)
            .ok_or_else(|| cpu("short /proc/self/stat"))?
            .parse::<f64>()
            .map_err(|e| cpu(&e.to_string()))
    };
    // Fields 14/15 are at 11/12 counting from field 3 (the state) at 0; USER_HZ is 100 on
    // Linux everywhere we run.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// The config's own spelling of an enum value (`vit_small`, `bf16`, `tokens`): what its YAML
/// key takes, so a bench's report and the config can never spell a value differently.
pub fn yaml_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        other => unreachable!("a config enum serialises to its name, not {other:?}"),
    }
}

/// `values` of a config enum by their config spelling.
fn config_enum<T: serde::Serialize + Copy>(values: &[T]) -> Vec<(String, T)> {
    values.iter().map(|v| (yaml_name(v), *v)).collect()
}

/// `--arch`: the ViT sizes by their config spelling.
fn parse_arch(s: &str) -> Result<Arch, String> {
    config_enum(&[Arch::VitTiny, Arch::VitSmall, Arch::VitBase])
        .into_iter()
        .find(|(name, _)| name == s)
        .map(|(_, a)| a)
        .ok_or_else(|| format!("unknown arch {s:?}: vit_tiny, vit_small or vit_base"))
}

/// A clap parser that takes exactly `values` of a config enum, by their config spelling
/// (listed in `--help` and in the error for any other word).
fn config_values<T>(values: &'static [T]) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: serde::Serialize + Copy + Send + Sync + 'static,
{
    use clap::builder::TypedValueParser as _;
    let names: Vec<&'static str> = config_enum(values)
        .into_iter()
        .map(|(name, _)| &*Box::leak(name.into_boxed_str()))
        .collect();
    clap::builder::PossibleValuesParser::new(names.clone()).map(move |s| {
        let i = names
            .iter()
            .position(|n| *n == s)
            .expect("clap admits listed values only");
        values[i]
    })
}
