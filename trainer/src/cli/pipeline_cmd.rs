use anyhow::Result;
use clap::Args;
use trainer::pipeline::{run_pipeline, PipelineOptions, PipelineOutcome};

/// `trainer pipeline`: every stage for every channel combination, make-like.
#[derive(Debug, Args)]
pub struct PipelineArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Only this channel combination (default: all of them, in order).
    #[arg(long)]
    combination: Option<usize>,
    /// Threads for libtorch's intra-op pool (default: libtorch's choice).
    #[arg(long)]
    threads: Option<i32>,
    /// Print the stages this trainer runs, in order, one per line (each is a subcommand),
    /// and exit.
    #[arg(long)]
    list_stages: bool,
    /// Let training resume even though data.dataset_dir is not the dataset the run's
    /// checkpoint trained on (see `trainer train --allow-new-data`).
    #[arg(long)]
    allow_new_data: bool,
}

impl PipelineArgs {
    pub fn run(self) -> Result<()> {
        if self.list_stages {
            for stage in trainer::pipeline::Stage::ALL {
                println!("{}", stage.name());
            }
            return Ok(());
        }
        if let Some(t) = self.threads {
            tch::set_num_threads(t);
        }
        let cfg = self.config.load()?;
        let opts = PipelineOptions {
            combinations: self.combination.map(|c| vec![c]),
            stop: Some(super::train_cmd::stop_flag()?),
            allow_new_data: self.allow_new_data,
        };
        let rank = trainer::distributed::env::DistEnv::from_process_env()?.rank;
        match run_pipeline(&cfg, &opts)? {
            // Other ranks only took part in the collective stages; rank 0 reports.
            PipelineOutcome::Finished(runs) if rank != 0 => {
                tracing::info!(
                    "rank {rank}: pipeline finished ({} collective stages ran)",
                    runs.iter().filter(|r| r.ran).count()
                );
                Ok(())
            }
            PipelineOutcome::Finished(runs) => {
                let ran = runs.iter().filter(|r| r.ran).count();
                tracing::info!(
                    "pipeline finished: {ran} stages ran, {} were up to date",
                    runs.len() - ran
                );
                for c in opts
                    .combinations
                    .unwrap_or_else(|| (0..cfg.channel_sets.len()).collect())
                {
                    let t = trainer::pipeline::stages::Target::new(&cfg, c)?;
                    println!("{}", t.files.report_html().display());
                }
                Ok(())
            }
            PipelineOutcome::Preempted(_) => {
                tracing::info!("pipeline stopped by signal; rerun to continue");
                trainer::train::preempt::exit_preempted();
            }
        }
    }
}
