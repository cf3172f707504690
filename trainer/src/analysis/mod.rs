//! Analyses around training. Today: the dataset mean/std that normalises every crop.
pub mod mean_std;
