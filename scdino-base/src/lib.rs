//! The small base both binaries build on, without libtorch, so that the launcher and the
//! trainer use literally the same code for the things where a disagreement
//! would be a bug: how a file is replaced on disk, what an exit status means, how a seed
//! becomes a sequence of numbers, and what a log line looks like.
pub mod exit;
pub mod fs;
pub mod log;
pub mod report;
pub mod rng;
