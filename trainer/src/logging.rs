//! The trainer's log subscriber: the shared line format of `scdino_base::log`, with this
//! process's rank taken from the same variables the process group uses (torchrun's, else
//! Slurm's), and lines routed around the terminal progress bar so the bar is redrawn below
//! them instead of being overwritten.
use crate::distributed::env::DistEnv;
use scdino_base::log::{self, Identity, LogFormat, LogInitError};
use std::sync::Mutex;

/// The crates whose events write their whole text into the message.
const OWN_TARGETS: &[&str] = &["trainer", "scdino_config", "scdino_base"];

static BAR: Mutex<Option<indicatif::ProgressBar>> = Mutex::new(None);

/// Installs the subscriber for `flag` (else `SCDINO_LOG_FORMAT`, else text).
pub fn init(flag: Option<LogFormat>) -> Result<(), LogInitError> {
    log::init(
        log::format_from(flag)?,
        identity(),
        OWN_TARGETS,
        Some(write_line),
    )
}

/// Rank, local rank and world size when this process is one rank of several. A broken
/// variable is the process group's error to report, not the logger's: it logs as a single
/// process until then.
fn identity() -> Identity {
    match DistEnv::from_process_env() {
        Ok(env) if env.world > 1 => Identity {
            host: log::hostname(),
            rank: Some((env.rank, env.local_rank, env.world)),
        },
        _ => Identity::local(),
    }
}

/// Lines are printed above the bar while one is shown.
pub fn show_bar(bar: Option<indicatif::ProgressBar>) {
    *BAR.lock().unwrap_or_else(|p| p.into_inner()) = bar;
}

fn write_line(line: &[u8]) {
    let bar = BAR.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let write = || {
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line);
    };
    match bar {
        Some(b) => b.suspend(write),
        None => write(),
    }
}
