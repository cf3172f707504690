//! `trainer data ...`: dataset tools run ahead of (or beside) training: `pack` (tar shards),
//! `preload` (S3 to FSx/NVMe) and `read-bench` (storage throughput of any source).
use super::pack_cmd::PackArgs;
use super::preload_cmd::PreloadArgs;
use anyhow::Result;
use clap::{Args, Subcommand};
use std::time::Instant;
use trainer::data::open_source;

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Pack `data.dataset_dir` into WebDataset-style tar shards plus an index (resumable:
    /// a rerun verifies finished shards by checksum and writes only what is missing).
    Pack(PackArgs),
    /// Copy an s3://, gs:// or az:// dataset (data.dataset_dir) to a local or FSx directory, resumably.
    Preload(PreloadArgs),
    /// Read (and decode) epochs of the training split in the configured `data.order` from
    /// any source (folder, shards, s3://, with or without the node-local cache) and print
    /// one JSON line per epoch with images/s (bench/shards.sh, bench/s3_read.sh).
    ReadBench(ReadBenchArgs),
}

impl DataCommand {
    pub fn run(self) -> Result<()> {
        match self {
            DataCommand::Pack(p) => p.run(),
            DataCommand::Preload(p) => p.run(),
            DataCommand::ReadBench(r) => r.run(),
        }
    }
}

#[derive(Debug, Args)]
pub struct ReadBenchArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Reader threads, each taking the next sample of the order as the loader's workers do
    /// (default: data.num_workers).
    #[arg(long)]
    threads: Option<usize>,
    /// Epochs; each has its own order (the second one shows the node-local cache, if
    /// data.cache.dir is set).
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    /// Only read the bytes; skip TIFF decoding.
    #[arg(long)]
    no_decode: bool,
    /// Label for the JSON lines.
    #[arg(long, default_value = "")]
    label: String,
}

impl ReadBenchArgs {
    pub fn run(self) -> Result<()> {
        use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
        let cfg = self.config.load()?;
        let t_open = Instant::now();
        let source = open_source(&cfg.data)?;
        let open_seconds = t_open.elapsed().as_secs_f64();
        let split =
            trainer::data::configured_split(source.index(), &cfg.data, cfg.run.seed as u32)?;
        let threads = self.threads.unwrap_or(cfg.data.num_workers).max(1);
        for epoch in 0..self.epochs {
            let order = trainer::train::sampler::configured_epoch_order(
                &cfg.data,
                source.as_ref(),
                &split.train,
                cfg.run.seed,
                epoch as u64,
                0,
                1,
            )
            .map_err(anyhow::Error::msg)?;
            let next = AtomicUsize::new(0);
            let bytes = AtomicU64::new(0);
            let t0 = Instant::now();
            source.will_read(&order);
            std::thread::scope(|s| -> Result<()> {
                let workers: Vec<_> = (0..threads)
                    .map(|_| {
                        s.spawn(|| -> Result<()> {
                            loop {
                                let k = next.fetch_add(1, Ordering::Relaxed);
                                let Some(&i) = order.get(k) else {
                                    return Ok(());
                                };
                                if self.no_decode {
                                    let b = source.read_bytes(i)?;
                                    bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
                                } else {
                                    let img = source.read(i)?;
                                    bytes.fetch_add(4 * img.data.len() as u64, Ordering::Relaxed);
                                }
                            }
                        })
                    })
                    .collect();
                for w in workers {
                    w.join()
                        .map_err(|_| anyhow::anyhow!("reader thread panicked"))??;
                }
                Ok(())
            })?;
            let secs = t0.elapsed().as_secs_f64();
            println!(
                "{}",
                serde_json::json!({
                    "label": self.label,
                    "source": source.describe(),
                    "order": format!("{:?}", cfg.data.order),
                    "epoch": epoch,
                    "threads": threads,
                    "decode": !self.no_decode,
                    "images": order.len(),
                    "open_seconds": open_seconds,
                    "seconds": secs,
                    "images_per_s": order.len() as f64 / secs,
                    "mb_per_s": bytes.load(Ordering::Relaxed) as f64 / 1e6 / secs,
                    "transfers": source.report(),
                })
            );
        }
        Ok(())
    }
}
