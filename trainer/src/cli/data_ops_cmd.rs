//! `trainer data ...`: dataset operations ahead of a run.
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Instant;
use trainer::config::Config;

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Copy an s3:// dataset (data.dataset_dir) to a local or FSx directory, resumably.
    Preload(PreloadArgs),
    /// Read and decode every image of data.dataset_dir in a shuffled order, per epoch, on
    /// data.num_workers threads (the storage side of the loader, without augmentation);
    /// prints one JSON line per epoch.
    ReadBench(ReadBenchArgs),
}

impl DataCommand {
    pub fn run(self) -> Result<()> {
        match self {
            DataCommand::Preload(p) => p.run(),
            DataCommand::ReadBench(r) => r.run(),
        }
    }
}

#[derive(Debug, Args)]
pub struct PreloadArgs {
    #[arg(long)]
    config: PathBuf,
    /// Target directory (e.g. /fsx/datasets/pbmc or /local_scratch/pbmc); then point
    /// data.dataset_dir at it.
    #[arg(long)]
    to: PathBuf,
    /// Concurrent downloads (default: data.s3.max_concurrency).
    #[arg(long)]
    jobs: Option<usize>,
    /// No progress bar (logs, batch jobs).
    #[arg(long)]
    quiet: bool,
}

impl PreloadArgs {
    pub fn run(self) -> Result<()> {
        let cfg = Config::load(&self.config)?;
        let src = cfg.data.dataset_dir.to_string_lossy().into_owned();
        if !src.starts_with("s3://") {
            bail!(
                "{}: data.dataset_dir is {src}, not an s3:// URL: nothing to preload",
                self.config.display()
            );
        }
        let jobs = self.jobs.unwrap_or(cfg.data.s3.max_concurrency).max(1);
        let t = Instant::now();
        let s = trainer::data::preload::preload(&cfg.data, &self.to, jobs, !self.quiet)
            .with_context(|| format!("preloading {src} to {}", self.to.display()))?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "preloaded {src} -> {}: {} objects, {} copied ({:.1} MB, {:.0} objects/s), {} already present and verified, {secs:.1}s",
            self.to.display(),
            s.objects,
            s.copied,
            s.bytes_copied as f64 / 1e6,
            s.copied as f64 / secs.max(1e-9),
            s.skipped
        );
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct ReadBenchArgs {
    #[arg(long)]
    config: PathBuf,
    /// Epochs (the second one shows the cache, if data.cache.dir is set).
    #[arg(long, default_value_t = 2)]
    epochs: usize,
}

impl ReadBenchArgs {
    pub fn run(self) -> Result<()> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let cfg = Config::load(&self.config)?;
        let t = Instant::now();
        let source = trainer::data::open_source(&cfg.data)
            .with_context(|| format!("opening {}", cfg.data.dataset_dir.display()))?;
        let open_s = t.elapsed().as_secs_f64();
        let n = source.index().len();
        let workers = cfg.data.num_workers.max(1);
        for epoch in 0..self.epochs {
            let all: Vec<usize> = (0..n).collect();
            let order =
                trainer::train::sampler::epoch_order(&all, cfg.run.seed, epoch as u64, 0, 1);
            let t = Instant::now();
            source.will_read(&order);
            let next = AtomicUsize::new(0);
            let failed: std::sync::Mutex<Option<String>> = Default::default();
            std::thread::scope(|s| {
                for _ in 0..workers {
                    s.spawn(|| loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&i) = order.get(k) else { return };
                        if let Err(e) = source.read(i) {
                            failed.lock().unwrap().get_or_insert(e.to_string());
                            return;
                        }
                    });
                }
            });
            if let Some(e) = failed.into_inner().unwrap() {
                bail!("{e}");
            }
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{}",
                serde_json::json!({
                    "bench": "data_read",
                    "source": source.describe(),
                    "epoch": epoch,
                    "images": n,
                    "workers": workers,
                    "open_seconds": open_s,
                    "seconds": secs,
                    "images_per_second": n as f64 / secs,
                    "transfers": source.report(),
                })
            );
        }
        Ok(())
    }
}
