//! The analyses around training: the dataset mean/std that normalises every crop, CLS
//! features of the held-out images, and the weighted kNN evaluation.
pub mod backbone;
pub mod features;
pub mod knn;
pub mod mean_std;
