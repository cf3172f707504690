//! scDINO on libtorch: configuration, multi-channel TIFF data and ViT-DINO models.
#[cfg(test)]
mod alloc_count;
pub mod analysis;
pub mod augment;
pub mod bench;
pub mod build_info;
pub mod checkpoint;
mod cpu_values;
pub mod cuda_graph;
/// The run config lives in its own crate (no libtorch) so the launcher applies the same rules.
pub use scdino_config as config;
pub mod data;
pub mod device;
pub mod distributed;
pub mod embed;
pub mod export;
pub mod foreach;
pub mod gpu;
pub mod layout;
pub mod logging;
pub mod model;
pub mod monitoring;
pub mod parquet_columns;
pub mod pipeline;
pub mod plot;
pub mod precision;
pub mod probe;
pub mod pth;
pub mod scoring;
pub mod selftest;
mod shim;
pub mod tensor_file;
pub mod train;
