//! The trainer's single integration-test binary (one libtorch link).
mod analysis;
mod augment;
mod channels;
mod config;
mod data;
mod dist;
mod evaluate;
mod knn;
mod metrics;
mod model;
mod profiles;
mod pth;
mod s3;
mod shards;
mod train;
mod umap;
mod util;
