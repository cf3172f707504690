//! The epoch loop of `trainer train`: data, schedules, steps, checkpoints, logs and metrics,
//! with automatic and exact resume.
//!
//! Reproducibility contract: the sample order is a function of (seed, epoch, rank), each
//! sample's augmentation of (seed, epoch, index), and libtorch's generator is re-seeded from
//! (seed, iteration) before every step. A checkpoint therefore only needs weights, optimizer
//! state, loss centre and the position (epoch, batch, iteration) for a resumed run to
//! continue bit for bit as if it had never stopped (CPU, fixed thread count).
use super::ahead::ahead;
use super::bag::BagOfChannels;
use super::channels::hierarchical_sample;
use super::collapse::{describe, CollapseWatch, TeacherSnapshot};
pub use super::error::TrainError;
use super::flops::{step_flops, Utilisation};
use super::input::{ImageFn, TrainInput};
use super::loader::{BufferPool, EpochLoader, LoadError, LoadedBatch};
use super::loss::DinoLoss;
use super::sampler::{configured_epoch_order, iters_per_epoch};
use super::schedule::{scale_lr, teacher_temp_schedule, Schedules};
use super::step::{ChannelSubset, Learner, Networks, StepParams};
use super::strategy::{self, Chosen, ParallelStrategy, StrategyOptions};
use super::telemetry::{StepRecord, Telemetry};
use crate::analysis::mean_std::{self, MeanStd};
use crate::augment::{AugmentOps, MultiCropAugment, MultiCropConfig};
use crate::checkpoint::{self, CheckpointMeta, EpochTotals};
use crate::config::{ChannelMode, Config, OnCollapse, OnCorrupt};
use crate::data::preprocess::preprocess_into;
use crate::data::quality;
use crate::data::{self, ImageChw, ImageSource, PreprocessOptions, SharedSource};
use crate::device::CudaFacts;
use crate::dist::env::DistEnv;
use crate::dist::group::ProcessGroup;
use crate::dist::Collective;
use crate::layout::RunLayout;
use scdino_base::rng::SplitMix64;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Exit code after a checkpoint on SIGUSR1/SIGTERM (Slurm requeues on it).
pub use scdino_base::exit::PREEMPTED as EXIT_PREEMPTED;

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
    /// Set asynchronously (signal handler) to request a checkpoint and stop.
    pub stop: Option<Arc<AtomicBool>>,
}

/// The fields a resume must agree on: they change the shape or meaning of the weights.
/// `model.channels` is in it only when not `fixed`, so that checkpoints written before the
/// key existed still resume.
fn fingerprint(cfg: &Config, channels: &[usize]) -> String {
    let m = &cfg.model;
    let mut fp = serde_json::json!({
        "arch": m.arch,
        "patch_size": m.patch_size,
        "out_dim": m.out_dim,
        "use_bn_in_head": m.use_bn_in_head,
        "norm_last_layer": m.norm_last_layer,
        "channels": channels,
        "channel_names": channels.iter().map(|&c| &cfg.data.channel_names[c]).collect::<Vec<_>>(),
    });
    if m.channels.is_adaptive() {
        fp["model_channels"] = m.channels.name().into();
    }
    if m.num_register_tokens > 0 {
        fp["num_register_tokens"] = m.num_register_tokens.into();
    }
    fp.to_string()
}

/// `{output_dir}/{name}/scDINO_ViTs/{model}_channel_{names}` (see [`crate::layout`]).
pub fn model_dir(cfg: &Config, channels: &[usize]) -> PathBuf {
    RunLayout::new(cfg).model(cfg, channels).dir().to_path_buf()
}

/// Loads `mean_and_std_of_dataset.txt` from the run folder, computing it first if missing.
pub fn dataset_mean_std(cfg: &Config, source: &dyn ImageSource) -> Result<MeanStd, TrainError> {
    dataset_mean_std_at(cfg, source, &RunLayout::new(cfg).mean_std())
}

/// [`dataset_mean_std`] with an explicit file.
pub fn dataset_mean_std_at(
    cfg: &Config,
    source: &dyn ImageSource,
    path: &Path,
) -> Result<MeanStd, TrainError> {
    let path = path.to_path_buf();
    if path.exists() {
        return Ok(MeanStd::read(&path)?);
    }
    tracing::info!("computing dataset mean/std -> {}", path.display());
    let threads = cfg.data.num_workers.max(1);
    let (ms, quality) = mean_std::compute_with(
        source,
        cfg.data.mean_std_fraction,
        cfg.data.center_crop,
        threads,
        cfg.data.on_corrupt,
    )?;
    quality.warn(&cfg.data.channel_names, &cfg.used_channels());
    std::fs::create_dir_all(cfg.run_dir()).map_err(|source| TrainError::Io {
        path: cfg.run_dir(),
        source,
    })?;
    ms.write(&path)?;
    Ok(ms)
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Trains one channel combination of `cfg` on this process (single-process for now).
pub fn train(cfg: &Config, opts: &TrainOptions) -> Result<TrainOutcome, TrainError> {
    let channels = cfg
        .training_channels(opts.combination)
        .ok_or(TrainError::NoCombination {
            index: opts.combination,
            count: cfg.channel_sets.len(),
        })?;
    let run_files = RunLayout::new(cfg);
    let files = run_files.model(cfg, &channels);
    let out_dir = files.dir().to_path_buf();
    std::fs::create_dir_all(&out_dir).map_err(io_err(&out_dir))?;

    let source = data::open_source(&cfg.data)?;
    let index = source.index();
    let split =
        data::train_heldout_split(index.len(), cfg.data.train_fraction, cfg.run.seed as u32)?;
    if split.train.is_empty() {
        return Err(TrainError::EmptySplit);
    }
    let denv = DistEnv::from_process_env()?;
    let (world, rank) = (denv.world, denv.rank);
    let device = crate::device::resolve(cfg.train.device, denv.local_rank, CudaFacts::probe())?;
    if rank == 0 || device.is_cuda() {
        tracing::info!("training on {device:?}");
    }
    let mut group = if world > 1 {
        let timeout = Duration::from_secs(cfg.train.dist_timeout_seconds);
        let group = ProcessGroup::new(
            &denv.master_addr,
            denv.master_port,
            rank,
            world,
            timeout,
            device.is_cuda(),
        )?;
        if rank == 0 {
            tracing::info!(
                "distributed: {world} ranks ({}), master {}:{}",
                denv.source,
                denv.master_addr,
                denv.master_port
            );
        }
        Some(group)
    } else {
        None
    };
    // Rank 0 computes the statistics; the others read them once it is done.
    let ms = if rank == 0 {
        Some(dataset_mean_std(cfg, source.as_ref())?)
    } else {
        None
    };
    if let Some(g) = &mut group {
        g.barrier()?;
    }
    let ms = match ms {
        Some(ms) => ms,
        None => MeanStd::read(&run_files.mean_std())?,
    };
    if ms.mean.len() != cfg.file_channels() {
        return Err(TrainError::MeanStdChannels {
            found: ms.mean.len(),
            expected: cfg.file_channels(),
        });
    }
    let (mean, std) = ms.select(&channels, &cfg.data.channel_names);

    // Bag-of-Channels trains on (image, channel) items; every other mode on images.
    let bag =
        (cfg.model.channels == ChannelMode::Bag).then(|| Arc::new(BagOfChannels::new(&mean, &std)));
    let train_items = match &bag {
        Some(b) => b.items(&split.train),
        None => split.train.clone(),
    };
    let batch = cfg.train.batch_size_per_gpu;
    let niter = iters_per_epoch(train_items.len(), world, batch);
    let peak_lr = scale_lr(cfg.train.lr_scaling, cfg.train.lr, batch, world);
    if rank == 0 {
        tracing::info!(
            "lr: {} per 256 images, {:?} scaling to the global batch {} ({world} x {batch}): peak lr {peak_lr:e}",
            cfg.train.lr,
            cfg.train.lr_scaling,
            batch * world
        );
    }
    let sched = Schedules::new(&cfg.train, peak_lr, niter);
    let t = &cfg.train;
    let temps = teacher_temp_schedule(
        t.warmup_teacher_temp,
        t.teacher_temp,
        t.warmup_teacher_temp_epochs,
        t.epochs,
    );
    let ncrops = 2 + cfg.augment.local_crops_number;

    tch::manual_seed(cfg.run.seed as i64);
    crate::precision::check_supported(cfg.train.precision, device)?;
    let nets = Networks::new(cfg, channels.len(), device);
    let loss_fn = DinoLoss::new(cfg.model.out_dim as i64, ncrops, temps, device);
    let mut learner = Learner::new(nets, loss_fn, cfg.train.precision, device);
    learner.koleo_weight = cfg.train.koleo_weight;
    learner.centering = cfg.train.centering;
    let fp = fingerprint(cfg, &channels);

    let (mut epoch, mut start_batch, mut iteration) = (0usize, 0usize, 0usize);
    let mut meter = EpochTotals::default();
    let resumed = checkpoint::load_latest(&out_dir, &mut |w| tracing::warn!("{w}"))?;
    if let Some(ck) = &resumed {
        strategy::restore(ck, &fp, &mut learner)?;
        (epoch, start_batch, iteration) = (ck.meta.epoch, ck.meta.epoch_batch, ck.meta.iteration);
        meter = ck.meta.epoch_totals.clone();
        tracing::info!(
            "resuming from {} at epoch {epoch}, batch {start_batch} (iteration {iteration})",
            ck.path.display()
        );
        if rank == 0 {
            if let Some(note) = schedule_change_note(&ck.meta.config_yaml, cfg, iteration) {
                tracing::warn!("{note}");
            }
        }
    }
    let Chosen {
        mut strategy,
        resumed_shards,
    } = strategy::choose(
        cfg.train.strategy,
        group,
        &mut learner,
        &files,
        &fp,
        resumed.as_ref().map(|ck| ck.meta.iteration),
        StrategyOptions {
            ddp_overlap: cfg.train.ddp_overlap,
            fsdp_reshard_after_forward: cfg.train.fsdp_reshard_after_forward,
        },
    )?;
    if let Some(meta) = &resumed_shards {
        (epoch, start_batch, iteration) = (meta.epoch, meta.epoch_batch, meta.iteration);
        meter = meta.epoch_totals.clone();
    }
    let config_yaml = cfg.to_yaml();
    if rank == 0 {
        write_run_log(
            &files.run_log(),
            cfg,
            &channels,
            niter,
            peak_lr,
            resumed.is_some(),
        )?;
        trim_log(&files.log(), epoch)?;
    }

    let (augment_mean, augment_std) = match &bag {
        Some(_) => BagOfChannels::augment_mean_std(),
        None => (mean.clone(), std.clone()),
    };
    let augment = MultiCropAugment::new(MultiCropConfig {
        global_crops_scale: cfg.augment.global_crops_scale,
        local_crops_scale: cfg.augment.local_crops_scale,
        global_size: cfg.augment.global_crop_size,
        local_size: cfg.augment.local_crop_size,
        local_crops_number: cfg.augment.local_crops_number,
        mean: augment_mean,
        std: augment_std,
        ops: AugmentOps::from(&cfg.augment),
    })
    .map_err(TrainError::Augment)?;
    let input = TrainInput::new(Arc::new(augment), cfg.augment.augment_on, cfg.run.seed);
    let prep = PreprocessOptions {
        selected_channels: Some(channels.clone()),
        center_crop: cfg.data.center_crop,
    };
    let file_channels = cfg.file_channels();

    let mut telemetry = Telemetry::new(rank, &files, &cfg.run.name)?;
    // FLOPs grow linearly with the batch, so a window's work is this times its images.
    let flops_per_image = step_flops(cfg, channels.len(), 1).total();
    let gpu = match device {
        tch::Device::Cuda(i) => crate::gpu::GpuMonitor::open(i),
        _ => None,
    };
    let peak_tflops =
        crate::gpu::mfu_peak(cfg.train.peak_tflops, gpu.as_ref(), cfg.train.precision);

    let save = |strategy: &mut dyn ParallelStrategy,
                learner: &Learner,
                (epoch, epoch_batch, iteration): (usize, usize, usize),
                totals: &EpochTotals,
                numbered: bool| {
        let meta = CheckpointMeta {
            format: checkpoint::FORMAT.into(),
            epoch,
            epoch_batch,
            iteration,
            seed: cfg.run.seed,
            fingerprint: fp.clone(),
            config_yaml: config_yaml.clone(),
            mean: mean.clone(),
            std: std.clone(),
            epoch_totals: totals.clone(),
            loss_scaler: learner.scaler.clone(),
        };
        let numbered = numbered.then(|| files.numbered_checkpoint(epoch - 1));
        strategy.save(learner, &files, &meta, numbered)
    };

    // Collapse is judged once the lr and teacher-temperature warm-ups are over (and never in
    // the first epoch, where an untrained head can look flat).
    let warmups = (cfg.train.warmup_epochs)
        .max(cfg.train.warmup_teacher_temp_epochs)
        .max(1);
    let mut collapse_watch = CollapseWatch::new(warmups * niter);
    // A collapse to stop on, seen on an epoch's last batch (stopped after the epoch's save).
    let mut collapsed: Option<String> = None;
    let corrupt_skipped = Arc::new(AtomicU64::new(0));
    // Enough sets for every batch in flight: 2 per worker prefetched, one prepared ahead,
    // one in the step, one being handed back.
    let batch_pool = BufferPool::new(2 * cfg.data.num_workers.max(1) + 3);
    tracing::info!("data: {}", source.describe());
    while epoch < cfg.train.epochs {
        let order = configured_epoch_order(
            &cfg.data,
            source.as_ref(),
            &train_items,
            cfg.run.seed,
            epoch as u64,
            rank,
            world,
        )?;
        // A resumed epoch starts at `start_batch`: announce only what will be read.
        let ahead_items = &order[(start_batch * batch).min(order.len())..];
        match &bag {
            Some(b) => source.will_read(&b.images_of(ahead_items)),
            None => source.will_read(ahead_items),
        }
        let skip_corrupt =
            (cfg.data.on_corrupt == OnCorrupt::Skip).then(|| corrupt_skipped.clone());
        let images = training_image_fn(
            source.clone(),
            prep.clone(),
            file_channels,
            cfg.data.channel_names.clone(),
            skip_corrupt,
        );
        let images = match &bag {
            Some(b) => b.image_fn(images),
            None => images,
        };
        let sample = input.samples(images, epoch as u64, &order)?;
        let workers = cfg.data.num_workers.max(1);
        let loader = EpochLoader::new(
            order,
            batch,
            workers,
            2 * workers,
            start_batch,
            sample,
            batch_pool.clone(),
        );
        // Crops (and with `augment_on: device`, the augmentation) of the next batch are made
        // on their own thread while this one runs the current step.
        let (crop_input, crop_epoch) = (input.clone(), epoch as u64);
        let crop_bag = bag.clone();
        let batches = ahead(loader, move |loaded| -> Result<_, LoadError> {
            let b = loaded?;
            if b.indices.is_empty() {
                return Ok((b, Vec::new()));
            }
            let crops = crop_input
                .crops(&b, crop_epoch, device)
                .map_err(LoadError::Crops)?;
            let crops = match &crop_bag {
                Some(bag) => bag.normalise(&b.indices, crops),
                None => crops,
            };
            Ok((b, crops))
        });
        let mut window = (Instant::now(), 0usize, 0.0f64); // (since, images, data wait s)
        let progress = Progress::new(epoch, cfg.train.epochs, niter, start_batch, rank == 0);
        let epoch_start = Instant::now();
        for prepared in batches {
            let ((mut b, crops), wait) = prepared?;
            b.wait = wait;
            if b.indices.is_empty() {
                tracing::warn!(
                    "batch {} of epoch {epoch} has no usable image; skipped",
                    b.batch_no
                );
                iteration += 1;
                continue;
            }
            let params = StepParams {
                lr: sched.lr[iteration.min(sched.lr.len() - 1)],
                weight_decay: sched.weight_decay[iteration.min(sched.lr.len() - 1)],
                momentum: sched.momentum[iteration.min(sched.lr.len() - 1)],
                epoch,
                freeze_last_layer: epoch < cfg.train.freeze_last_layer,
                clip_grad: cfg.train.clip_grad,
                rng_seed: step_seed(cfg.run.seed, iteration),
                channels: (cfg.model.channels == ChannelMode::Tokens).then(|| {
                    ChannelSubset::from_indices(&hierarchical_sample(
                        cfg.run.seed,
                        iteration,
                        channels.len(),
                    ))
                }),
            };
            let out = learner.step(&crops, params, iteration, strategy.as_mut())?;
            if out.skipped {
                tracing::warn!("fp16: gradient overflow at iteration {iteration}; step skipped, loss scale lowered");
            }
            meter.loss += out.loss;
            meter.lr += params.lr;
            meter.wd += params.weight_decay;
            meter.steps += 1;
            window.1 += b.indices.len();
            window.2 += b.wait.as_secs_f64();
            iteration += 1;
            let done_in_epoch = b.batch_no + 1;
            // The step is done with this batch: its tensors go back to the loader.
            drop(crops);
            let LoadedBatch { crops, buffers, .. } = b;
            drop(crops);
            // SAFETY: the step has finished (backward, optimizer, EMA), the model's crops and
            // the batch's views are dropped just above, and nothing else took a handle.
            unsafe { batch_pool.put(buffers) };
            progress.step(out.loss);

            if iteration % cfg.train.log_every == 0 || done_in_epoch == niter {
                let secs = window.0.elapsed().as_secs_f64().max(1e-9);
                let imgs_per_s = window.1 as f64 / secs;
                let teacher =
                    TeacherSnapshot::gather(&out.teacher.stats(), out.loss, strategy.collective())?;
                let utilisation =
                    Utilisation::measure(flops_per_image, window.1 as f64, secs, peak_tflops);
                let mfu = utilisation
                    .mfu
                    .map(|m| format!("  MFU: {:.1}%", 100.0 * m))
                    .unwrap_or_default();
                let gpu_now = gpu.as_ref().and_then(|g| g.sample());
                let gpu_text = gpu_now
                    .map(|g| {
                        format!(
                            "  GPU: {:.0}% {:.1}/{:.1} GB",
                            g.utilization_percent,
                            g.memory_used_bytes / 1e9,
                            g.memory_total_bytes / 1e9
                        )
                    })
                    .unwrap_or_default();
                if progress.shown() {
                    tracing::info!(
                        target: "trainer::progress",
                        epoch,
                        iteration,
                        loss = out.loss,
                        lr = params.lr,
                        weight_decay = params.weight_decay,
                        images_per_second = imgs_per_s,
                        teacher_entropy = teacher.teacher_entropy,
                        kl = teacher.kl,
                        prototypes = teacher.prototypes_in_use,
                        flops_per_second = utilisation.flops_per_second,
                        mfu = utilisation.mfu,
                        gpu_utilization_percent = gpu_now.map(|g| g.utilization_percent),
                        gpu_memory_used_bytes = gpu_now.map(|g| g.memory_used_bytes),
                        "{}",
                        format_args!(
                            "Epoch: [{epoch}/{}]  [{done_in_epoch}/{niter}]  loss: {:.6} ({:.6})  lr: {:.6e}  wd: {:.6}  imgs/s: {imgs_per_s:.1}  data: {:.3}s  step: {:.3}s  teacher H: {:.3}  KL: {:.3}  prototypes: {}/{}  TFLOP/s: {:.3}{mfu}{gpu_text}",
                            cfg.train.epochs,
                            out.loss,
                            meter.loss / meter.steps as f64,
                            params.lr,
                            params.weight_decay,
                            window.2,
                            secs / (window.1 as f64 / batch as f64).max(1.0),
                            teacher.teacher_entropy,
                            teacher.kl,
                            teacher.prototypes_in_use,
                            teacher.out_dim,
                            utilisation.flops_per_second / 1e12,
                        )
                    );
                }
                telemetry.step(&StepRecord {
                    iteration,
                    epoch,
                    loss: out.loss,
                    lr: params.lr,
                    weight_decay: params.weight_decay,
                    momentum: params.momentum,
                    teacher_temp: learner.loss.teacher_temp(epoch),
                    images_per_second: imgs_per_s,
                    data_wait_seconds: window.2,
                    teacher: &teacher,
                    utilisation,
                    gpu: gpu_now,
                })?;
                window = (Instant::now(), 0, 0.0);
                if let Some(kind) = collapse_watch.observe(iteration, &teacher) {
                    let text = describe(kind, &teacher, iteration);
                    match cfg.train.on_collapse {
                        OnCollapse::Warn => {
                            if rank == 0 {
                                tracing::warn!(
                                    "{text} (train.on_collapse: stop would end the run here)"
                                );
                            }
                        }
                        OnCollapse::Stop if done_in_epoch < niter => {
                            let at = (epoch, done_in_epoch, iteration);
                            save(strategy.as_mut(), &learner, at, &meter, false)?;
                            telemetry.flush()?;
                            return Err(TrainError::Collapsed(text));
                        }
                        // On an epoch's last batch the end-of-epoch checkpoint and log line
                        // below are the exact position; the run stops after them.
                        OnCollapse::Stop => collapsed = Some(text),
                    }
                }
            }

            let stop_requested = agree(
                strategy.collective(),
                opts.stop.as_ref().is_some_and(|f| f.load(Ordering::SeqCst)),
            )?;
            let step_limit = opts.max_steps.is_some_and(|m| iteration >= m);
            if (stop_requested || step_limit) && done_in_epoch < niter {
                let at = (epoch, done_in_epoch, iteration);
                save(strategy.as_mut(), &learner, at, &meter, false)?;
                telemetry.flush()?;
                tracing::info!("checkpoint written at epoch {epoch}, batch {done_in_epoch} (iteration {iteration})");
                report_checksum(strategy.as_mut(), &learner)?;
                return Ok(if stop_requested {
                    TrainOutcome::Preempted
                } else {
                    TrainOutcome::StepLimit
                });
            }
        }
        progress.finish();
        // End of epoch: checkpoint first, then the log line (a crash in between re-logs).
        let finished = epoch + 1;
        let numbered = epoch % cfg.train.checkpoint_every == 0 || finished == cfg.train.epochs;
        let at = (finished, 0, iteration);
        save(
            strategy.as_mut(),
            &learner,
            at,
            &EpochTotals::default(),
            numbered,
        )?;
        let n = meter.steps.max(1) as f64;
        let line = serde_json::json!({
            "train_loss": meter.loss / n,
            "train_lr": meter.lr / n,
            "train_wd": meter.wd / n,
            "epoch": epoch,
        });
        telemetry.epoch(finished, &line, meter.loss / n)?;
        if let Some(text) = collapsed.take() {
            telemetry.flush()?;
            return Err(TrainError::Collapsed(text));
        }
        if rank == 0 {
            tracing::info!(
                "Epoch: [{epoch}/{}] Total time: {:.1}s ({:.3} s / it)",
                cfg.train.epochs,
                epoch_start.elapsed().as_secs_f64(),
                epoch_start.elapsed().as_secs_f64() / meter.steps.max(1) as f64
            );
        }
        // Every rank reports its own transfers (each fetches only its own samples).
        if let Some(r) = source.report() {
            tracing::info!("epoch {epoch}: {r}");
        }
        let skipped = corrupt_skipped.swap(0, Ordering::Relaxed);
        if skipped > 0 {
            tracing::info!(
                "epoch {epoch}: skipped {skipped} corrupt image(s) (data.on_corrupt: skip)"
            );
        }
        epoch = finished;
        start_batch = 0;
        meter = EpochTotals::default();
        let stop_requested = agree(
            strategy.collective(),
            opts.stop.as_ref().is_some_and(|f| f.load(Ordering::SeqCst)),
        )?;
        if stop_requested && epoch < cfg.train.epochs {
            report_checksum(strategy.as_mut(), &learner)?;
            return Ok(TrainOutcome::Preempted);
        }
        if opts.max_steps.is_some_and(|m| iteration >= m) && epoch < cfg.train.epochs {
            report_checksum(strategy.as_mut(), &learner)?;
            return Ok(TrainOutcome::StepLimit);
        }
    }
    report_checksum(strategy.as_mut(), &learner)?;
    Ok(TrainOutcome::Finished)
}

/// Lets tests (and people) check that data parallelism kept the ranks identical (a
/// collective under FSDP: every rank calls this).
fn report_checksum(
    strategy: &mut dyn ParallelStrategy,
    learner: &Learner,
) -> Result<(), TrainError> {
    if strategy.world_size() > 1 {
        let sum = strategy.checksum(learner)?;
        tracing::info!(checksum = sum, "student parameter checksum {sum:.12e}");
    }
    Ok(())
}

/// True on every rank if it is true on any (a stop signal may reach only some ranks first).
fn agree(group: &mut dyn Collective, flag: bool) -> Result<bool, TrainError> {
    if group.world_size() == 1 {
        return Ok(flag);
    }
    let mut t = tch::Tensor::from_slice(&[f64::from(u8::from(flag))]);
    group.all_reduce_sum(&mut t)?;
    Ok(t.double_value(&[0]) > 0.0)
}

/// What a loader worker reads for one dataset index during training: the TIFF, its channel
/// count checked, channels selected / cropped / min–max scaled into the caller's buffer
/// (a constant channel or a NaN pixel is guarded and named once per process, see
/// [`crate::data::quality`]; scDINO dropped such an image). [`TrainInput`] augments it. With `data.on_corrupt: skip` (a counter given), an undecodable image is
/// dropped and counted too. The file bytes and the decoded image live in per-thread buffers,
/// so a worker allocates nothing per sample (for uncompressed TIFFs from files or shards).
pub fn training_image_fn(
    source: SharedSource,
    prep: PreprocessOptions,
    file_channels: usize,
    channel_names: Vec<String>,
    skip_corrupt: Option<Arc<AtomicU64>>,
) -> Arc<ImageFn> {
    thread_local! {
        static READ: std::cell::RefCell<(Vec<u8>, ImageChw)> = Default::default();
    }
    Arc::new(move |i: usize, out: &mut ImageChw| {
        READ.with(|buffers| {
            let (bytes, raw) = &mut *buffers.borrow_mut();
            match source.read_into(i, bytes, raw) {
                Ok(()) => {}
                Err(e) if e.is_corrupt_image() && skip_corrupt.is_some() => {
                    if let Some(n) = &skip_corrupt {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::warn!("skipping corrupt image (data.on_corrupt: skip): {e}");
                    return Ok(false);
                }
                Err(e) => return Err(e.into()),
            }
            if raw.channels != file_channels {
                return Err(LoadError::ChannelCount {
                    path: source.index().samples[i].path.clone(),
                    found: raw.channels,
                    expected: file_channels,
                });
            }
            let notes = preprocess_into(raw, &prep, out)?;
            if notes.first_constant_channel.is_some() || notes.nonfinite_pixels > 0 {
                let path = &source.index().samples[i].path;
                if let Some(k) = notes.first_constant_channel {
                    let channel = prep.selected_channels.as_ref().map_or(k, |sel| sel[k]);
                    quality::constant_channel(channel, &channel_names, path);
                }
                if notes.nonfinite_pixels > 0 {
                    quality::nonfinite_pixels(notes.nonfinite_pixels, path);
                }
            }
            Ok(true)
        })
    })
}

/// What a resume with other `train.epochs` (or schedule keys) than the checkpoint's does: the
/// cosine lr, weight-decay and teacher-momentum schedules span the whole run, so they are
/// recomputed for the new length and change from the resumed iteration on (the weights are
/// still the checkpoint's). `None` when nothing that shapes a schedule changed.
pub fn schedule_change_note(saved_yaml: &str, cfg: &Config, iteration: usize) -> Option<String> {
    let saved = Config::from_yaml(saved_yaml, "checkpoint").ok()?;
    let old = serde_json::to_value(&saved.train).ok()?;
    let new = serde_json::to_value(&cfg.train).ok()?;
    let changed: Vec<String> = [
        "epochs",
        "lr",
        "min_lr",
        "warmup_epochs",
        "weight_decay",
        "weight_decay_end",
        "momentum_teacher",
        "warmup_teacher_temp",
        "teacher_temp",
        "warmup_teacher_temp_epochs",
    ]
    .iter()
    .filter(|key| old[**key] != new[**key])
    .map(|key| format!("train.{key} {} → {}", old[*key], new[*key]))
    .collect();
    (!changed.is_empty()).then(|| {
        format!(
            "the checkpoint was trained with other schedule settings ({}): the lr, weight-decay, \
             teacher-momentum and teacher-temperature schedules are recomputed for the new \
             settings and change from iteration {iteration} on; the run is no longer the one the \
             checkpoint started",
            changed.join(", ")
        )
    })
}

/// libtorch's generator seed for one iteration (drop path draws).
fn step_seed(seed: u64, iteration: usize) -> i64 {
    let mut r = SplitMix64::new(seed ^ (iteration as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (r.next_u64() >> 1) as i64
}

/// scDINO's `run_log.txt`: the seed line, then one `name : value` line per setting.
fn write_run_log(
    path: &Path,
    cfg: &Config,
    channels: &[usize],
    niter: usize,
    lr: f64,
    resumed: bool,
) -> Result<(), TrainError> {
    let mut text = format!(
        "successfully computed features with seed {}: \nparameters: \n",
        cfg.run.seed
    );
    text.push_str(&format!("selected_channels : {channels:?} \n"));
    text.push_str(&format!("iterations_per_epoch : {niter} \n"));
    text.push_str(&format!("scaled_lr : {lr} \n"));
    text.push_str(&format!("resumed : {resumed} \n"));
    for line in cfg.to_yaml().lines() {
        text.push_str(line);
        text.push_str(" \n");
    }
    data::tiff_reader::write_atomic(path, text.as_bytes())?;
    Ok(())
}

/// Keeps only the log lines of epochs before `epoch` (a resumed run rewrites the rest).
fn trim_log(path: &Path, epoch: usize) -> Result<(), TrainError> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["epoch"].as_u64())
                .is_some_and(|e| (e as usize) < epoch)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    if kept != text {
        data::tiff_reader::write_atomic(path, kept.as_bytes())?;
    }
    Ok(())
}

/// Progress for a person at a terminal; plain lines for Slurm logs and pipes. The lines are
/// the same either way (printed above the bar on a terminal).
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    /// Ranks other than 0 stay silent (their lines would repeat rank 0's global values).
    quiet: bool,
}

impl Progress {
    fn new(epoch: usize, epochs: usize, niter: usize, done: usize, shown: bool) -> Self {
        use std::io::IsTerminal;
        if !shown {
            return Self {
                bar: None,
                quiet: true,
            };
        }
        let text_log = scdino_base::log::current_format() == scdino_base::log::LogFormat::Text;
        if !text_log || !std::io::stderr().is_terminal() {
            return Self {
                bar: None,
                quiet: false,
            };
        }
        let bar = indicatif::ProgressBar::new(niter as u64);
        let style = indicatif::ProgressStyle::with_template(
            "epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({eta} left)",
        )
        .expect("static template")
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(format!("{epoch}/{epochs}"));
        bar.set_position(done as u64);
        crate::logging::show_bar(Some(bar.clone()));
        Self {
            bar: Some(bar),
            quiet: false,
        }
    }

    fn step(&self, loss: f64) {
        if let Some(b) = &self.bar {
            b.inc(1);
            b.set_message(format!("loss {loss:.4}"));
        }
    }

    /// Whether this rank prints progress lines (its lines go above the bar, through
    /// `logging::show_bar`).
    fn shown(&self) -> bool {
        !self.quiet
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            crate::logging::show_bar(None);
            b.finish_and_clear();
        }
    }
}
