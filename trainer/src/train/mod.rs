//! DINO training: schedules, loss, optimiser, the iteration, and (in `run`) the epoch loop.
pub mod ahead;
pub mod bag;
pub mod channels;
pub mod collapse;
pub mod error;
pub mod flops;
pub mod input;
pub mod koleo;
pub mod loader;
pub mod loss;
pub mod optim;
pub mod run;
pub mod sampler;
pub mod schedule;
pub mod step;
pub mod strategy;
pub mod telemetry;
