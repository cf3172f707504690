//! `launcher`: renders and submits the scDINO pipeline as Slurm jobs (Pyxis/Enroot).
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use launcher::cluster::Cluster;
use launcher::render::{self, Inputs, Manifest, Rendered};
use launcher::slurm;
use std::path::{Path, PathBuf};

#[derive(Debug, Parser)]
#[command(
    name = "launcher",
    version,
    about = "Submit the scDINO pipeline to Slurm with Pyxis/Enroot"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write one reviewable sbatch script per job and manifest.json into --out.
    Render(RenderArgs),
    /// Render, check every script with `sbatch --test-only`, then submit the chain.
    Submit(RenderArgs),
    /// Per-job state of a submitted pipeline (scontrol; sacct where accounting exists).
    Status {
        /// The folder `launcher submit` wrote.
        #[arg(long)]
        out: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Cancel every pending or running job of a submitted pipeline.
    Cancel {
        #[arg(long)]
        out: PathBuf,
    },
    /// Print a command line with every word quoted for the shell, as generated scripts do.
    Quote {
        /// The words to quote.
        words: Vec<String>,
    },
}

#[derive(Debug, Args)]
struct RenderArgs {
    /// cluster.yaml (see slurm/cluster.example.yaml).
    #[arg(long)]
    cluster: PathBuf,
    /// The trainer config (default: `trainer_config` of cluster.yaml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Folder for the scripts and manifest.json (on a filesystem the nodes see).
    #[arg(long)]
    out: PathBuf,
}

fn absolute(p: &Path, cwd: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    }
}

fn do_render(a: &RenderArgs) -> Result<(PathBuf, Rendered)> {
    let cwd = std::env::current_dir().context("current directory")?;
    let cluster = Cluster::load(&a.cluster)?;
    let config = a
        .config
        .clone()
        .or_else(|| cluster.trainer_config.clone())
        .context("no trainer config: pass --config or set trainer_config in the cluster file")?;
    let config = absolute(&config, &cwd);
    let text = std::fs::read_to_string(&config)
        .with_context(|| format!("reading the trainer config {}", config.display()))?;
    let combinations = render::trainer_combinations(&text, &config.display().to_string())?;
    let out = absolute(&a.out, &cwd);
    let inputs = Inputs {
        trainer_config: config,
        combinations,
        out: out.clone(),
        cwd: cwd.clone(),
        cluster_file: Some(absolute(&a.cluster, &cwd)),
    };
    let r = render::render(&cluster, &inputs)?;
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
    Ok((out, r))
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Quote { words } => println!("{}", launcher::shell::join(words)),
        Command::Render(a) => {
            let (out, r) = do_render(&a)?;
            render::write(&r, &out)?;
            for (name, _) in &r.scripts {
                println!("{}", out.join(name).display());
            }
            println!("{}", out.join(render::MANIFEST).display());
        }
        Command::Submit(a) => {
            let out = absolute(&a.out, &std::env::current_dir()?);
            // Re-rendering would forget the ids of a pipeline that is still queued or running.
            if out.join(render::MANIFEST).exists() {
                if let Ok(old) = Manifest::load(&out) {
                    let active: Vec<String> = slurm::status(&old)?
                        .into_iter()
                        .filter(slurm::JobState::is_active)
                        .map(|s| format!("{} ({})", s.name, s.job_id.unwrap_or_default()))
                        .collect();
                    if !active.is_empty() {
                        bail!(
                            "{} holds a pipeline that is still queued or running: {}; `launcher cancel --out {}` first, or use another --out",
                            out.display(),
                            active.join(", "),
                            out.display()
                        );
                    }
                }
            }
            let (out, mut r) = do_render(&a)?;
            render::write(&r, &out)?;
            slurm::submit(&out, &mut r.manifest, &mut |l| println!("{l}"))?;
            println!(
                "submitted {} jobs; manifest {}; follow with: launcher status --out {}",
                r.manifest.jobs.len(),
                out.join(render::MANIFEST).display(),
                launcher::shell::quote(&out.to_string_lossy())
            );
        }
        Command::Status { out, json } => {
            let m = Manifest::load(&out)?;
            let states = slurm::status(&m)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&states)?);
            } else {
                print!("{}", slurm::table(&states));
            }
        }
        Command::Cancel { out } => {
            let m = Manifest::load(&out)?;
            let ids = slurm::cancel(&m)?;
            if ids.is_empty() {
                println!(
                    "nothing to cancel: no job of {} is pending or running",
                    out.display()
                );
            } else {
                println!("cancelled {}", ids.join(" "));
            }
        }
    }
    Ok(())
}
