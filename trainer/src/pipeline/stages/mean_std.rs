//! The `mean-std` stage: the dataset's per-channel mean and standard deviation, which training
//! and every analysis normalise with.
use crate::config::Stage;
use crate::pipeline::stage::{At, Flow, PipelineStage, Scope};
use crate::pipeline::stage_error::StageError;
use std::path::PathBuf;

/// On rank 0 alone: training's ranks wait for it at their rendezvous and read the file.
pub struct MeanStd;

impl PipelineStage for MeanStd {
    fn stage(&self) -> Stage {
        Stage::MeanStd
    }

    fn about(&self) -> &'static str {
        "Per-channel mean/std of the dataset (scDINO's mean_and_std_of_dataset.txt)."
    }

    fn scope(&self) -> Scope {
        Scope::Model
    }

    fn inputs(&self, _at: &At) -> Vec<PathBuf> {
        vec![]
    }

    fn outputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.t.run.mean_std()]
    }

    fn run(&self, at: &At) -> Result<Flow, StageError> {
        let cfg = at.t.cfg;
        let source = crate::data::open_source(&cfg.data)?;
        crate::data::mean_std::load_or_compute(cfg, source.as_ref(), &at.t.run.mean_std())?;
        Ok(Flow::Continue)
    }

    fn reported(&self, at: &At) -> Vec<PathBuf> {
        self.outputs(at)
    }
}
