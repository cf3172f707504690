//! Timings for bench/: `model` (student forward+backward of one multi-crop batch, peer
//! bench/model_fwd_bwd.py), `step` (one full DINO iteration, optionally fed by the real
//! loader, peer bench/train_step.py), `loader` (input pipeline throughput per core, peer
//! bench/loader_peer.py) and `matmul` (fp32 matmul peak). The scripts run the
//! PyTorch peers with the same shapes and threads in the same invocation and report ratios.
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};
use trainer::augment::{MultiCropAugment, MultiCropConfig};
use trainer::config::{
    Arch, AugmentOn, ChannelMode, Config, DatasetLocation, DeviceChoice, Precision, Sections,
};
use trainer::data::mean_std;
use trainer::data::{open_source, LocalSource, PreprocessOptions, SharedSource};
use trainer::model::channels::{for_mode, ChannelModeKind};
use trainer::model::{HeadConfig, MultiCropNet, VitConfig};
use trainer::train::graphed::{self, GraphedStep};
use trainer::train::input::TrainInput;
use trainer::train::loader::{BufferPool, EpochLoader, LoadedBatch};
use trainer::train::run::training_image_fn;
use trainer::train::sampler::{configured_epoch_order, epoch_order};
use trainer::train::schedule::scaled_lr;
use trainer::train::step::{ChannelSubset, Learner, StepParams};
use trainer::train::strategy::SingleProcess;

mod profiles;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Student forward + backward of 2 global and N local crops; prints one JSON line.
    Model(ModelBench),
    /// One full DINO iteration (`Learner::step`: teacher on globals, student on all crops,
    /// loss, backward, clip, AdamW, EMA), fp32; prints one JSON line.
    Step(StepBench),
    /// fp32 matmul throughput (n×n · n×n), best of `reps`; prints one JSON line.
    Matmul(MatmulBench),
    /// Input pipeline throughput (TIFF → min–max → multi-crop → batch tensors) without a
    /// model: wall-clock images/s and images per CPU-second; prints one JSON line.
    Loader(LoaderBench),
    /// The linear probe's L-BFGS fit on a safetensors file of features `x` [n, d] and labels
    /// `y` [n] (bench/linear_probe.sh writes it); prints one JSON line.
    Probe(ProbeBench),
    /// Features of N images written and read as scDINO's CSV and as the Parquet profile
    /// table (bench/profiles.sh); prints one JSON line.
    Profiles(profiles::ProfilesBench),
}

#[derive(Debug, Args)]
pub struct ProbeBench {
    #[arg(long)]
    data: std::path::PathBuf,
    /// λ of mean cross-entropy + λ/2·‖W‖².
    #[arg(long, default_value_t = 1e-4)]
    l2: f64,
    #[arg(long, default_value_t = 500)]
    max_iterations: usize,
    #[arg(long, default_value_t = 2)]
    threads: i32,
}

impl ProbeBench {
    fn run(self) -> Result<()> {
        tch::set_num_threads(self.threads);
        let t0 = Instant::now();
        let tensors: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(&self.data)?.into_iter().collect();
        let x = tensors
            .get("x")
            .ok_or_else(|| anyhow::anyhow!("{}: no tensor x", self.data.display()))?;
        let y = Vec::<i64>::try_from(
            tensors
                .get("y")
                .ok_or_else(|| anyhow::anyhow!("{}: no tensor y", self.data.display()))?
                .to_kind(Kind::Int64),
        )?;
        let classes = y.iter().copied().max().unwrap_or(0) as usize + 1;
        let load_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let probe =
            trainer::analysis::linear_probe::fit(x, &y, classes, self.l2, self.max_iterations);
        let fit_s = t1.elapsed().as_secs_f64();
        let pred = Vec::<i64>::try_from(probe.logits(x).argmax(1, false))?;
        let correct = pred.iter().zip(&y).filter(|(a, b)| a == b).count();
        println!(
            "{}",
            serde_json::json!({
                "impl": "rust",
                "bench": "linear_probe",
                "rows": y.len(),
                "dim": x.size()[1],
                "classes": classes,
                "l2": self.l2,
                "threads": self.threads,
                "load_s": load_s,
                "fit_s": fit_s,
                "iterations": probe.iterations,
                "objective": probe.objective,
                "train_top1_percent": correct as f64 * 100.0 / y.len() as f64,
            })
        );
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct ModelBench {
    #[arg(long, value_parser = parse_arch, default_value = "vit_small")]
    arch: Arch,
    #[arg(long, default_value_t = 16)]
    patch: usize,
    #[arg(long, default_value_t = 5)]
    channels: usize,
    /// Images per crop (the per-GPU batch).
    #[arg(long, default_value_t = 4)]
    batch: i64,
    #[arg(long, default_value_t = 8)]
    local_crops: usize,
    #[arg(long, default_value_t = 65536)]
    out_dim: i64,
    #[arg(long, default_value_t = 2)]
    threads: i32,
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    #[arg(long, default_value_t = 3)]
    iters: usize,
}

fn parse_arch(s: &str) -> Result<Arch, String> {
    config_enum(&[Arch::VitTiny, Arch::VitSmall, Arch::VitBase])
        .into_iter()
        .find(|(name, _)| name == s)
        .map(|(_, a)| a)
        .ok_or_else(|| format!("unknown arch {s:?}: vit_tiny, vit_small or vit_base"))
}

/// The config's own spelling of an enum value (`vit_small`, `bf16`, `tokens`): what its YAML
/// key takes, so a bench flag and the config can never spell a value differently.
fn yaml_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        other => unreachable!("a config enum serialises to its name, not {other:?}"),
    }
}

/// `values` of a config enum by their config spelling.
fn config_enum<T: serde::Serialize + Copy>(values: &[T]) -> Vec<(String, T)> {
    values.iter().map(|v| (yaml_name(v), *v)).collect()
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

impl BenchCommand {
    pub fn run(self) -> Result<()> {
        match self {
            BenchCommand::Model(b) => b.run(),
            BenchCommand::Step(b) => b.run(),
            BenchCommand::Matmul(b) => b.run(),
            BenchCommand::Probe(b) => b.run(),
            BenchCommand::Loader(b) => b.run(),
            BenchCommand::Profiles(b) => b.run(),
        }
    }
}

impl ModelBench {
    fn run(self) -> Result<()> {
        let b = self;
        tch::set_num_threads(b.threads);
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let vit = VitConfig::new(b.arch, b.patch, b.channels).with_drop_path(0.1);
        let head = HeadConfig::new(vit.embed_dim, b.out_dim, false, true);
        let net = MultiCropNet::new(&vs.root(), vit, head);
        let c = b.channels as i64;
        let mut crops = vec![
            Tensor::randn([b.batch, c, 224, 224], (Kind::Float, Device::Cpu)),
            Tensor::randn([b.batch, c, 224, 224], (Kind::Float, Device::Cpu)),
        ];
        for _ in 0..b.local_crops {
            crops.push(Tensor::randn(
                [b.batch, c, 96, 96],
                (Kind::Float, Device::Cpu),
            ));
        }
        let step = || {
            let out = net.forward_t(&crops, true);
            let loss = out.square().mean(Kind::Float);
            loss.backward();
            for mut v in vs.trainable_variables() {
                v.zero_grad();
            }
        };
        for _ in 0..b.warmup {
            step();
        }
        let mut times = Vec::with_capacity(b.iters);
        for _ in 0..b.iters {
            let t = Instant::now();
            step();
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "{}",
            serde_json::json!({
                "impl": "rust-tch",
                "arch": format!("{:?}", b.arch),
                "batch": b.batch,
                "threads": b.threads,
                "median_s": median,
                "times_s": times,
            })
        );
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LoaderMode {
    /// Random crops held in memory: times `Learner::step` alone.
    None,
    /// The training input pipeline (TIFF, min–max, multi-crop, EpochLoader): times the
    /// wall clock of each step including the wait for its batch.
    Real,
}

#[derive(Debug, Args)]
pub struct StepBench {
    #[arg(long, value_parser = parse_arch, default_value = "vit_small")]
    arch: Arch,
    #[arg(long, default_value_t = 16)]
    patch: usize,
    #[arg(long, default_value_t = 5)]
    channels: usize,
    /// Images per crop (the per-GPU batch); imgs/s counts these per step.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 8)]
    local_crops: usize,
    #[arg(long, default_value_t = 224)]
    global_size: usize,
    #[arg(long, default_value_t = 96)]
    local_size: usize,
    #[arg(long, default_value_t = 65536)]
    out_dim: usize,
    #[arg(long, default_value_t = 2)]
    threads: i32,
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    #[arg(long, default_value_t = 3)]
    iters: usize,
    #[arg(long, value_enum, default_value = "none")]
    loader: LoaderMode,
    /// ImageFolder root of TIFFs (e.g. the `Training/` folder `trainer synth` writes);
    /// required with `--loader real`.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Loader worker threads (`--loader real`); prefetch is 2 batches per worker, as in
    /// `trainer train`.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// `model.channels` of the benchmarked model (`--loader none` only): `tokens` draws each
    /// step's channel subset by hierarchical sampling, as training does; `bag` runs each
    /// image's channels as single-channel items (batch × channels items per crop), so imgs/s
    /// counts images for every mode.
    #[arg(long, value_parser = config_values(trainer::model::channels::all_modes()), default_value = "fixed")]
    channel_mode: ChannelMode,
    /// Where the step runs (`--loader none`; the crops are made there). `cuda` needs a
    /// trainer built with `--features nccl` and takes GPU 0.
    #[arg(long, value_parser = config_values(&[DeviceChoice::Cpu, DeviceChoice::Cuda]), default_value = "cpu")]
    device: DeviceChoice,
    /// `train.precision` of the step: bf16 autocast, or fp16 with loss scaling (CUDA only).
    #[arg(long, value_parser = config_values(&[Precision::Fp32, Precision::Bf16, Precision::Fp16]), default_value = "fp32")]
    precision: Precision,
    /// `train.cuda_graphs`: with `--device cuda` the step is captured after 3 eager steps and
    /// replayed (time replays with `--warmup 4` or more); on the CPU the same static step runs
    /// eagerly. The output's `losses` then compare with a run without it.
    #[arg(long)]
    cuda_graphs: bool,
}

impl StepBench {
    /// A validated default config with this bench's model and crop settings.
    fn config(&self) -> Result<Config> {
        let mut s = Sections::default();
        s.run.seed = self.seed;
        s.model.arch = self.arch;
        s.model.patch_size = self.patch;
        s.model.out_dim = self.out_dim;
        s.model.channels = self.channel_mode;
        s.train.precision = self.precision;
        s.train.batch_size_per_gpu = self.batch;
        s.augment.global_crop_size = self.global_size;
        s.augment.local_crop_size = self.local_size;
        s.augment.local_crops_number = self.local_crops;
        // scDINO's argparse defaults (also the published model and the AWS runs).
        s.augment.global_crops_scale = (0.4, 1.0);
        s.augment.local_crops_scale = (0.05, 0.4);
        Ok(Config::from_sections(s, "<bench step>")?)
    }

    /// `--cuda-graphs`: the graphed step, refused with the reason where it cannot capture.
    fn graphed(&self, cfg: &Config, device: Device) -> Result<Option<GraphedStep>> {
        if !self.cuda_graphs {
            return Ok(None);
        }
        if self.loader != LoaderMode::None {
            bail!("--cuda-graphs is measured with --loader none");
        }
        let reason = match device {
            Device::Cpu => graphed::unsupported_step(cfg, 1).map(str::to_string),
            _ => graphed::unsupported(cfg, device, 1),
        };
        if let Some(reason) = reason {
            bail!("--cuda-graphs: {reason}");
        }
        Ok(Some(GraphedStep::new(device)))
    }

    /// The `--device` the step runs on, refused where the bench cannot measure it.
    fn device(&self) -> Result<Device> {
        let device = match self.device {
            DeviceChoice::Auto => bail!("--device takes cpu or cuda"),
            DeviceChoice::Cpu => Device::Cpu,
            DeviceChoice::Cuda => {
                if self.loader != LoaderMode::None {
                    bail!("--device cuda is measured with --loader none");
                }
                if !tch::Cuda::is_available() {
                    bail!("--device cuda: libtorch sees no GPU (a trainer built with --features nccl is needed)");
                }
                Device::Cuda(0)
            }
        };
        if device == Device::Cpu && self.precision == Precision::Fp16 {
            bail!("--precision fp16 needs --device cuda");
        }
        Ok(device)
    }

    fn run(self) -> Result<()> {
        if self.iters == 0 {
            bail!("--iters must be at least 1");
        }
        if self.channel_mode.is_adaptive() && self.loader != LoaderMode::None {
            // The adaptive modes as the registry has them, so a new one is named here too.
            let adaptive: Vec<&str> = trainer::model::channels::all_modes()
                .iter()
                .filter(|m| m.is_adaptive())
                .map(|m| m.name())
                .collect();
            bail!(
                "--channel-mode {} is measured with --loader none",
                adaptive.join("|")
            );
        }
        let device = self.device()?;
        tch::set_num_threads(self.threads);
        let cfg = self.config()?;
        let ncrops = 2 + self.local_crops;
        let mut learner = Learner::from_config(&cfg, self.channels, device)?;
        let lr = scaled_lr(cfg.train.lr, self.batch, 1);
        let mode = for_mode(self.channel_mode);
        let params = |it: usize| StepParams {
            lr,
            weight_decay: cfg.train.weight_decay,
            momentum: cfg.train.momentum_teacher,
            epoch: 0,
            // Off, so the head's last layer is updated as in every epoch after the first.
            freeze_last_layer: false,
            clip_grad: cfg.train.clip_grad,
            rng_seed: it as i64,
            channels: mode
                .step_channels(self.seed, it, self.channels)
                .map(|c| ChannelSubset::from_indices(&c)),
        };
        let mut group = SingleProcess::default();
        let graphed = self.graphed(&cfg, device)?;
        let mut run = StepRun {
            learner: &mut learner,
            params: &params,
            group: &mut group,
            timed: Vec::with_capacity(self.iters),
            losses: Vec::new(),
            last_loss: f64::NAN,
        };
        match self.loader {
            LoaderMode::None => self.synthetic_steps(&mut run, graphed, ncrops, device, mode)?,
            LoaderMode::Real => self.real_steps(&mut run, &cfg)?,
        }
        self.report(&run);
        Ok(())
    }

    /// Steps on random crops made once (`--loader none`), graphed when asked.
    fn synthetic_steps(
        &self,
        run: &mut StepRun<'_>,
        mut graphed: Option<GraphedStep>,
        ncrops: usize,
        device: Device,
        mode: &dyn ChannelModeKind,
    ) -> Result<()> {
        // Waits for the step's queued GPU work (the teacher EMA), so its time holds all of it.
        let sync = || {
            if let Device::Cuda(i) = device {
                tch::Cuda::synchronize(i as i64);
            }
        };
        let (b, c) = if mode.channel_items() {
            ((self.batch * self.channels) as i64, 1)
        } else {
            (self.batch as i64, self.channels as i64)
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
        for it in 0..self.warmup + self.iters {
            let t = Instant::now();
            let out = match &mut graphed {
                Some(g) => g.step(run.learner, &crops, (run.params)(it), it)?,
                None => run.learner.step(&crops, (run.params)(it), it, run.group)?,
            };
            sync();
            run.losses.push(out.loss);
            let secs = t.elapsed().as_secs_f64();
            run.last_loss = out.loss;
            if it >= self.warmup {
                run.timed.push((secs, 0.0, self.batch));
            }
        }
        Ok(())
    }

    /// Steps on batches of training's own input pipeline over `--data` (`--loader real`).
    fn real_steps(&self, run: &mut StepRun<'_>, cfg: &Config) -> Result<()> {
        let Some(dir) = &self.data else {
            bail!("--loader real needs --data DIR (e.g. the Training/ folder of `trainer synth`)");
        };
        let total = self.warmup + self.iters;
        let pool = BufferPool::new(2 * self.workers.max(1) + 2);
        let mut loader = self.real_loader(cfg, dir, total, pool.clone())?;
        for it in 0..total {
            let t = Instant::now();
            let b = loader
                .next()
                .context("the loader ran out of batches")?
                .map_err(anyhow::Error::msg)?;
            if b.indices.is_empty() {
                bail!("batch {} has no usable image", b.batch_no);
            }
            let out = run
                .learner
                .step(&b.crops, (run.params)(it), it, run.group)?;
            let secs = t.elapsed().as_secs_f64();
            run.last_loss = out.loss;
            if it >= self.warmup {
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
    fn report(&self, run: &StepRun<'_>) {
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let times: Vec<f64> = run.timed.iter().map(|t| t.0).collect();
        let waits: Vec<f64> = run.timed.iter().map(|t| t.1).collect();
        let images: usize = run.timed.iter().map(|t| t.2).sum();
        let median_s = median(times.clone());
        println!(
            "{}",
            serde_json::json!({
                "impl": "rust-tch",
                "bench": "step",
                "arch": yaml_name(&self.arch),
                "channel_mode": yaml_name(&self.channel_mode),
                "channels": self.channels,
                "device": yaml_name(&self.device),
                "precision": yaml_name(&self.precision),
                "loader": match self.loader { LoaderMode::None => "none", LoaderMode::Real => "real" },
                "batch": self.batch,
                "threads": self.threads,
                "workers": if self.loader == LoaderMode::Real { self.workers } else { 0 },
                "crops": [self.global_size, self.local_size, self.local_crops],
                "out_dim": self.out_dim,
                "median_s": median_s,
                "imgs_per_s": self.batch as f64 / median_s,
                "throughput_imgs_per_s": images as f64 / times.iter().sum::<f64>(),
                "times_s": times,
                "data_wait_s": waits,
                "data_wait_median_s": median(waits.clone()),
                "last_loss": run.last_loss,
                "cuda_graphs": self.cuda_graphs,
                "losses": run.losses,
            })
        );
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
    ) -> Result<EpochLoader> {
        let source: SharedSource = Arc::new(LocalSource::open(dir, 0)?);
        let index = source.index();
        if index.len() < steps * self.batch {
            bail!(
                "{} holds {} images; {steps} steps of batch {} need {} (make more with `trainer synth --per-class N`)",
                dir.display(),
                index.len(),
                self.batch,
                steps * self.batch
            );
        }
        // Computed once before training in `trainer train`, so outside the timing here too.
        let ms = mean_std::compute(source.as_ref(), cfg.data.mean_std_fraction, 0, self.workers)?;
        if ms.mean.len() != self.channels {
            bail!(
                "{} has {}-channel images, --channels is {}",
                dir.display(),
                ms.mean.len(),
                self.channels
            );
        }
        let all: Vec<usize> = (0..self.channels).collect();
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
        let (seed, epoch, file_channels) = (self.seed, 0u64, self.channels);
        let images = training_image_fn(source.clone(), prep, file_channels, Vec::new(), None);
        let order = epoch_order(&(0..index.len()).collect::<Vec<_>>(), seed, epoch, 0, 1);
        let input = TrainInput::new(augment, AugmentOn::Cpu, seed);
        let sample = input
            .samples(images, epoch, &order)
            .map_err(anyhow::Error::msg)?;
        let workers = self.workers.max(1);
        Ok(EpochLoader::new(
            order,
            self.batch,
            workers,
            2 * workers,
            0,
            sample,
            pool,
        ))
    }
}

#[derive(Debug, Args)]
pub struct MatmulBench {
    #[arg(long, default_value_t = 2048)]
    n: i64,
    #[arg(long, default_value_t = 2)]
    threads: i32,
    #[arg(long, default_value_t = 10)]
    reps: usize,
}

impl MatmulBench {
    fn run(self) -> Result<()> {
        tch::set_num_threads(self.threads);
        tch::manual_seed(0);
        let opts = (Kind::Float, Device::Cpu);
        let a = Tensor::randn([self.n, self.n], opts);
        let b = Tensor::randn([self.n, self.n], opts);
        let out = Tensor::empty([self.n, self.n], opts);
        let _ = a.matmul_out(&out, &b); // warm-up
        let mut best = f64::INFINITY;
        for _ in 0..self.reps.max(1) {
            let t = Instant::now();
            let _ = a.matmul_out(&out, &b);
            best = best.min(t.elapsed().as_secs_f64());
        }
        let flops = 2.0 * (self.n as f64).powi(3);
        println!(
            "{}",
            serde_json::json!({
                "impl": "rust-tch",
                "bench": "matmul",
                "n": self.n,
                "threads": self.threads,
                "best_s": best,
                "gflops": flops / best / 1e9,
            })
        );
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LoaderPath {
    /// Workers decode, min–max scale and run the full multi-crop augmentation.
    Cpu,
    /// Workers decode and min–max scale; the batched tensor augmentation runs on the
    /// consumer thread (on the CPU here, with `--threads` libtorch threads).
    Device,
    /// Workers decode and min–max scale only: the CPU cost of the device path when the
    /// augmentation runs on a GPU.
    Read,
    /// The CPU augmentation kernels alone, on this thread: `--batch` decoded images
    /// augmented over and over into reused buffers (no I/O, no allocation, no batching).
    Kernels,
}

#[derive(Debug, Args)]
pub struct LoaderBench {
    /// ImageFolder root of TIFFs (e.g. the `Training/` folder `trainer synth` writes).
    #[arg(long, conflicts_with = "config", required_unless_present = "config")]
    data: Option<PathBuf>,
    /// Read through the data source of this config instead (`data.dataset_dir`: folder,
    /// packed shards, s3:// with or without `data.cache.dir`, store settings from `data.object_store`),
    /// opened with `trainer::data::open_source`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Read every image of the timed order once (with `--threads` readers) before the
    /// loader starts: a warm node-local cache, i.e. the second epoch of an s3:// + cache run.
    #[arg(long)]
    warm: bool,
    /// Allocate fresh batch tensors for every batch instead of reusing handed-back ones
    /// (what the loader did before the buffer pool; for measuring it).
    #[arg(long)]
    no_buffer_reuse: bool,
    #[arg(long, value_enum, default_value = "cpu")]
    path: LoaderPath,
    /// Loader worker threads (and libtorch threads for `--path device`).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Batches timed after the warm-up ones (at most the dataset's batches minus warm-up).
    #[arg(long, default_value_t = 16)]
    batches: usize,
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    #[arg(long, default_value_t = 8)]
    local_crops: usize,
    #[arg(long, default_value_t = 224)]
    global_size: usize,
    #[arg(long, default_value_t = 96)]
    local_size: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// User + system CPU seconds of this process (all threads), from /proc/self/stat.
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

fn process_cpu_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat
        .rsplit_once(')')
        .context("malformed /proc/self/stat")?
        .1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64> {
        Ok(f.get(i).context("short /proc/self/stat")?.parse::<f64>()?)
    };
    // Fields 14/15 are at 11/12 counting from field 3 (the state) at 0; USER_HZ is 100 on
    // Linux everywhere we run.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

impl LoaderBench {
    /// The dataset (`--config` or `--data`, holding at least `need` images unless only the
    /// kernels are timed), its channel count, and training's multi-crop augmentation with the
    /// dataset's mean/std.
    fn source_and_augment(&self, need: usize) -> Result<LoaderInput> {
        let (source, name, data): (SharedSource, DatasetLocation, _) =
            match (&self.config, &self.data) {
                (Some(c), _) => {
                    let cfg = trainer::train::init_layout::load_config(c)?;
                    let name = cfg.data.dataset_dir.clone();
                    (open_source(&cfg.data)?, name, Some(cfg.data.clone()))
                }
                (None, Some(d)) => (
                    Arc::new(LocalSource::open(d, 0)?) as SharedSource,
                    DatasetLocation::Local(d.clone()),
                    None,
                ),
                (None, None) => bail!("give --data DIR or --config FILE"),
            };
        let index = source.index();
        if index.len() < need && self.path != LoaderPath::Kernels {
            bail!(
                "{name} holds {} images; {} batches of {} need {need} (make more with `trainer synth --per-class N`)",
                index.len(),
                self.warmup + self.batches,
                self.batch
            );
        }
        let ms = mean_std::compute(source.as_ref(), 0.1, 0, self.threads)?;
        let channels = ms.mean.len();
        let all: Vec<usize> = (0..channels).collect();
        let (mean, std) = ms.select(&all, &[]);
        let augment = Arc::new(MultiCropAugment::new(MultiCropConfig {
            global_crops_scale: (0.4, 1.0),
            local_crops_scale: (0.05, 0.4),
            global_size: self.global_size,
            local_size: self.local_size,
            local_crops_number: self.local_crops,
            mean,
            std,
            ops: Default::default(),
        })?);
        Ok(LoaderInput {
            source,
            channels,
            augment,
            data,
        })
    }

    fn run(self) -> Result<()> {
        if self.batches == 0 || self.threads == 0 {
            bail!("--batches and --threads must be at least 1");
        }
        tch::set_num_threads(if self.path == LoaderPath::Device {
            self.threads as i32
        } else {
            1
        });
        let need = (self.warmup + self.batches) * self.batch;
        let LoaderInput {
            source,
            channels,
            augment,
            data,
        } = self.source_and_augment(need)?;
        let index = source.index();
        let all: Vec<usize> = (0..channels).collect();
        let prep = PreprocessOptions {
            selected_channels: Some(all),
            center_crop: 0,
        };
        let epoch = 0u64;
        let on = match self.path {
            LoaderPath::Cpu => AugmentOn::Cpu,
            LoaderPath::Device | LoaderPath::Read | LoaderPath::Kernels => AugmentOn::Device,
        };
        if self.path == LoaderPath::Kernels {
            return self.kernels(&source, &prep, &augment);
        }
        let input = TrainInput::new(augment, on, self.seed);
        let samples: Vec<usize> = (0..index.len()).collect();
        // A config's `data.order` (e.g. `sites` for a screen) is training's order.
        let mut order = match &data {
            Some(d) => {
                configured_epoch_order(d, source.as_ref(), &samples, self.seed, epoch, 0, 1)?
            }
            None => epoch_order(&samples, self.seed, epoch, 0, 1),
        };
        order.truncate(need);
        if self.warm {
            warm_read(&source, &order, self.threads)?;
        }
        source.will_read(&order);
        // What mean/std (and `--warm`) fetched, so that `source` counts the loader's reads.
        let before = source.report();
        let images = training_image_fn(source.clone(), prep, channels, Vec::new(), None);
        let samples = input
            .samples(images, epoch, &order)
            .map_err(anyhow::Error::msg)?;
        let pool = BufferPool::new(if self.no_buffer_reuse {
            0
        } else {
            2 * self.threads + 2
        });
        let loader = EpochLoader::new(
            order,
            self.batch,
            self.threads,
            2 * self.threads,
            0,
            samples,
            pool.clone(),
        );
        let (mut t0, mut cpu0, mut images_timed, mut checksum) =
            (Instant::now(), process_cpu_seconds()?, 0usize, 0.0f64);
        for (n, loaded) in loader.enumerate() {
            let b = loaded.map_err(anyhow::Error::msg)?;
            let crops = if self.path == LoaderPath::Device {
                input.crops(&b, epoch, Device::Cpu)?
            } else {
                b.crops.iter().map(|c| c.shallow_clone()).collect()
            };
            // One value per batch keeps the work observable without costing a pass.
            checksum += crops[crops.len() - 1].double_value(&[0, 0, 0, 0]);
            if n + 1 == self.warmup {
                (t0, cpu0) = (Instant::now(), process_cpu_seconds()?);
            } else if n >= self.warmup {
                images_timed += b.indices.len();
            }
            drop(crops);
            let LoadedBatch { crops, buffers, .. } = b;
            drop(crops);
            // SAFETY: the crops (and the device path's outputs) are dropped just above.
            unsafe { pool.put(buffers) };
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = process_cpu_seconds()? - cpu0;
        println!(
            "{}",
            serde_json::json!({
                "impl": "rust",
                "bench": "loader",
                "path": format!("{:?}", self.path).to_lowercase(),
                "threads": self.threads,
                "batch": self.batch,
                "batches": self.batches,
                "images": images_timed,
                "crops": [self.global_size, self.local_size, self.local_crops],
                "wall_s": wall,
                "cpu_s": cpu,
                "imgs_per_s": images_timed as f64 / wall,
                "imgs_per_cpu_s": images_timed as f64 / cpu.max(1e-9),
                "checksum": checksum,
                "source_before": before,
                "source": source.report(),
            })
        );
        Ok(())
    }
}

/// What `trainer bench loader` reads: the source, its channel count, training's multi-crop
/// augmentation with its mean/std, and the config's data section when `--config` gave one.
struct LoaderInput {
    source: SharedSource,
    channels: usize,
    augment: Arc<MultiCropAugment>,
    data: Option<trainer::config::DataSection>,
}

/// Reads (and decodes) `order` once with `threads` readers: fills a node-local cache.
fn warm_read(source: &SharedSource, order: &[usize], threads: usize) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    source.will_read(order);
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                        source.read(i)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("warm-up reader panicked"))??;
        }
        Ok(())
    })
}

impl LoaderBench {
    fn kernels(
        &self,
        source: &SharedSource,
        prep: &PreprocessOptions,
        augment: &MultiCropAugment,
    ) -> Result<()> {
        let images = training_image_fn(
            source.clone(),
            prep.clone(),
            augment.channels(),
            Vec::new(),
            None,
        );
        let mut imgs = Vec::new();
        for i in 0..self.batch {
            let mut img = trainer::data::ImageChw::default();
            if images(i, &mut img).map_err(anyhow::Error::msg)? {
                imgs.push(img);
            }
        }
        let mut bufs: Vec<Vec<f32>> = (0..augment.num_crops())
            .map(|k| vec![0.0; augment.crop_len(k)])
            .collect();
        let mut run = |n: usize, epoch: u64| -> Result<usize> {
            let mut done = 0;
            for it in 0..n {
                for (i, img) in imgs.iter().enumerate() {
                    let mut out: Vec<&mut [f32]> =
                        bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                    let key = trainer::augment::SampleKey::new(
                        self.seed,
                        epoch,
                        (it * imgs.len() + i) as u64,
                    );
                    augment.apply_into(img, key, &mut out)?;
                    done += 1;
                }
            }
            Ok(done)
        };
        run(self.warmup, 1)?;
        let (t0, cpu0) = (Instant::now(), process_cpu_seconds()?);
        let images_timed = run(self.batches, 0)?;
        let wall = t0.elapsed().as_secs_f64();
        let cpu = process_cpu_seconds()? - cpu0;
        println!(
            "{}",
            serde_json::json!({
                "impl": "rust",
                "bench": "loader",
                "path": "kernels",
                "threads": 1,
                "images": images_timed,
                "crops": [self.global_size, self.local_size, self.local_crops],
                "wall_s": wall,
                "cpu_s": cpu,
                "imgs_per_s": images_timed as f64 / wall,
                "imgs_per_cpu_s": images_timed as f64 / cpu.max(1e-9),
                "checksum": bufs[0][0],
            })
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        b: LoaderBench,
    }

    #[test]
    fn loader_bench_takes_data_or_config() {
        let w = Wrap::try_parse_from(["t", "--config", "c.yaml", "--warm"]).unwrap();
        assert_eq!(w.b.config, Some(PathBuf::from("c.yaml")));
        assert!(w.b.warm && w.b.data.is_none());
        let w = Wrap::try_parse_from(["t", "--data", "d"]).unwrap();
        assert_eq!(w.b.data, Some(PathBuf::from("d")));
        assert!(Wrap::try_parse_from(["t"]).is_err());
        assert!(Wrap::try_parse_from(["t", "--data", "d", "--config", "c"]).is_err());
    }
}
