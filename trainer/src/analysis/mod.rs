//! The analyses around training: CLS features of the held-out images, the weighted kNN evaluation, UMAP and attention maps, and
//! the evaluation on a test folder (kNN + linear probe with sklearn-defined metrics).
pub mod attention;
pub mod evaluate;
pub mod features;
pub mod knn;
pub mod linear_probe;
pub mod pretrained;
pub mod profiles;
pub mod umap;
