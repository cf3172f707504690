//! The small base both binaries build on. It has no dependencies so that the launcher (no
//! libtorch) and the trainer use literally the same code for the things where a disagreement
//! would be a bug: how a file is replaced on disk, what an exit status means, and how a seed
//! becomes a sequence of numbers.
pub mod exit;
pub mod fs;
pub mod rng;
