//! Image and Slurm/Pyxis launcher for the scDINO pipeline. It never links libtorch: it talks
//! to the Docker Engine and registries, and writes and submits scripts, so it builds and tests
//! anywhere.
//!
//! - [`image`]: build, push, inspect, run and squash the OCI image;
//! - [`cluster`]: the strict `cluster.yaml`;
//! - [`render`]: one sbatch script per job plus `manifest.json`;
//! - [`slurm`]: `sbatch --test-only`, `sbatch --parsable` chains, status and cancel;
//! - [`embed`]: the trainer's `embed` as one job of ranks or a job array and a merge job;
//! - [`nccl_test`]: a collectives benchmark job across the nodes, and its verdict;
//! - [`shell`]: the one place that quotes values for scripts.
pub mod cluster;
pub mod container_view;
pub mod embed;
pub mod fsutil;
pub mod image;
pub mod nccl_test;
pub mod render;
pub mod scaling;
pub mod selftest;
pub mod shell;
pub mod slurm;
pub mod tls;
