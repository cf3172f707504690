//! The trainer's single integration-test binary (one libtorch link).
mod config;
mod data;
mod model;
mod util;
