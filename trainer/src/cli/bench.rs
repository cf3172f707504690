//! Timings for bench/: `model` (student forward+backward of one multi-crop batch, peer
//! bench/model_fwd_bwd.py), `step` (one full DINO iteration, optionally fed by the real
//! loader, peer bench/train_step.py), `loader` (input pipeline throughput per core, peer
//! bench/loader_peer.py) and `matmul` (fp32 matmul peak). The scripts run the
//! PyTorch peers with the same shapes and threads in the same invocation and report ratios.
//! `step` and `loader` are work of the library (`trainer::bench`); their flags are parsed here.
use anyhow::Result;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};
use trainer::bench::loader::{LoaderOptions, LoaderPath};
use trainer::bench::step::{LoaderMode, StepOptions};
use trainer::bench::yaml_name;
use trainer::config::{Arch, ChannelMode, DeviceChoice, Precision};
use trainer::model::{HeadConfig, MultiCropNet, VitConfig};

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
    fn run(self) -> Result<()> {
        let options = StepOptions {
            arch: self.arch,
            patch: self.patch,
            channels: self.channels,
            batch: self.batch,
            local_crops: self.local_crops,
            global_size: self.global_size,
            local_size: self.local_size,
            out_dim: self.out_dim,
            threads: self.threads,
            warmup: self.warmup,
            iters: self.iters,
            loader: self.loader,
            data: self.data,
            workers: self.workers,
            seed: self.seed,
            channel_mode: self.channel_mode,
            device: self.device,
            precision: self.precision,
            cuda_graphs: self.cuda_graphs,
        };
        println!("{}", options.run()?);
        Ok(())
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

impl LoaderBench {
    fn run(self) -> Result<()> {
        let options = LoaderOptions {
            data: self.data,
            config: self.config,
            warm: self.warm,
            no_buffer_reuse: self.no_buffer_reuse,
            path: self.path,
            threads: self.threads,
            batch: self.batch,
            batches: self.batches,
            warmup: self.warmup,
            local_crops: self.local_crops,
            global_size: self.global_size,
            local_size: self.local_size,
            seed: self.seed,
        };
        println!("{}", options.run()?);
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
