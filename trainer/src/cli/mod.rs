//! Subcommand definitions and dispatch.
mod bench;
mod config_cmd;
mod data_cmd;
mod train_cmd;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "trainer",
    version,
    about = "scDINO ViT-DINO training on multi-channel microscopy"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate, print or import configuration files.
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// Write a synthetic PBMC-like multi-channel TIFF dataset (the demo data).
    Synth(data_cmd::SynthArgs),
    /// Run student and teacher on one multi-crop batch of the configured dataset.
    Forward(data_cmd::ForwardArgs),
    /// DINO pretraining of one channel combination (resumes automatically).
    Train(train_cmd::TrainArgs),
    /// Measure our model against the PyTorch reference (used by bench/).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

impl Cli {
    pub fn run(self) -> Result<()> {
        match self.command {
            Command::Config(c) => c.run(),
            Command::Bench(b) => b.run(),
            Command::Synth(s) => s.run(),
            Command::Forward(f) => f.run(),
            Command::Train(t) => t.run(),
        }
    }
}
