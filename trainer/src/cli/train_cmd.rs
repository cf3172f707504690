use anyhow::{Context, Result};
use clap::Args;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use trainer::train::preempt;
use trainer::train::run::{model_dir, train, TrainOptions, TrainOutcome};

/// SIGUSR1 (Slurm's --signal) and SIGTERM (scancel, preemption) set this flag: checkpoint at
/// the next step boundary, then exit with EXIT_PREEMPTED so a requeued job resumes (see
/// [`preempt`]).
pub fn stop_flag() -> Result<Arc<AtomicBool>> {
    preempt::stop_on_signals().context("installing signal handlers")
}

/// `trainer train`: DINO pretraining; resumes automatically from the output folder.
#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Index into data.channel_combinations (one model per combination).
    #[arg(long, default_value_t = 0)]
    combination: usize,
    /// Stop with a checkpoint once this global iteration is reached (time-limited segments).
    #[arg(long)]
    max_steps: Option<usize>,
    /// Threads for libtorch's intra-op pool (default: libtorch's choice).
    #[arg(long)]
    threads: Option<i32>,
    /// Resume even though data.dataset_dir is not the dataset the run's checkpoint trained
    /// on: the run continues (same position, schedules and split rule) on the new data.
    #[arg(long)]
    allow_new_data: bool,
}

impl TrainArgs {
    pub fn run(self) -> Result<()> {
        if let Some(t) = self.threads {
            tch::set_num_threads(t);
        }
        let cfg = self.config.load()?;
        let stop = stop_flag()?;
        let opts = TrainOptions {
            combination: self.combination,
            max_steps: self.max_steps,
            stop: Some(stop),
            allow_new_data: self.allow_new_data,
        };
        let dir = cfg
            .channel_sets
            .get(self.combination)
            .map(|c| model_dir(&cfg, c))
            .unwrap_or_default();
        let outcome = train(&cfg, &opts).with_context(|| format!("training {}", dir.display()))?;
        match outcome {
            TrainOutcome::Finished => tracing::info!("training finished: {}", dir.display()),
            TrainOutcome::StepLimit => {
                tracing::info!("step limit reached; rerun to continue: {}", dir.display())
            }
            TrainOutcome::Preempted => {
                tracing::info!(
                    "stopped by signal (a run that had started wrote a checkpoint first); rerun to resume: {}",
                    dir.display()
                );
                preempt::exit_preempted();
            }
        }
        Ok(())
    }
}

/// `trainer launch`: N local ranks of a trainer command, like `torchrun --standalone`.
#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// Processes (ranks) to start on this machine. Default: `train.num_gpus` of the run
    /// config the launched command reads (its `--config`, else the one baked into the image).
    #[arg(long)]
    nproc: Option<usize>,
    /// Rendezvous port on 127.0.0.1.
    #[arg(long, default_value_t = 29500)]
    master_port: u16,
    /// Seconds the other ranks get to exit after one failed, before they are killed.
    #[arg(long, default_value_t = 30)]
    grace: u64,
    /// The trainer command every rank runs, e.g. `-- train --config demo.yaml`.
    #[arg(last = true, required = true)]
    args: Vec<String>,
}

impl LaunchArgs {
    pub fn run(self) -> Result<()> {
        let nproc = match self.nproc {
            Some(n) => n,
            None => self.num_gpus()?,
        };
        anyhow::ensure!(nproc >= 1, "--nproc must be at least 1");
        let code =
            trainer::distributed::launch::launch(&trainer::distributed::launch::LaunchOptions {
                nproc,
                master_port: self.master_port,
                args: self.args,
                grace: std::time::Duration::from_secs(self.grace),
            })?;
        std::process::exit(code);
    }

    /// `train.num_gpus` of the launched command's run config: scDINO's processes per node.
    fn num_gpus(&self) -> Result<usize> {
        let Some(path) = super::launched_config(&self.args)? else {
            anyhow::bail!(
                "--nproc is not given and `{}` takes no --config whose train.num_gpus would say how many ranks to start: pass --nproc N",
                self.args.join(" ")
            );
        };
        // Read without `Config::load`'s notices: every rank loads the file and gives them.
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        let cfg = trainer::config::Config::from_yaml(&text, &path.display().to_string())?;
        tracing::info!(
            "launch: {} ranks (train.num_gpus of {}; --nproc overrides it)",
            cfg.train.num_gpus,
            path.display()
        );
        Ok(cfg.train.num_gpus)
    }
}
