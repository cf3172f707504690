//! The pipeline's stages, one file each: its work (a `run_…` function the single-stage
//! command `trainer <stage>` calls too, so both write exactly the same files, each atomically)
//! and its [`PipelineStage`], registered once in [`STAGES`]. docs/architecture.md lists where
//! a new stage goes.
pub mod attention;
pub mod evaluate;
pub mod features;
pub mod knn;
pub mod mean_std;
pub mod profiling;
pub mod report;
pub mod train;
pub mod umap;

pub use super::target::{sort_tags, tag_of_checkpoint, Dataset, Target};
pub use attention::run_attention;
pub use evaluate::{read_evaluation, run_evaluate, run_evaluate_profiles, run_scores};
pub use features::{run_features, FeaturesRun};
pub use knn::{best_k, read_knn_json, run_knn, run_knn_on};
pub use umap::{run_umap, run_umap_on, UmapSummary};

use super::stage::PipelineStage;

/// Every stage the pipeline runs, in pipeline order (`scdino_config::STAGES`'s, which a test
/// holds).
pub const STAGES: &[&dyn PipelineStage] = &[
    &mean_std::MeanStd,
    &train::Train,
    &features::Features,
    &knn::Knn,
    &evaluate::Evaluate,
    &umap::Umap,
    &attention::Attention,
    &profiling::Profiling,
    &report::Report,
];

#[cfg(test)]
mod tests {
    use super::STAGES;
    use crate::config::Stage;

    /// One line per stage of the config crate's list, in its order.
    #[test]
    fn every_stage_is_registered_in_pipeline_order() {
        let registered: Vec<Stage> = STAGES.iter().map(|s| s.stage()).collect();
        assert_eq!(registered, Stage::ALL);
    }
}
