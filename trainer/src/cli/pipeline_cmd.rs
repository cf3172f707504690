use anyhow::Result;
use clap::Args;
use trainer::pipeline::{run_pipeline, PipelineOptions, PipelineOutcome, Stage};

/// What selects and runs stages: `trainer pipeline`'s flags, and those of `trainer <stage>`
/// for a stage without a subcommand of its own.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Only this channel combination (default: all of them, in order).
    #[arg(long)]
    combination: Option<usize>,
    /// Threads for libtorch's intra-op pool (default: libtorch's choice).
    #[arg(long)]
    threads: Option<i32>,
    /// Let training resume even though data.dataset_dir is not the dataset the run's
    /// checkpoint trained on (see `trainer train --allow-new-data`).
    #[arg(long)]
    allow_new_data: bool,
}

/// `trainer pipeline`: every stage for every channel combination, make-like.
#[derive(Debug, Args)]
pub struct PipelineArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Print the stages this trainer runs, in order, one per line (each is a subcommand),
    /// and exit.
    #[arg(long)]
    list_stages: bool,
    /// Run this stage alone, as `trainer <stage>` does (for every checkpoint it is due for,
    /// what is up to date skipped).
    #[arg(long, value_name = "STAGE", value_parser = stage_name)]
    stage: Option<Stage>,
}

fn stage_name(s: &str) -> Result<Stage, String> {
    s.parse::<Stage>().map_err(|e| e.to_string())
}

impl PipelineArgs {
    pub fn run(self) -> Result<()> {
        if self.list_stages {
            for stage in Stage::ALL {
                println!("{}", stage.name());
            }
            return Ok(());
        }
        self.run.run(self.stage)
    }
}

impl RunArgs {
    /// The stages (`only` one, or all) through the pipeline's runner: stopped by a signal, it
    /// exits as a preempted training does; finished, rank 0 prints what it wrote.
    pub fn run(self, only: Option<Stage>) -> Result<()> {
        if let Some(t) = self.threads {
            tch::set_num_threads(t);
        }
        let cfg = self.config.load()?;
        let opts = PipelineOptions {
            combinations: self.combination.map(|c| vec![c]),
            stop: Some(super::train_cmd::stop_flag()?),
            allow_new_data: self.allow_new_data,
            only,
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
                if !opts.runs(Stage::Report) {
                    return Ok(());
                }
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
