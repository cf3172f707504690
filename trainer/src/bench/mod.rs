//! The work of `trainer bench step` and `trainer bench loader` (bench/: the PyTorch peers run
//! the same shapes and threads): what each times and the JSON line it reports, with typed
//! options and errors, so the command line only parses, calls and prints.
pub mod loader;
pub mod step;

use crate::augment::AugmentError;
use crate::config::ConfigError;
use crate::data::mean_std::MeanStdError;
use crate::data::DataError;
use crate::precision::PrecisionError;
use crate::train::loader::LoadError;
use crate::train::sampler::OrderError;
use crate::train::step::StepError;

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
    /// The process's CPU time could not be read (Linux's /proc/self/stat).
    #[error("reading /proc/self/stat: {0}")]
    CpuTime(String),
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
