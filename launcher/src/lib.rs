//! Slurm/Pyxis launcher for the scDINO pipeline. It never links libtorch: it only writes and
//! submits scripts, so it builds and tests anywhere.
pub mod shell;
