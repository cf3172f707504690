//! Process exit statuses with a meaning beyond success/failure. The trainer returns them and
//! the launcher's generated Slurm scripts branch on them, so they are defined once here.

/// Everything done.
pub const OK: i32 = 0;
/// A failure: bad input, a diverged loss, a dead rank. Rerunning unchanged will not help.
pub const FAILURE: i32 = 1;
/// EX_TEMPFAIL, "try again": a checkpoint was written after a stop signal (SIGUSR1/SIGTERM,
/// Slurm's notice before preemption or the time limit), and a rerun resumes from it. Slurm
/// scripts requeue on it.
pub const PREEMPTED: i32 = 75;
