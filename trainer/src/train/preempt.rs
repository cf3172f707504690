//! Preemption, in one place. Slurm (`--signal`), `scancel` and spot reclaims ask a job to stop
//! with SIGUSR1 or SIGTERM, usually long before an epoch ends; dying there would lose the
//! epoch. So a signal only raises a flag, the epoch loop checkpoints at the next step boundary
//! once every rank agrees, and the process exits with [`EXIT_PREEMPTED`], which job scripts
//! and `trainer launch` read as "requeue and resume", not as a failure.
use super::train_error::TrainError;
use crate::distributed::Collective;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Exit code after a checkpoint on SIGUSR1/SIGTERM (Slurm requeues on it).
pub use scdino_base::exit::PREEMPTED as EXIT_PREEMPTED;

/// Installs the SIGUSR1 and SIGTERM handlers: each sets the returned flag, which the caller
/// hands to training (and the pipeline) as their stop request.
pub fn stop_on_signals() -> std::io::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGUSR1, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

/// Ends the process after a preemption checkpoint, with the code a requeue expects.
pub fn exit_preempted() -> ! {
    std::process::exit(EXIT_PREEMPTED)
}

/// The stop flag as the epoch loop reads it: only at step and epoch boundaries, and only
/// through [`Self::agreed`], so that every rank stops at the same step.
#[derive(Debug, Clone, Default)]
pub struct StopRequest {
    flag: Option<Arc<AtomicBool>>,
}

impl StopRequest {
    /// `None`: nothing can ask this run to stop (tests, library callers).
    pub fn new(flag: Option<Arc<AtomicBool>>) -> Self {
        Self { flag }
    }

    /// True on every rank if a stop reached any: a signal may reach only some ranks first. A
    /// collective: every rank calls it at the same boundary.
    pub fn agreed(&self, group: &mut dyn Collective) -> Result<bool, TrainError> {
        let raised = self.flag.as_ref().is_some_and(|f| f.load(Ordering::SeqCst));
        if group.world_size() == 1 {
            return Ok(raised);
        }
        let mut t =
            tch::Tensor::from_slice(&[f64::from(u8::from(raised))]).to_device(group.device());
        group.all_reduce_sum(&mut t)?;
        Ok(t.double_value(&[0]) > 0.0)
    }
}
