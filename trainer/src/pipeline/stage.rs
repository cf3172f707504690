//! The interface of a pipeline stage, [`PipelineStage`]: what it runs for, on which ranks, what
//! it reads and writes, its work, and the files of it that the report shows. The runner
//! (`pipeline/mod.rs`) asks only this, so a stage is its own file under `stages/` and one line
//! in [`super::stages::STAGES`]; the facts the launcher shares (name, needs, kind of job) are
//! its line in `scdino_config::STAGES`. This file imports no stage, so the stages and the
//! registry import it without a cycle.
use super::stage_error::StageError;
use super::target::Target;
use crate::config::Stage;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::SystemTime;

/// What the pipeline was asked for, which a stage's work may read.
#[derive(Debug, Clone, Default)]
pub struct PipelineOptions {
    /// Channel combinations to run (default: all).
    pub combinations: Option<Vec<usize>>,
    pub stop: Option<Arc<AtomicBool>>,
    /// Training may resume on another dataset than its checkpoint's (see
    /// [`crate::train::run::TrainOptions::allow_new_data`]).
    pub allow_new_data: bool,
    /// Run this stage alone (for every checkpoint it is due for, skipping what is up to date),
    /// as `trainer <stage>` does for a stage without a subcommand of its own; default: every
    /// stage.
    pub only: Option<Stage>,
}

impl PipelineOptions {
    /// Whether `stage` runs under these options.
    pub fn runs(&self, stage: Stage) -> bool {
        self.only.is_none_or(|only| only == stage)
    }
}

/// Which ranks run a stage when the pipeline runs on several (`trainer launch`, srun).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranks {
    /// Collective: every rank takes part.
    All,
    /// Rank 0 alone; the others go on to the next collective stage and wait for it there.
    Lead,
}

/// What one run of a stage is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Once per model.
    Model,
    /// Once per numbered checkpoint ([`PipelineStage::checkpoints`] says which); the
    /// per-checkpoint stages that follow each other in the registry run checkpoint by
    /// checkpoint, so an interrupted run has its older checkpoints analysed whole.
    Checkpoint,
}

/// A numbered checkpoint: its tag (`epoch4`) and its file.
pub type Checkpoint = (String, PathBuf);

/// Where one run of a stage stands.
pub struct At<'a> {
    pub t: &'a Target<'a>,
    pub options: &'a PipelineOptions,
    /// The checkpoint a per-checkpoint stage runs for (None for a per-model stage).
    pub checkpoint: Option<&'a Checkpoint>,
    /// The files that the stages before this one show in the report ([`PipelineStage::reported`]),
    /// for every checkpoint they ran for: the report's inputs.
    pub reported: &'a [PathBuf],
}

impl At<'_> {
    /// The checkpoint's tag and file; a per-checkpoint stage's [`PipelineStage`] methods only
    /// run with one.
    pub fn checkpoint(&self) -> (&str, &Path) {
        let (tag, path) = self
            .checkpoint
            .expect("a per-checkpoint stage runs for a checkpoint");
        (tag, path)
    }
}

/// How a stage's work ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// A stop signal ended it early (training checkpointed); the pipeline stops here.
    Stopped,
}

/// One stage of `trainer pipeline`. Make-like: its work runs unless [`Self::done`] says its
/// outputs are current.
pub trait PipelineStage: Sync {
    /// Which stage it is (its name, needs and kind of job: `scdino_config::STAGES`).
    fn stage(&self) -> Stage;

    /// One line on what it makes: `trainer <stage> --help` says it for a stage without a
    /// subcommand of its own.
    fn about(&self) -> &'static str;

    fn ranks(&self) -> Ranks {
        Ranks::Lead
    }

    fn scope(&self) -> Scope {
        Scope::Checkpoint
    }

    /// The numbered checkpoints it runs for, of those training kept (per-checkpoint stages):
    /// every one by default.
    fn checkpoints(&self, _t: &Target, all: &[Checkpoint]) -> Vec<Checkpoint> {
        all.to_vec()
    }

    /// The files whose change reruns it.
    fn inputs(&self, at: &At) -> Vec<PathBuf>;

    /// The files it writes.
    fn outputs(&self, at: &At) -> Vec<PathBuf>;

    /// Whether its outputs are current. Every rank decides a collective stage alike: rank 0
    /// writes files only inside collective stages, which end with all ranks together.
    fn done(&self, at: &At) -> bool {
        up_to_date(&self.outputs(at), &self.inputs(at))
    }

    fn run(&self, at: &At) -> Result<Flow, StageError>;

    /// Its files that the report shows (a newer one rewrites the report); none by default.
    fn reported(&self, _at: &At) -> Vec<PathBuf> {
        vec![]
    }
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// True when every output exists and none is older than the newest existing input.
pub fn up_to_date(outputs: &[PathBuf], inputs: &[PathBuf]) -> bool {
    let newest_input = inputs.iter().filter_map(|p| mtime(p)).max();
    outputs.iter().all(|o| match (mtime(o), newest_input) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(out), Some(inp)) => out >= inp,
    })
}
