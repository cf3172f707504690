//! `trainer`: the scDINO command line. Each subcommand is a thin call into the library.
extern crate trainer;

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::parse();
    if let Err(e) = trainer::logging::init(cli.log_format) {
        eprintln!("Error: {e}");
        return ExitCode::FAILURE;
    }
    match cli.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A libtorch error is internal: it keeps anyhow's backtrace (with RUST_BACKTRACE).
            let internal = e.chain().any(|c| c.is::<tch::TchError>());
            let chain = if internal {
                format!("{e:?}")
            } else {
                scdino_base::log::chain_text(e.as_ref())
            };
            scdino_base::log::report_error(&chain, &format!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}
