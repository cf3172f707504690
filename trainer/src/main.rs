//! `trainer`: the scDINO command line. Each subcommand is a thin call into the library.
extern crate trainer;

mod cli;

use anyhow::Result;
use clap::Parser;

fn main() -> Result<()> {
    cli::Cli::parse().run()
}
