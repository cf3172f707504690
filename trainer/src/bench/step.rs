//! `trainer bench step`: one full DINO iteration (`Learner::step`: teacher on the globals,
//! student on every crop, loss, backward, clip, AdamW, EMA) timed on random crops made once, or
//! fed by training's own input pipeline (peer: bench/train_step.py).
use super::{config_values, invalid, yaml_name, BatchShape, BenchError};
use crate::augment::{MultiCropAugment, MultiCropConfig};
use crate::config::{
    AugmentOn, ChannelMode, Config, DeviceChoice, Precision, Sections, TeacherChannels,
};
use crate::data::mean_std;
use crate::data::{LocalSource, PreprocessOptions, SharedSource};
use crate::model::channels::{for_mode, ChannelModeKind};
use crate::train::channels::teacher_channels;
use crate::train::graphed::{self, GraphedStep};
use crate::train::input::TrainInput;
use crate::train::loader::{BufferPool, EpochLoader, LoadedBatch};
use crate::train::run::training_image_fn;
use crate::train::sampler::epoch_order;
use crate::train::schedule::scaled_lr;
use crate::train::step::{ChannelSubset, Learner, StepParams};
use crate::train::strategy::SingleProcess;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoaderMode {
    /// Random crops held in memory: times `Learner::step` alone.
    None,
    /// The training input pipeline (TIFF, min–max, multi-crop, EpochLoader): times the
    /// wall clock of each step including the wait for its batch.
    Real,
}

/// What `trainer bench step` measures (its flags).
#[derive(Debug, Clone, clap::Args)]
pub struct StepOptions {
    #[command(flatten)]
    pub shape: BatchShape,
    #[arg(long, default_value_t = 224)]
    pub global_size: usize,
    #[arg(long, default_value_t = 96)]
    pub local_size: usize,
    #[arg(long, value_enum, default_value = "none")]
    pub loader: LoaderMode,
    /// ImageFolder root of TIFFs (e.g. the `Training/` folder `trainer synth` writes);
    /// required with `--loader real`.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Loader worker threads (`--loader real`); prefetch is 2 batches per worker, as in
    /// `trainer train`.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `model.channels` of the benchmarked model (`--loader none` only): `tokens` draws each
    /// step's channel subset by hierarchical sampling, as training does; `bag` runs each
    /// image's channels as single-channel items (batch × channels items per crop), so imgs/s
    /// counts images for every mode.
    #[arg(long, value_parser = config_values(crate::model::channels::all_modes()), default_value = "fixed")]
    pub channel_mode: ChannelMode,
    /// `model.channel_separate_blocks` (`--channel-mode tokens`): the first N blocks attend
    /// within each channel.
    #[arg(long, default_value_t = 0)]
    pub channel_separate_blocks: usize,
    /// `model.channel_mixing_blocks` (`--channel-mode tokens`): the N blocks after the
    /// separate ones attend within each position.
    #[arg(long, default_value_t = 0)]
    pub channel_mixing_blocks: usize,
    /// `train.channel_dino_weight` (`--channel-mode tokens`): a second DINO loss on each
    /// channel's own token, one more head call over batch × channels rows per crop.
    #[arg(long, default_value_t = 0.0)]
    pub channel_dino_weight: f64,
    /// `train.teacher_channels` (`--channel-mode tokens`): `all` runs the teacher over every
    /// channel while the student sees the step's subset.
    #[arg(long, value_parser = config_values(&[TeacherChannels::Step, TeacherChannels::All]), default_value = "step")]
    pub teacher_channels: TeacherChannels,
    /// Where the step runs (`--loader none`; the crops are made there). `cuda` needs a
    /// trainer built with `--features nccl` and takes GPU 0.
    #[arg(long, value_parser = config_values(&[DeviceChoice::Cpu, DeviceChoice::Cuda]), default_value = "cpu")]
    pub device: DeviceChoice,
    /// `train.precision` of the step: bf16 autocast, or fp16 with loss scaling (CUDA only).
    #[arg(long, value_parser = config_values(&[Precision::Fp32, Precision::Bf16, Precision::Fp16]), default_value = "fp32")]
    pub precision: Precision,
    /// `train.cuda_graphs`: with `--device cuda` the step is captured after 3 eager steps and
    /// replayed (time replays with `--warmup 4` or more); on the CPU the same static step runs
    /// eagerly. The output's `losses` then compare with a run without it.
    #[arg(long)]
    pub cuda_graphs: bool,
}

/// What the step benchmark's loops share and record.
struct StepRun<'a> {
    learner: &'a mut Learner,
    params: &'a dyn Fn(usize) -> StepParams,
    group: &'a mut SingleProcess,
    /// Per timed step: (wall seconds, data-wait seconds, images).
    timed: Vec<(f64, f64, usize)>,
    /// Every step's loss (`--loader none`).
    losses: Vec<f64>,
    last_loss: f64,
}

impl StepOptions {
    /// A validated default config with this bench's model and crop settings.
    fn config(&self) -> Result<Config, BenchError> {
        let mut s = Sections::default();
        s.run.seed = self.seed;
        s.model.arch = self.shape.arch;
        s.model.patch_size = self.shape.patch;
        s.model.out_dim = self.shape.out_dim;
        s.model.channels = self.channel_mode;
        s.model.channel_separate_blocks = self.channel_separate_blocks;
        s.model.channel_mixing_blocks = self.channel_mixing_blocks;
        s.train.channel_dino_weight = self.channel_dino_weight;
        s.train.teacher_channels = self.teacher_channels;
        s.train.precision = self.precision;
        s.train.batch_size_per_gpu = self.shape.batch;
        s.augment.global_crop_size = self.global_size;
        s.augment.local_crop_size = self.local_size;
        s.augment.local_crops_number = self.shape.local_crops;
        // scDINO's argparse defaults (also the published model and the AWS runs).
        s.augment.global_crops_scale = (0.4, 1.0);
        s.augment.local_crops_scale = (0.05, 0.4);
        Ok(Config::from_sections(s, "<bench step>")?)
    }

    /// `--cuda-graphs`: the graphed step, refused with the reason where it cannot capture.
    fn graphed(&self, cfg: &Config, device: Device) -> Result<Option<GraphedStep>, BenchError> {
        if !self.cuda_graphs {
            return Ok(None);
        }
        if self.loader != LoaderMode::None {
            return Err(invalid("--cuda-graphs is measured with --loader none"));
        }
        let reason = match device {
            Device::Cpu => graphed::unsupported_step(cfg, 1).map(str::to_string),
            _ => graphed::unsupported(cfg, device, 1),
        };
        if let Some(reason) = reason {
            return Err(invalid(format!("--cuda-graphs: {reason}")));
        }
        Ok(Some(GraphedStep::new(device)))
    }

    /// The `--device` the step runs on, refused where the bench cannot measure it.
    fn device(&self) -> Result<Device, BenchError> {
        let device = match self.device {
            DeviceChoice::Auto => return Err(invalid("--device takes cpu or cuda")),
            DeviceChoice::Cpu => Device::Cpu,
            DeviceChoice::Cuda => {
                if self.loader != LoaderMode::None {
                    return Err(invalid("--device cuda is measured with --loader none"));
                }
                if !tch::Cuda::is_available() {
                    return Err(invalid("--device cuda: libtorch sees no GPU (a trainer built with --features nccl is needed)"));
                }
                Device::Cuda(0)
            }
        };
        if device == Device::Cpu && self.precision == Precision::Fp16 {
            return Err(invalid("--precision fp16 needs --device cuda"));
        }
        Ok(device)
    }

    /// Times the steps; returns the JSON line `trainer bench step` prints.
    pub fn run(&self) -> Result<serde_json::Value, BenchError> {
        if self.shape.iters == 0 {
            return Err(invalid("--iters must be at least 1"));
        }
        if self.channel_mode.is_adaptive() && self.loader != LoaderMode::None {
            // The adaptive modes as the registry has them, so a new one is named here too.
            let adaptive: Vec<&str> = crate::model::channels::all_modes()
                .iter()
                .filter(|m| m.is_adaptive())
                .map(|m| m.name())
                .collect();
            return Err(invalid(format!(
                "--channel-mode {} is measured with --loader none",
                adaptive.join("|")
            )));
        }
        let device = self.device()?;
        tch::set_num_threads(self.shape.threads);
        let cfg = self.config()?;
        let ncrops = 2 + self.shape.local_crops;
        let mut learner = Learner::from_config(&cfg, self.shape.channels, device)?;
        let lr = scaled_lr(cfg.train.lr, self.shape.batch, 1);
        let mode = for_mode(self.channel_mode);
        let params = |it: usize| {
            let channels = mode.step_channels(self.seed, it, self.shape.channels);
            let teacher = teacher_channels(&cfg, channels.as_deref(), self.shape.channels, None);
            StepParams {
                lr,
                weight_decay: cfg.train.weight_decay,
                momentum: cfg.train.momentum_teacher,
                epoch: 0,
                // Off, so the head's last layer is updated as in every epoch after the first.
                freeze_last_layer: false,
                clip_grad: cfg.train.clip_grad,
                rng_seed: it as i64,
                channels: channels.map(|c| ChannelSubset::from_indices(&c)),
                teacher_channels: teacher.map(|c| ChannelSubset::from_indices(&c)),
            }
        };
        let mut group = SingleProcess::default();
        let graphed = self.graphed(&cfg, device)?;
        let mut run = StepRun {
            learner: &mut learner,
            params: &params,
            group: &mut group,
            timed: Vec::with_capacity(self.shape.iters),
            losses: Vec::new(),
            last_loss: f64::NAN,
        };
        match self.loader {
            LoaderMode::None => self.synthetic_steps(&mut run, graphed, ncrops, device, mode)?,
            LoaderMode::Real => self.real_steps(&mut run, &cfg)?,
        }
        Ok(self.report(&run))
    }

    /// Steps on random crops made once (`--loader none`), graphed when asked.
    fn synthetic_steps(
        &self,
        run: &mut StepRun<'_>,
        mut graphed: Option<GraphedStep>,
        ncrops: usize,
        device: Device,
        mode: &dyn ChannelModeKind,
    ) -> Result<(), BenchError> {
        // Waits for the step's queued GPU work (the teacher EMA), so its time holds all of it.
        let sync = || {
            if let Device::Cuda(i) = device {
                tch::Cuda::synchronize(i as i64);
            }
        };
        let (b, c) = if mode.channel_items() {
            ((self.shape.batch * self.shape.channels) as i64, 1)
        } else {
            (self.shape.batch as i64, self.shape.channels as i64)
        };
        let opts = (Kind::Float, device);
        let crops: Vec<Tensor> = (0..ncrops)
            .map(|k| {
                let s = if k < 2 {
                    self.global_size
                } else {
                    self.local_size
                } as i64;
                Tensor::randn([b, c, s, s], opts)
            })
            .collect();
        for it in 0..self.shape.warmup + self.shape.iters {
            let t = Instant::now();
            let out = match &mut graphed {
                Some(g) => g.step(run.learner, &crops, (run.params)(it), it)?,
                None => run.learner.step(&crops, (run.params)(it), it, run.group)?,
            };
            sync();
            run.losses.push(out.loss);
            let secs = t.elapsed().as_secs_f64();
            run.last_loss = out.loss;
            if it >= self.shape.warmup {
                run.timed.push((secs, 0.0, self.shape.batch));
            }
        }
        Ok(())
    }

    /// Steps on batches of training's own input pipeline over `--data` (`--loader real`).
    fn real_steps(&self, run: &mut StepRun<'_>, cfg: &Config) -> Result<(), BenchError> {
        let Some(dir) = &self.data else {
            return Err(invalid(
                "--loader real needs --data DIR (e.g. the Training/ folder of `trainer synth`)",
            ));
        };
        let total = self.shape.warmup + self.shape.iters;
        let pool = BufferPool::new(2 * self.workers.max(1) + 2);
        let mut loader = self.real_loader(cfg, dir, total, pool.clone())?;
        for it in 0..total {
            let t = Instant::now();
            let b = loader.next().ok_or(BenchError::OutOfBatches)??;
            if b.indices.is_empty() {
                return Err(invalid(format!("batch {} has no usable image", b.batch_no)));
            }
            let out = run
                .learner
                .step(&b.crops, (run.params)(it), it, run.group)?;
            let secs = t.elapsed().as_secs_f64();
            run.last_loss = out.loss;
            if it >= self.shape.warmup {
                run.timed
                    .push((secs, b.wait.as_secs_f64(), b.indices.len()));
            }
            let LoadedBatch { crops, buffers, .. } = b;
            drop(crops);
            // SAFETY: the step is over and the batch's views are dropped.
            unsafe { pool.put(buffers) };
        }
        Ok(())
    }

    /// The JSON line of the timed steps.
    fn report(&self, run: &StepRun<'_>) -> serde_json::Value {
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let times: Vec<f64> = run.timed.iter().map(|t| t.0).collect();
        let waits: Vec<f64> = run.timed.iter().map(|t| t.1).collect();
        let images: usize = run.timed.iter().map(|t| t.2).sum();
        let median_s = median(times.clone());
        serde_json::json!({
            "impl": "rust-tch",
            "bench": "step",
            "arch": yaml_name(&self.shape.arch),
            "channel_mode": yaml_name(&self.channel_mode),
            "channel_separate_blocks": self.channel_separate_blocks,
            "channel_mixing_blocks": self.channel_mixing_blocks,
            "channel_dino_weight": self.channel_dino_weight,
            "teacher_channels": yaml_name(&self.teacher_channels),
            "channels": self.shape.channels,
            "device": yaml_name(&self.device),
            "precision": yaml_name(&self.precision),
            "loader": match self.loader { LoaderMode::None => "none", LoaderMode::Real => "real" },
            "batch": self.shape.batch,
            "threads": self.shape.threads,
            "workers": if self.loader == LoaderMode::Real { self.workers } else { 0 },
            "crops": [self.global_size, self.local_size, self.shape.local_crops],
            "out_dim": self.shape.out_dim,
            "median_s": median_s,
            "imgs_per_s": self.shape.batch as f64 / median_s,
            "throughput_imgs_per_s": images as f64 / times.iter().sum::<f64>(),
            "times_s": times,
            "data_wait_s": waits,
            "data_wait_median_s": median(waits.clone()),
            "last_loss": run.last_loss,
            "cuda_graphs": self.cuda_graphs,
            "losses": run.losses,
        })
    }

    /// The input pipeline of `trainer train` (index, TIFF, min–max, multi-crop augmentation,
    /// EpochLoader) over `dir`, for the first `steps` batches of a seeded epoch order.
    /// The sample function is training's own, [`training_image_fn`].
    fn real_loader(
        &self,
        cfg: &Config,
        dir: &std::path::Path,
        steps: usize,
        pool: BufferPool,
    ) -> Result<EpochLoader, BenchError> {
        let source: SharedSource = Arc::new(LocalSource::open(dir, 0)?);
        let index = source.index();
        if index.len() < steps * self.shape.batch {
            return Err(invalid(format!(
                "{} holds {} images; {steps} steps of batch {} need {} (make more with `trainer synth --per-class N`)",
                dir.display(),
                index.len(),
                self.shape.batch,
                steps * self.shape.batch
            )));
        }
        // Computed once before training in `trainer train`, so outside the timing here too.
        let ms = mean_std::compute(source.as_ref(), cfg.data.mean_std_fraction, 0, self.workers)?;
        if ms.mean.len() != self.shape.channels {
            return Err(invalid(format!(
                "{} has {}-channel images, --channels is {}",
                dir.display(),
                ms.mean.len(),
                self.shape.channels
            )));
        }
        let all: Vec<usize> = (0..self.shape.channels).collect();
        let (mean, std) = ms.select(&all, &cfg.data.channel_names);
        let a = &cfg.augment;
        let augment = Arc::new(MultiCropAugment::new(MultiCropConfig {
            global_crops_scale: a.global_crops_scale,
            local_crops_scale: a.local_crops_scale,
            global_size: a.global_crop_size,
            local_size: a.local_crop_size,
            local_crops_number: a.local_crops_number,
            mean,
            std,
            ops: a.into(),
        })?);
        let prep = PreprocessOptions {
            selected_channels: Some(all),
            center_crop: 0,
        };
        let (seed, epoch, file_channels) = (self.seed, 0u64, self.shape.channels);
        let images = training_image_fn(source.clone(), prep, file_channels, Vec::new(), None);
        let order = epoch_order(&(0..index.len()).collect::<Vec<_>>(), seed, epoch, 0, 1);
        let input = TrainInput::new(augment, AugmentOn::Cpu, seed);
        let sample = input.samples(images, epoch, &order)?;
        let workers = self.workers.max(1);
        Ok(EpochLoader::new(
            order,
            self.shape.batch,
            workers,
            2 * workers,
            0,
            sample,
            pool,
        ))
    }
}
