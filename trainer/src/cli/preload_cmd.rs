//! `trainer data preload`: copy an s3:// (gs://, az://) dataset to FSx or node-local NVMe ahead of a run.
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;
use trainer::config::DatasetLocation;

#[derive(Debug, Args)]
pub struct PreloadArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Target directory (e.g. /fsx/datasets/pbmc or /local_scratch/pbmc); then point
    /// data.dataset_dir at it.
    #[arg(long)]
    to: PathBuf,
    /// Concurrent downloads (default: data.object_store.max_concurrency).
    #[arg(long)]
    jobs: Option<usize>,
    /// No progress bar (logs, batch jobs).
    #[arg(long)]
    quiet: bool,
}

impl PreloadArgs {
    pub fn run(self) -> Result<()> {
        let cfg = self.config.load()?;
        let src = match &cfg.data.dataset_dir {
            DatasetLocation::Remote(url) => url,
            DatasetLocation::Local(dir) => bail!(
                "{}: data.dataset_dir is {}, not an s3://, gs:// or az:// URL: nothing to preload",
                self.config.path()?.display(),
                dir.display()
            ),
        };
        let jobs = self
            .jobs
            .unwrap_or(cfg.data.object_store.max_concurrency)
            .max(1);
        let t = Instant::now();
        let s = trainer::data::preload::preload(src, &cfg.data, &self.to, jobs, !self.quiet)
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
