//! Subcommand definitions and dispatch.
mod analysis_cmd;
mod bench_cmd;
mod checkpoint_cmd;
mod collectives_cmd;
mod config_cmd;
mod data_cmd;
mod data_tools_cmd;
mod embed_cmd;
mod export_cmd;
mod metrics_cmd;
mod pack_cmd;
mod pipeline_cmd;
mod preload_cmd;
mod selftest_cmd;
mod train_cmd;

use anyhow::{anyhow, bail, Result};
use clap::{CommandFactory, Parser, Subcommand};
use std::path::{Path, PathBuf};
use trainer::config::{Config, BAKED_CONFIG_PATH};

/// `--config FILE`, or the run config baked into the image (`launcher image build --config`)
/// when it is absent: an image carries its run, so `trainer pipeline` alone runs it.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArg {
    /// The run config (YAML). Default: the config baked into the image, /opt/scdino/config.yaml.
    #[arg(long = "config", value_name = "FILE")]
    config: Option<PathBuf>,
}

impl ConfigArg {
    pub fn path(&self) -> Result<PathBuf> {
        resolve_config(self.config.as_deref(), Path::new(BAKED_CONFIG_PATH))
    }

    pub fn load(&self) -> Result<Config> {
        Ok(trainer::train::init_layout::load_config(&self.path()?)?)
    }
}

/// The given path, else the baked file (said once on stderr), else an error naming both.
fn resolve_config(given: Option<&Path>, baked: &Path) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    if baked.is_file() {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::info!(
                "[trainer] no --config given: using the run config baked into this image, {}",
                baked.display()
            )
        });
        return Ok(baked.to_path_buf());
    }
    bail!(
        "no --config given and no run config baked into this image ({} does not exist): pass --config FILE",
        baked.display()
    )
}

/// The run config the trainer command line `args` (program name left out) would read: its
/// `--config`, else the baked one; `None` for a command without `--config`. Read from clap's
/// own parse of the line, so it is the file the command itself loads.
pub fn launched_config(args: &[String]) -> Result<Option<PathBuf>> {
    let line = std::iter::once("trainer").chain(args.iter().map(String::as_str));
    let matches = Cli::command()
        .try_get_matches_from(line)
        .map_err(|e| anyhow!("`{}` is not a trainer command: {e}", args.join(" ")))?;
    // The leaf subcommand's definition says whether it takes `--config` (its matches cannot:
    // release builds of clap answer an unknown argument with "not given").
    let (mut leaf, mut command) = (&matches, Cli::command());
    while let Some((name, sub)) = leaf.subcommand() {
        command = command
            .find_subcommand(name)
            .cloned()
            .expect("clap matched a subcommand it defines");
        leaf = sub;
    }
    if !command.get_arguments().any(|a| a.get_id() == "config") {
        return Ok(None);
    }
    let given = leaf.get_one::<PathBuf>("config");
    resolve_config(given.map(PathBuf::as_path), Path::new(BAKED_CONFIG_PATH)).map(Some)
}

#[derive(Debug, Parser)]
#[command(
    name = "trainer",
    version,
    long_version = trainer::build_info::long_version(),
    about = "scDINO ViT-DINO training on multi-channel microscopy"
)]
pub struct Cli {
    /// `text` (readable lines; `[rank R/W local L HOST]` in front when distributed) or `json`
    /// (one object per line, for log shipping). Levels: `SCDINO_LOG` or `RUST_LOG` (`info`,
    /// `debug`, `info,trainer::data=debug`, ...).
    #[arg(long, global = true, env = scdino_base::log::FORMAT_ENV, value_name = "FORMAT")]
    pub log_format: Option<scdino_base::log::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate, print or import configuration files.
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// Dataset tools: `data pack` (tar shards), `data preload` (S3 to FSx/NVMe), `data read-bench`.
    #[command(subcommand)]
    Data(data_tools_cmd::DataCommand),
    /// Write a synthetic PBMC-like multi-channel TIFF dataset (the demo data).
    Synth(data_cmd::SynthArgs),
    /// Check that this task can train here: CUDA, NCCL, EFA, a training step on the GPU against
    /// the CPU, device augmentation, an all-reduce across every task (exit 1 on a failure).
    Selftest(selftest_cmd::SelftestArgs),
    /// Run student and teacher on one multi-crop batch of the configured dataset.
    Forward(data_cmd::ForwardArgs),
    /// Per-channel mean/std of the dataset (scDINO's mean_and_std_of_dataset.txt).
    MeanStd(analysis_cmd::MeanStdArgs),
    /// CLS features, labels and image paths of the held-out split.
    Features(analysis_cmd::FeaturesArgs),
    Embed(embed_cmd::EmbedArgs),
    /// scDINO's global weighted kNN on the extracted features (+ per-class metrics).
    Knn(analysis_cmd::KnnArgs),
    /// kNN and a linear probe on the test folder (or held-out split): top-1/top-5, balanced
    /// accuracy, macro-F1, per class.
    Evaluate(analysis_cmd::EvaluateArgs),
    /// 2-D UMAP of the features, coloured by class (PNG + CSV + trustworthiness).
    Umap(analysis_cmd::UmapArgs),
    /// Last-block CLS attention maps of a few held-out images per class (PNG).
    Attention(analysis_cmd::AttentionArgs),
    /// A screen's profiling recipe with the kept checkpoints (`downstream.profiling`): embed
    /// its cells, then `metrics profile` (replicate and activity mAP).
    Profiling(analysis_cmd::ProfilingArgs),
    /// One self-contained HTML report of a model's training and analyses.
    Report(analysis_cmd::ReportArgs),
    /// Everything: mean-std, train, features, knn, evaluate, umap, attention, profiling, report
    /// (skips what is up to date, resumes after interruption).
    Pipeline(pipeline_cmd::PipelineArgs),
    /// DINO pretraining of one channel combination (resumes automatically).
    Train(train_cmd::TrainArgs),
    /// Inspect or import PyTorch `.pth` checkpoints (scDINO/DINO).
    #[command(subcommand)]
    Checkpoint(checkpoint_cmd::CheckpointCommand),
    /// A checkpoint's backbone for timm (safetensors + config.json) or TorchScript, with a model card.
    Export(export_cmd::ExportArgs),
    /// Score embeddings as the profiling field does (copairs mAP, batch effects, normalisation, CHAMMI).
    #[command(subcommand)]
    Metrics(metrics_cmd::MetricsCommand),
    /// Run N local ranks of a trainer command (multi-process data parallelism on one machine).
    Launch(train_cmd::LaunchArgs),
    /// nccl-tests-style bandwidth and correctness of the collectives across the job's ranks.
    CollectivesBench(collectives_cmd::CollectivesArgs),
    /// Measure our model against the PyTorch reference (used by bench/).
    #[command(subcommand)]
    Bench(bench_cmd::BenchCommand),
}

impl Cli {
    pub fn run(self) -> Result<()> {
        match self.command {
            Command::Config(c) => c.run(),
            Command::Bench(b) => b.run(),
            Command::CollectivesBench(c) => c.run(),
            Command::Data(d) => d.run(),
            Command::Synth(s) => s.run(),
            Command::Selftest(s) => s.run(),
            Command::Forward(f) => f.run(),
            Command::Train(t) => t.run(),
            Command::Launch(l) => l.run(),
            Command::MeanStd(m) => m.run(),
            Command::Features(f) => f.run(),
            Command::Embed(e) => e.run(),
            Command::Knn(k) => k.run(),
            Command::Evaluate(e) => e.run(),
            Command::Umap(u) => u.run(),
            Command::Attention(a) => a.run(),
            Command::Profiling(p) => p.run(),
            Command::Report(r) => r.run(),
            Command::Pipeline(p) => p.run(),
            Command::Checkpoint(c) => c.run(),
            Command::Export(e) => e.run(),
            Command::Metrics(m) => m.run(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::resolve_config;
    use std::path::Path;

    #[test]
    fn a_launched_command_names_its_config_or_has_none() {
        use super::launched_config;
        let args = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            launched_config(&args("train --config a.yaml --combination 1")).unwrap(),
            Some("a.yaml".into())
        );
        assert_eq!(
            launched_config(&args("--log-format json data read-bench --config=b.yaml")).unwrap(),
            Some("b.yaml".into())
        );
        assert_eq!(launched_config(&args("collectives-bench")).unwrap(), None);
        assert_eq!(launched_config(&args("config check c.yaml")).unwrap(), None);
        let e = launched_config(&args("trian --config a.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a trainer command"), "{e}");
    }

    #[test]
    fn config_falls_back_to_the_baked_file_only_when_absent() {
        let d = tempfile::tempdir().unwrap();
        let baked = d.path().join("config.yaml");
        let given = Path::new("mine.yaml");
        let e = resolve_config(None, &baked).unwrap_err().to_string();
        assert!(
            e.contains("no --config given") && e.contains("config.yaml does not exist"),
            "{e}"
        );
        std::fs::write(&baked, "run: {}\n").unwrap();
        assert_eq!(resolve_config(None, &baked).unwrap(), baked);
        assert_eq!(resolve_config(Some(given), &baked).unwrap(), given);
    }
}
