//! `trainer`: the scDINO command line. Each subcommand is a thin call into the library.
extern crate trainer;

mod cli;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    if let Err(e) = trainer::logging::init(cli.log_format) {
        eprintln!("Error: {e}");
        return ExitCode::FAILURE;
    }
    match cli.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            scdino_base::log::report_error(&format!("{e:?}"), &format!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}
