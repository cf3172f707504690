//! The trainer's single integration-test binary (one libtorch link).
mod augment;
mod config;
mod data;
mod metrics;
mod model;
mod train;
mod util;
