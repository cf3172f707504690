//! DINO training: schedules, loss, optimiser, the iteration (`step`), the parallel strategy,
//! and (in `run`) a whole run: setup, the epoch loop and how it ends.
pub mod ahead;
pub mod channel_dino;
pub mod channel_set_batches;
pub mod channels;
pub mod collapse;
pub mod dichavit;
pub mod flops;
pub mod graphed;
pub mod ibot;
pub mod init;
pub mod init_layout;
pub mod input;
pub mod koleo;
pub mod loader;
pub mod loss;
pub mod loss_term;
pub mod loss_terms;
pub mod optim;
pub mod preempt;
pub mod run;
pub mod sampler;
pub mod schedule;
pub mod step;
pub mod strategy;
pub mod telemetry;
pub mod train_error;
