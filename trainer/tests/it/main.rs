//! The trainer's single integration-test binary (one libtorch link).
mod analysis;
mod augment;
mod channels;
mod config;
mod data;
mod dist;
mod evaluate;
mod export;
mod knn;
mod metrics;
mod model;
mod pth;
mod s3;
mod shards;
mod train;
mod umap;
mod util;
