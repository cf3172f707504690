//! Everything a run settles before its first step, in the order the ranks must agree on it:
//! the ranks meet before the statistics are read (rank 0 computes them), the weights are
//! initialised from the seed before anything else draws from libtorch's generator, and a
//! resume is restored before the parallel strategy takes the learner over (FSDP shards it).
use super::batches::{TrainItems, TrainingData};
use super::resume::{self, CheckpointWriter, DataOrigin, Start};
use super::run_files::{dataset_mean_std, trim_log, RunLog};
use super::{RunShape, TrainError, TrainOptions, TrainingRun};
use crate::config::Config;
use crate::data::mean_std::MeanStd;
use crate::data::{self, ImageSource, SharedSource};
use crate::device::CudaFacts;
use crate::distributed::env::DistEnv;
use crate::distributed::group::ProcessGroup;
use crate::layout::{ModelLayout, RunLayout};
use crate::train::collapse::CollapsePolicy;
use crate::train::graphed::{self, GraphedStep};
use crate::train::preempt::StopRequest;
use crate::train::schedule::{scale_lr, Schedules};
use crate::train::step::Learner;
use crate::train::strategy::{self, Chosen, ParallelStrategy, StrategyOptions};
use crate::train::telemetry::throughput::ThroughputMeter;
use crate::train::telemetry::Telemetry;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

impl<'a> TrainingRun<'a> {
    /// Prepares combination `opts.combination` of `cfg` on this rank: resumes from the newest
    /// checkpoint of its model folder if there is one.
    pub fn setup(cfg: &'a Config, opts: &TrainOptions) -> Result<Self, TrainError> {
        let channels =
            cfg.training_channels(opts.combination)
                .ok_or(TrainError::NoCombination {
                    index: opts.combination,
                    count: cfg.channel_sets.len(),
                })?;
        let files = model_files(cfg, &channels)?;
        let (source, train_split) = training_split(cfg)?;
        let denv = DistEnv::from_process_env()?;
        let device = crate::device::resolve(cfg.train.device, denv.local_rank, CudaFacts::probe())?;
        if denv.rank == 0 || device.is_cuda() {
            tracing::info!("training on {device:?}");
        }
        let mut group = join_group(cfg, &denv, device.is_cuda(), opts.stop.as_deref())?;
        let (mean, std) = run_mean_std(cfg, source.as_ref(), &channels, denv.rank, group.as_mut())?;
        let items = TrainItems::new(cfg, source.as_ref(), &train_split, &mean, &std);
        let batch = cfg.train.batch_size_per_gpu;
        let shape = RunShape {
            rank: denv.rank,
            world: denv.world,
            batch,
            niter: items.iters_per_epoch(denv.world, batch),
        };
        let (peak_lr, sched) = schedules(cfg, &shape);
        if let Some(draw) =
            crate::train::channels::describe_channel_draw(cfg).filter(|_| denv.rank == 0)
        {
            tracing::info!("{draw}");
        }
        let mut learner = Learner::from_config(cfg, channels.len(), device)?;
        let fingerprint = resume::fingerprint(cfg, &channels);
        let origin = DataOrigin::new(cfg, opts.allow_new_data);
        let (strategy, start) = resume_and_distribute(
            cfg,
            group,
            &files,
            (&fingerprint, &origin),
            &mut learner,
            shape.rank,
        )?;
        if shape.rank == 0 {
            let log = RunLog {
                channels: &channels,
                iters_per_epoch: shape.niter,
                scaled_lr: peak_lr,
                resumed: start.resumed,
            };
            log.write(&files.run_log(), cfg)?;
            trim_log(&files.log(), start.at.epoch)?;
        }
        let data = TrainingData::new(cfg, source, items, &channels, (&mean, &std), device)?;
        let telemetry = Telemetry::new(shape.rank, &files, &cfg.run.name)?;
        let throughput = ThroughputMeter::new(cfg, channels.len(), device);
        tracing::info!("data: {}", data.describe());
        let graphs = graphed_step(cfg, device, &shape);
        Ok(Self {
            cfg,
            shape,
            sched,
            data,
            learner,
            strategy,
            checkpoints: checkpoint_writer(cfg, files, fingerprint, origin.location, mean, std),
            telemetry,
            throughput,
            collapse: CollapsePolicy::new(&cfg.train, shape.niter, shape.rank),
            stop: StopRequest::new(opts.stop.clone()),
            max_steps: opts.max_steps,
            at: start.at,
            meter: start.totals,
            channels,
            graphs,
        })
    }
}

/// `train.cuda_graphs`: the captured step where this run's step can be captured; otherwise
/// one warning line (rank 0) saying why, and the eager step.
fn graphed_step(cfg: &Config, device: tch::Device, shape: &RunShape) -> Option<GraphedStep> {
    if !cfg.train.cuda_graphs {
        return None;
    }
    match graphed::unsupported(cfg, device, shape.world) {
        None => {
            tracing::info!(
                "train.cuda_graphs: each crop-shape set is captured after {} eager steps and replayed",
                graphed::WARMUP_STEPS
            );
            Some(GraphedStep::new(device))
        }
        Some(reason) => {
            if shape.rank == 0 {
                tracing::warn!(
                    "train.cuda_graphs is on but this run trains without CUDA graphs: {reason}"
                );
            }
            None
        }
    }
}

/// The model folder of `channels`, created.
fn model_files(cfg: &Config, channels: &[usize]) -> Result<ModelLayout, TrainError> {
    let files = RunLayout::new(cfg).model(cfg, channels);
    std::fs::create_dir_all(files.dir()).map_err(|source| TrainError::Io {
        path: files.dir().to_path_buf(),
        source,
    })?;
    Ok(files)
}

/// The dataset and the indices of its training split (never empty).
fn training_split(cfg: &Config) -> Result<(SharedSource, Vec<usize>), TrainError> {
    let source = data::open_source(&cfg.data)?;
    let split = data::configured_split(source.index(), &cfg.data, cfg.run.seed as u32)?;
    if split.train.is_empty() {
        return Err(TrainError::EmptySplit);
    }
    Ok((source, split.train))
}

/// Restores the newest checkpoint into `learner`, then hands the learner to the parallel
/// strategy (which may resume newer FSDP shards). Returns the strategy and where the run
/// starts.
fn resume_and_distribute(
    cfg: &Config,
    group: Option<ProcessGroup>,
    files: &ModelLayout,
    (fingerprint, origin): (&str, &DataOrigin),
    learner: &mut Learner,
    rank: usize,
) -> Result<(Box<dyn ParallelStrategy>, Start), TrainError> {
    let resumed = resume::restore_latest(cfg, files, fingerprint, origin, learner, rank)?;
    // A new run starts from `model.init` (every rank reads the same file, so every rank
    // starts from the same weights before the strategy takes over); a resumed one does not.
    if resumed.is_none() {
        crate::train::init::apply(cfg, &cfg.model.init, &learner.nets)?;
    }
    let Chosen {
        mut strategy,
        resumed_shards,
    } = strategy::choose(
        cfg.train.strategy,
        group,
        learner,
        files,
        fingerprint,
        resumed.as_ref().map(|r| r.at.iteration),
        StrategyOptions {
            ddp_overlap: cfg.train.ddp_overlap,
            fsdp_reshard_after_forward: cfg.train.fsdp_reshard_after_forward,
        },
    )?;
    // The weights every rank starts from (after `model.init` or the resume, rank 0's
    // broadcast and FSDP's sharding), so tests and people can check that all start alike (a
    // collective under FSDP: every rank calls it).
    if strategy.world_size() > 1 {
        let sum = strategy.checksum(learner)?;
        tracing::info!(
            start_checksum = sum,
            "student checksum at the start {sum:.12e}"
        );
    }
    // FSDP shards newer than the consolidated checkpoint (or without one) answer for the
    // dataset themselves.
    if let Some(meta) = &resumed_shards {
        origin.check(meta, files.dir(), rank)?;
    }
    let start = match (resumed_shards, resumed) {
        (Some(meta), consolidated) => Start::from_shards(&meta, consolidated.is_some()),
        (None, Some(consolidated)) => consolidated,
        (None, None) => Start::default(),
    };
    Ok((strategy, start))
}

/// The job's process group, `None` for a world of one. A stop signal while this rank waits
/// for the others (in a multi-rank pipeline, for rank 0's single-rank stages) ends the run
/// before it starts ([`TrainError::StoppedBeforeStart`]).
fn join_group(
    cfg: &Config,
    denv: &DistEnv,
    cuda: bool,
    stop: Option<&AtomicBool>,
) -> Result<Option<ProcessGroup>, TrainError> {
    if denv.world <= 1 {
        return Ok(None);
    }
    let group = ProcessGroup::join_unless_stopped(
        &denv.master_addr,
        denv.master_port,
        denv.rank,
        denv.world,
        Duration::from_secs(cfg.train.dist_timeout_seconds),
        cuda,
        stop,
    )?
    .ok_or(TrainError::StoppedBeforeStart)?;
    if denv.rank == 0 {
        tracing::info!(
            "distributed: {} ranks ({}), master {}:{}",
            denv.world,
            denv.source,
            denv.master_addr,
            denv.master_port
        );
    }
    Ok(Some(group))
}

/// The dataset mean/std of the selected `channels`. Rank 0 computes the statistics (once per
/// run folder); the others read them once it is done.
fn run_mean_std(
    cfg: &Config,
    source: &dyn ImageSource,
    channels: &[usize],
    rank: usize,
    group: Option<&mut ProcessGroup>,
) -> Result<(Vec<f32>, Vec<f32>), TrainError> {
    let ms = if rank == 0 {
        Some(dataset_mean_std(cfg, source)?)
    } else {
        None
    };
    if let Some(g) = group {
        g.barrier()?;
    }
    let ms = match ms {
        Some(ms) => ms,
        None => MeanStd::read(&RunLayout::new(cfg).mean_std())?,
    };
    if ms.mean.len() != cfg.file_channels() {
        return Err(TrainError::MeanStdChannels {
            found: ms.mean.len(),
            expected: cfg.file_channels(),
        });
    }
    Ok(ms.select(channels, &cfg.data.channel_names))
}

/// The peak lr (scaled to the global batch) and the per-iteration schedules.
fn schedules(cfg: &Config, shape: &RunShape) -> (f64, Schedules) {
    let (batch, world) = (shape.batch, shape.world);
    let peak_lr = scale_lr(cfg.train.lr_scaling, cfg.train.lr, batch, world);
    if shape.rank == 0 {
        tracing::info!(
            "lr: {} per 256 images, {:?} scaling to the global batch {} ({world} x {batch}): peak lr {peak_lr:e}",
            cfg.train.lr,
            cfg.train.lr_scaling,
            batch * world
        );
    }
    (peak_lr, Schedules::new(&cfg.train, peak_lr, shape.niter))
}

fn checkpoint_writer(
    cfg: &Config,
    files: ModelLayout,
    fingerprint: String,
    dataset: String,
    mean: Vec<f32>,
    std: Vec<f32>,
) -> CheckpointWriter {
    CheckpointWriter {
        files,
        seed: cfg.run.seed,
        fingerprint,
        dataset,
        config_yaml: cfg.to_yaml(),
        mean,
        std,
    }
}
