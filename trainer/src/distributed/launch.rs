//! `trainer launch --nproc N -- <trainer args>`: N local ranks like `torchrun --standalone`.
//! Signals are forwarded to every rank; if one rank fails, the others are stopped and the
//! launcher exits non-zero; if all exit with the preemption code, so does the launcher. Once a
//! rank has exited with the preemption code, the others get the same grace period to follow
//! and are then killed and counted as stopped: a rank that got no signal of its own (one
//! waiting at a rendezvous sees its own stop flag, not another rank's exit) would otherwise
//! wait out the group's timeout.
use scdino_base::exit::PREEMPTED as EXIT_PREEMPTED;
use scdino_base::log::{current_format, FORMAT_ENV};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct LaunchOptions {
    pub nproc: usize,
    pub master_port: u16,
    pub args: Vec<String>,
    /// After a failure, how long the other ranks get to exit after SIGTERM before SIGKILL;
    /// after a rank stopped (preemption code), how long the others get to follow.
    pub grace: Duration,
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a pid we spawned; a stale pid at worst gets ESRCH.
    unsafe {
        libc_kill(child.id() as i32, sig);
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot find this executable: {0}")]
    Executable(std::io::Error),
    #[error("cannot start rank {rank}: {source}")]
    Spawn { rank: usize, source: std::io::Error },
    #[error("cannot install signal handler: {0}")]
    Signal(std::io::Error),
}

/// Runs the ranks to completion; returns the exit code the launcher should use.
pub fn launch(opts: &LaunchOptions) -> Result<i32, LaunchError> {
    let mut children = spawn_ranks(opts)?;
    let signals = RelayedSignals::register()?;
    let (codes, killed_after_stop) = supervise(opts, &mut children, &signals);
    // A rank killed for not following a stop counts as stopped (everything it wrote is atomic).
    let codes: Vec<i32> = codes
        .into_iter()
        .zip(&killed_after_stop)
        .map(|(c, &killed)| {
            if killed {
                EXIT_PREEMPTED
            } else {
                c.unwrap_or(1)
            }
        })
        .collect();
    Ok(launch_exit_code(&codes))
}

/// One child process per rank, each told its rank and the rendezvous as torchrun would.
fn spawn_ranks(opts: &LaunchOptions) -> Result<Vec<std::process::Child>, LaunchError> {
    let exe = std::env::current_exe().map_err(LaunchError::Executable)?;
    let mut children = Vec::with_capacity(opts.nproc);
    // As torchrun: N ranks each with a full OpenMP pool oversubscribe the cores (Gloo's
    // reduce_scatter measured 10x slower), so one thread per rank unless the user chose.
    let omp = std::env::var("OMP_NUM_THREADS").unwrap_or_else(|_| "1".to_string());
    for rank in 0..opts.nproc {
        let child = Command::new(&exe)
            .args(&opts.args)
            .env("OMP_NUM_THREADS", &omp)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", opts.nproc.to_string())
            .env("LOCAL_WORLD_SIZE", opts.nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", opts.master_port.to_string())
            // The ranks log as this process was asked to (`--log-format` is not in `args`).
            .env(FORMAT_ENV, current_format().as_str())
            .spawn()
            .map_err(|source| LaunchError::Spawn { rank, source })?;
        children.push(child);
    }
    Ok(children)
}

/// SIGTERM/SIGUSR1/SIGINT received by the launcher, to relay to the ranks: the handler only
/// records the signal, the supervising loop relays it.
struct RelayedSignals {
    pending: Arc<AtomicUsize>,
    seen: Arc<AtomicBool>,
}

impl RelayedSignals {
    fn register() -> Result<Self, LaunchError> {
        let pending = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(AtomicBool::new(false));
        for sig in [
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGUSR1,
            signal_hook::consts::SIGINT,
        ] {
            let (pending, seen) = (pending.clone(), seen.clone());
            // SAFETY: the handler only stores to atomics (async-signal-safe).
            unsafe {
                signal_hook::low_level::register(sig, move || {
                    pending.store(sig as usize, Ordering::SeqCst);
                    seen.store(true, Ordering::SeqCst);
                })
            }
            .map_err(LaunchError::Signal)?;
        }
        Ok(Self { pending, seen })
    }

    /// The signal received since the last call, if any.
    fn take(&self) -> Option<i32> {
        self.seen
            .swap(false, Ordering::SeqCst)
            .then(|| self.pending.load(Ordering::SeqCst) as i32)
    }
}

/// Waits for every rank: relays signals, stops the others when one fails (killing them a
/// grace period later), and kills a rank that has not followed the others' stop within the
/// grace period. Returns each rank's exit code and whether it was killed after a stop.
fn supervise(
    opts: &LaunchOptions,
    children: &mut [std::process::Child],
    signals: &RelayedSignals,
) -> (Vec<Option<i32>>, Vec<bool>) {
    let mut codes: Vec<Option<i32>> = vec![None; opts.nproc];
    let mut failed_at: Option<Instant> = None;
    let mut stopped_at: Option<Instant> = None;
    let mut killed_after_stop = vec![false; opts.nproc];
    loop {
        if let Some(sig) = signals.take() {
            for (c, code) in children.iter().zip(&codes) {
                if code.is_none() {
                    signal(c, sig);
                }
            }
        }
        let mut newly_failed = false;
        for (rank, c) in children.iter_mut().enumerate() {
            if codes[rank].is_none() {
                if let Ok(Some(status)) = c.try_wait() {
                    let code = status.code().unwrap_or(128 + 9);
                    codes[rank] = Some(code);
                    if code == EXIT_PREEMPTED && stopped_at.is_none() {
                        stopped_at = Some(Instant::now());
                    }
                    if code != 0 && failed_at.is_none() && code != EXIT_PREEMPTED {
                        tracing::error!(
                            "launch: rank {rank} exited with {status}; stopping the other ranks"
                        );
                        newly_failed = true;
                    }
                }
            }
        }
        if newly_failed {
            failed_at = Some(Instant::now());
            for (other, oc) in children.iter().zip(&codes) {
                if oc.is_none() {
                    signal(other, signal_hook::consts::SIGTERM);
                }
            }
        }
        if codes.iter().all(Option::is_some) {
            return (codes, killed_after_stop);
        }
        if let Some(t) = failed_at {
            if t.elapsed() > opts.grace {
                for (c, code) in children.iter_mut().zip(&codes) {
                    if code.is_none() {
                        let _ = c.kill();
                    }
                }
            }
        } else if let Some(t) = stopped_at {
            if t.elapsed() > opts.grace {
                for (rank, c) in children.iter_mut().enumerate() {
                    if codes[rank].is_none() && !killed_after_stop[rank] {
                        tracing::warn!(
                            "launch: rank {rank} did not stop within {:?} of the others; killing it",
                            opts.grace
                        );
                        killed_after_stop[rank] = true;
                        let _ = c.kill();
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The launcher's exit code from its ranks': 0 when all succeeded, [`EXIT_PREEMPTED`] when
/// all succeeded or stopped, else the first failure's.
fn launch_exit_code(codes: &[i32]) -> i32 {
    if codes.iter().all(|&c| c == 0) {
        0
    } else if codes.iter().all(|&c| c == 0 || c == EXIT_PREEMPTED) {
        EXIT_PREEMPTED
    } else {
        codes
            .iter()
            .copied()
            .find(|&c| c != 0 && c != EXIT_PREEMPTED)
            .unwrap_or(1)
    }
}
