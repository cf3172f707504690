//! scDINO on libtorch: configuration, multi-channel TIFF data and ViT-DINO models.
#[cfg(test)]
mod alloc_count;
pub mod analysis;
pub mod augment;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod device;
pub mod dist;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod plot;
pub mod precision;
pub mod probe;
pub mod pth;
pub mod train;
