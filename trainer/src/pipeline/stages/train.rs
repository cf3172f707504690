//! The `train` stage: collective (data parallel on every rank), and it decides for itself how
//! far it is: it resumes from `checkpoint.safetensors`.
use crate::config::Stage;
use crate::pipeline::stage::{At, Flow, PipelineStage, Ranks, Scope};
use crate::pipeline::stage_error::StageError;
use crate::train::run::{train, TrainOptions, TrainOutcome};
use std::path::PathBuf;

pub struct Train;

impl PipelineStage for Train {
    fn stage(&self) -> Stage {
        Stage::Train
    }

    fn about(&self) -> &'static str {
        "DINO pretraining of the model (resumes from its own checkpoints)."
    }

    fn ranks(&self) -> Ranks {
        Ranks::All
    }

    fn scope(&self) -> Scope {
        Scope::Model
    }

    fn inputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.t.run.mean_std()]
    }

    fn outputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.t.files.latest_checkpoint()]
    }

    /// Done once the latest checkpoint has every epoch: a newer mean/std does not retrain.
    fn done(&self, at: &At) -> bool {
        crate::checkpoint::read_meta(&at.t.files.latest_checkpoint())
            .map(|m| m.epoch >= at.t.cfg.train.epochs)
            .unwrap_or(false)
    }

    fn run(&self, at: &At) -> Result<Flow, StageError> {
        let outcome = train(
            at.t.cfg,
            &TrainOptions {
                combination: at.t.combination,
                max_steps: None,
                stop: at.options.stop.clone(),
                allow_new_data: at.options.allow_new_data,
            },
        )?;
        Ok(match outcome {
            TrainOutcome::Finished => Flow::Continue,
            _ => Flow::Stopped,
        })
    }

    fn reported(&self, at: &At) -> Vec<PathBuf> {
        vec![at.t.files.log()]
    }
}
