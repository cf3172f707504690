//! The analyses around training: the dataset mean/std that normalises every crop, CLS
//! features of the held-out images, the weighted kNN evaluation, UMAP and attention maps.
pub mod attention;
pub mod backbone;
pub mod features;
pub mod knn;
pub mod mean_std;
pub mod umap;
