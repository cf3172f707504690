//! `trainer train`: one channel combination trained on every rank of the job, resumed exactly
//! after any stop. [`train`] is the whole of it: [`TrainingRun::setup`] settles everything
//! before the first step (split, ranks, statistics, schedules, model, resume, parallel
//! strategy), then [`TrainingRun::run`] runs the epochs until they are done or something stops
//! the run (a signal, the step limit, a collapse).
//!
//! Reproducibility contract: the sample order is a function of (seed, epoch, rank), each
//! sample's augmentation of (seed, epoch, index), and libtorch's generator is re-seeded from
//! (seed, iteration) before every step. A checkpoint therefore only needs weights, optimizer
//! state, loss centre and the position (epoch, batch, iteration) for a resumed run to
//! continue bit for bit as if it had never stopped (CPU, fixed thread count).
mod batches;
mod epoch;
mod resume;
mod run_files;
mod setup;

pub use super::preempt::EXIT_PREEMPTED;
pub use super::train_error::TrainError;
pub use batches::training_image_fn;
pub use resume::{fingerprint, schedule_change_note};
pub use run_files::{dataset_mean_std, model_dir};

use super::collapse::CollapsePolicy;
use super::graphed::GraphedStep;
use super::preempt::StopRequest;
use super::schedule::Schedules;
use super::step::Learner;
use super::strategy::ParallelStrategy;
use super::telemetry::throughput::ThroughputMeter;
use super::telemetry::Telemetry;
use crate::checkpoint::EpochTotals;
use crate::config::Config;
use batches::TrainingData;
use resume::{CheckpointWriter, Position};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// How a `train` call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainOutcome {
    /// All epochs done.
    Finished,
    /// `max_steps` reached; a checkpoint was written.
    StepLimit,
    /// A stop signal arrived; a checkpoint was written at the step boundary.
    Preempted,
}

#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// Index into `data.channel_combinations`.
    pub combination: usize,
    /// Stop (with a checkpoint) once this global iteration is reached.
    pub max_steps: Option<usize>,
    /// Set asynchronously (signal handler, see [`super::preempt`]) to request a checkpoint
    /// and stop.
    pub stop: Option<Arc<AtomicBool>>,
    /// Resume even when `data.dataset_dir` is not the dataset the checkpoint trained on
    /// (`--allow-new-data`); otherwise such a resume is refused.
    pub allow_new_data: bool,
}

/// Trains one channel combination of `cfg` on this process, as one rank of the job the
/// process environment describes (a world of one without it).
pub fn train(cfg: &Config, opts: &TrainOptions) -> Result<TrainOutcome, TrainError> {
    match TrainingRun::setup(cfg, opts) {
        Ok(run) => run.run(),
        Err(TrainError::StoppedBeforeStart) => Ok(TrainOutcome::Preempted),
        Err(e) => Err(e),
    }
}

/// How a run's work is divided.
#[derive(Debug, Clone, Copy)]
pub struct RunShape {
    pub rank: usize,
    pub world: usize,
    /// Images (Bag-of-Channels: items) per rank and step.
    pub batch: usize,
    /// Iterations per epoch.
    pub niter: usize,
}

/// One training run between setup and its outcome: what setup settled, the learner and its
/// parallel strategy, the sinks the loop reports to, and where the run stands.
pub struct TrainingRun<'a> {
    cfg: &'a Config,
    shape: RunShape,
    /// The selected channels (indices into `data.channel_names`).
    channels: Vec<usize>,
    sched: Schedules,
    data: TrainingData,
    learner: Learner,
    strategy: Box<dyn ParallelStrategy>,
    checkpoints: CheckpointWriter,
    telemetry: Telemetry,
    throughput: ThroughputMeter,
    collapse: CollapsePolicy,
    stop: StopRequest,
    max_steps: Option<usize>,
    /// The next step's position (`batch`: where the current epoch started).
    at: Position,
    /// Sums of the current epoch, for its `log.txt` line.
    meter: EpochTotals,
    /// `train.cuda_graphs` where the step can be captured (see `setup`), else None.
    graphs: Option<GraphedStep>,
}
