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
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::{Path, PathBuf};
use trainer::config::{Config, BAKED_CONFIG_PATH};
use trainer::pipeline::Stage;

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
    let matches = command()
        .try_get_matches_from(line)
        .map_err(|e| anyhow!("`{}` is not a trainer command: {e}", args.join(" ")))?;
    // The leaf subcommand's definition says whether it takes `--config` (its matches cannot:
    // release builds of clap answer an unknown argument with "not given").
    let (mut leaf, mut command) = (&matches, command());
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

/// The command line: [`Cli`]'s subcommands, and `trainer <stage>` for every pipeline stage
/// without a subcommand of its own (the stage alone through the pipeline's runner,
/// [`pipeline_cmd::RunArgs`], with its `about` line as help), so a new stage needs nothing here.
pub fn command() -> clap::Command {
    let names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
    let mut cmd = Cli::command().mut_subcommand("pipeline", |p| {
        p.about(format!(
            "Everything: {} (skips what is up to date, resumes after interruption).",
            names.join(", ")
        ))
    });
    for stage in trainer::pipeline::stages::STAGES {
        let name = stage.stage().name();
        if cmd.find_subcommand(name).is_none() {
            let sub = pipeline_cmd::RunArgs::augment_args(clap::Command::new(name));
            cmd = cmd.subcommand(sub.about(stage.about()));
        }
    }
    cmd
}

/// A parsed command line.
pub struct Invocation {
    pub log_format: Option<scdino_base::log::LogFormat>,
    what: What,
}

enum What {
    Command(Box<Cli>),
    Stage(Stage, pipeline_cmd::RunArgs),
}

/// The process's command line, parsed (clap's own exit on `--help` or a usage error).
pub fn parse() -> Invocation {
    parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
}

fn parse_from<I, T>(args: I) -> Result<Invocation, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = command().try_get_matches_from(args)?;
    let generic = matches.subcommand().and_then(|(name, sub)| {
        let stage = name.parse::<Stage>().ok()?;
        (Cli::command().find_subcommand(name).is_none()).then_some((stage, sub))
    });
    Ok(match generic {
        Some((stage, sub)) => Invocation {
            log_format: matches
                .get_one::<scdino_base::log::LogFormat>("log_format")
                .copied(),
            what: What::Stage(stage, pipeline_cmd::RunArgs::from_arg_matches(sub)?),
        },
        None => {
            let cli = Cli::from_arg_matches(&matches)?;
            Invocation {
                log_format: cli.log_format,
                what: What::Command(Box::new(cli)),
            }
        }
    })
}

impl Invocation {
    pub fn run(self) -> Result<()> {
        match self.what {
            What::Command(cli) => cli.run(),
            What::Stage(stage, args) => args.run(Some(stage)),
        }
    }
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
    /// Every stage, in order (skips what is up to date, resumes after interruption); the
    /// stages are listed in its help by `command()`.
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
    fn every_stage_is_a_subcommand_and_one_without_its_own_runs_alone() {
        use super::{parse_from, What};
        let cmd = super::command();
        for stage in trainer::pipeline::Stage::ALL {
            let sub = cmd.find_subcommand(stage.name()).unwrap();
            assert!(sub.get_arguments().any(|a| a.get_id() == "config"));
        }
        let pipeline = cmd.find_subcommand("pipeline").unwrap();
        let about = pipeline.get_about().unwrap().to_string();
        assert!(about.contains("mean-std, train, features,") && about.contains(", report"));
        // `profiling` and `report` have no subcommand of their own: the stage alone, with the
        // flags the launcher renders and its about line.
        for name in ["profiling", "report"] {
            let inv = parse_from([
                "trainer",
                "--log-format",
                "json",
                name,
                "--config",
                "c.yaml",
            ])
            .unwrap();
            assert!(matches!(inv.what, What::Stage(s, _) if s.name() == name));
            assert_eq!(inv.log_format, Some(scdino_base::log::LogFormat::Json));
            let about = cmd.find_subcommand(name).unwrap().get_about().unwrap();
            let stage = trainer::pipeline::stages::STAGES
                .iter()
                .find(|s| s.stage().name() == name)
                .unwrap();
            assert_eq!(about.to_string(), stage.about());
        }
        let inv =
            parse_from(["trainer", "report", "--combination", "1", "--threads", "2"]).unwrap();
        assert!(matches!(
            inv.what,
            What::Stage(trainer::pipeline::Stage::Report, _)
        ));
        assert!(parse_from(["trainer", "report", "--checkpoint", "x"]).is_err());
        // A stage with its own subcommand parses as that command.
        let inv = parse_from(["trainer", "knn", "--config", "c.yaml", "--tag", "epoch4"]).unwrap();
        assert!(matches!(inv.what, What::Command(_)));
        assert_eq!(
            super::launched_config(&["report".into(), "--config".into(), "r.yaml".into()]).unwrap(),
            Some("r.yaml".into())
        );
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
