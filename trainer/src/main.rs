//! `trainer`: the scDINO command line. Each subcommand is a thin call into the library.
extern crate trainer;

mod cli;

use clap::Parser;
use scdino_base::log::LogFormat;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let format = match trainer::logging::init(cli.log_format) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report_error(format, &e);
            ExitCode::FAILURE
        }
    }
}

/// As `fn main() -> anyhow::Result` prints it (the chain of causes) in text; one JSON line
/// (the chain joined by `: `) for log shipping.
fn report_error(format: LogFormat, e: &anyhow::Error) {
    match format {
        LogFormat::Text => eprintln!("Error: {e:?}"),
        LogFormat::Json => tracing::error!("{e:#}"),
    }
}
