//! `launcher`: renders and submits the scDINO pipeline as Slurm jobs (Pyxis/Enroot).
use anyhow::Result;
use clap::{Parser, Subcommand};

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
    /// Print a command line with every word quoted for the shell, as generated scripts do.
    Quote {
        /// The words to quote.
        words: Vec<String>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Quote { words } => println!("{}", launcher::shell::join(words)),
    }
    Ok(())
}
