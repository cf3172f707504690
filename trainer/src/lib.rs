//! scDINO on libtorch: configuration, multi-channel TIFF data and ViT-DINO models.
pub mod config;
pub mod data;
pub mod model;
pub mod probe;
