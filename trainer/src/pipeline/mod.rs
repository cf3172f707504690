//! `trainer pipeline`: mean-std → train → features → knn → evaluate → umap → attention →
//! profiling → report, for every checkpoint training kept (`checkpoint_every` epochs and the
//! last; profiling for the checkpoints `downstream.profiling` names), in one process.
//!
//! Make-like: a stage runs only if one of its outputs is missing or older than one of its
//! inputs, so rerunning after an interruption (or after training more epochs) redoes exactly
//! the missing work. Every output is written atomically, so a file that exists is complete.
//! Training resumes from its own checkpoints. A stop signal ends the pipeline at the next stage
//! or step boundary with [`crate::train::run::EXIT_PREEMPTED`] semantics.
pub mod combinations;
pub mod stage;
pub mod stage_error;
pub mod stages;
pub mod target;

pub use stage::{up_to_date, PipelineOptions};
pub use stage_error::StageError;
pub use stages::{profiling, report};

use crate::config::Config;
use stage::{At, Checkpoint, Flow, PipelineStage, Ranks, Scope};
use stages::STAGES;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use target::Target;

pub use scdino_config::Stage;

/// What happened to one stage (per checkpoint tag where it applies).
#[derive(Debug, Clone)]
pub struct StageRun {
    pub stage: Stage,
    pub combination: usize,
    pub tag: Option<String>,
    /// False when its outputs were already up to date.
    pub ran: bool,
    pub seconds: f64,
}

#[derive(Debug)]
pub enum PipelineOutcome {
    Finished(Vec<StageRun>),
    /// A stop signal arrived; everything finished so far is on disk.
    Preempted(Vec<StageRun>),
}

struct Runner<'a> {
    runs: Vec<StageRun>,
    stop: Option<&'a AtomicBool>,
    /// Rank 0 (or the only process): runs the single-rank stages and writes the log lines.
    lead: bool,
}

impl Runner<'_> {
    /// Every stage of [`STAGES`] for the model `t`, in order; the per-checkpoint stages that
    /// follow each other run checkpoint by checkpoint.
    fn run_model(&mut self, t: &Target, options: &PipelineOptions) -> Result<Flow, StageError> {
        let mut checkpoints: Option<Vec<Checkpoint>> = None;
        let mut i = 0;
        while i < STAGES.len() {
            if STAGES[i].scope() == Scope::Model {
                if !options.runs(STAGES[i].stage()) {
                    i += 1;
                    continue;
                }
                // The checkpoints are listed once the first per-checkpoint stage runs (after
                // training); a stage run alone lists them here.
                let listed;
                let known = match &checkpoints {
                    Some(all) => all.as_slice(),
                    None => {
                        listed = t.numbered_checkpoints();
                        listed.as_slice()
                    }
                };
                let reported = reported(t, options, &STAGES[..i], known);
                let at = At {
                    t,
                    options,
                    checkpoint: None,
                    reported: &reported,
                };
                if self.stage(STAGES[i], &at)? == Flow::Stopped || self.stopped() {
                    return Ok(Flow::Stopped);
                }
                i += 1;
                continue;
            }
            let end = i + STAGES[i..]
                .iter()
                .take_while(|s| s.scope() == Scope::Checkpoint)
                .count();
            let chosen: Vec<&dyn PipelineStage> = STAGES[i..end]
                .iter()
                .copied()
                .filter(|s| options.runs(s.stage()))
                .collect();
            if chosen.is_empty() {
                i = end;
                continue;
            }
            let all = match &checkpoints {
                Some(all) => all,
                None => checkpoints.insert(numbered_checkpoints(t)?),
            };
            let group: Vec<(&dyn PipelineStage, Vec<Checkpoint>)> = chosen
                .into_iter()
                .map(|s| (s, s.checkpoints(t, all)))
                .collect();
            for checkpoint in all.iter() {
                for (stage, theirs) in &group {
                    if !theirs.contains(checkpoint) {
                        continue;
                    }
                    let at = At {
                        t,
                        options,
                        checkpoint: Some(checkpoint),
                        reported: &[],
                    };
                    if self.stage(*stage, &at)? == Flow::Stopped {
                        return Ok(Flow::Stopped);
                    }
                }
                if self.stopped() {
                    return Ok(Flow::Stopped);
                }
            }
            i = end;
        }
        Ok(Flow::Continue)
    }

    fn log(&self, what: &str) {
        if self.lead {
            tracing::info!("[pipeline] {what}");
        }
    }

    fn stopped(&self) -> bool {
        self.stop.is_some_and(|s| s.load(Ordering::SeqCst))
    }

    /// Runs `stage` at `at` unless it is done there, or it is rank 0's and this is not rank 0.
    fn stage(&mut self, stage: &dyn PipelineStage, at: &At) -> Result<Flow, StageError> {
        if stage.ranks() == Ranks::Lead && !self.lead {
            return Ok(Flow::Continue);
        }
        let name = stage.stage().name();
        let tag = at.checkpoint.map(|(tag, _)| tag.clone());
        let label = match &tag {
            Some(tag) => format!("{name} {tag}"),
            None => name.to_string(),
        };
        let start = Instant::now();
        let ran = !stage.done(at);
        let mut flow = Flow::Continue;
        if ran {
            self.log(&format!("{label}: running"));
            flow = stage.run(at).map_err(|e| StageError::Stage {
                label: label.clone(),
                source: Box::new(e),
            })?;
            self.log(&format!(
                "{label}: done in {:.1} s",
                start.elapsed().as_secs_f64()
            ));
        } else {
            self.log(&format!("{label}: up to date, skipped"));
        }
        self.runs.push(StageRun {
            stage: stage.stage(),
            combination: at.t.combination,
            tag,
            ran,
            seconds: start.elapsed().as_secs_f64(),
        });
        Ok(flow)
    }
}

/// The numbered checkpoints training kept; an error when it kept none (nothing to analyse).
fn numbered_checkpoints(t: &Target) -> Result<Vec<Checkpoint>, StageError> {
    let checkpoints = t.numbered_checkpoints();
    if checkpoints.is_empty() {
        return Err(StageError::NoNumberedCheckpoints {
            dir: t.files.dir().to_path_buf(),
        });
    }
    Ok(checkpoints)
}

/// What `stages` show in the report, for every checkpoint each ran for.
fn reported(
    t: &Target,
    options: &PipelineOptions,
    stages: &[&dyn PipelineStage],
    checkpoints: &[Checkpoint],
) -> Vec<PathBuf> {
    let at = |checkpoint| At {
        t,
        options,
        checkpoint,
        reported: &[],
    };
    let mut files = vec![];
    for stage in stages {
        match stage.scope() {
            Scope::Model => files.extend(stage.reported(&at(None))),
            Scope::Checkpoint => {
                for c in &stage.checkpoints(t, checkpoints) {
                    files.extend(stage.reported(&At {
                        checkpoint: Some(c),
                        ..at(None)
                    }));
                }
            }
        }
    }
    files
}

/// What the held-out split can score, said once before anything runs: the kNN stage scores
/// the held-out images against themselves (an 80/20 split of them), so with few held-out
/// images its k are clamped, classes go missing and the numbers of every checkpoint mean
/// little; a user should know that before the run, not from a warning per checkpoint.
/// Returns the message when there is one (it is also logged).
pub fn warn_small_held_out(cfg: &Config) -> Result<Option<String>, StageError> {
    let source = crate::data::open_source(&cfg.data)?;
    let index = source.index();
    let split = crate::data::configured_split(index, &cfg.data, cfg.run.seed as u32)?;
    let held = split.held_out.len();
    let bank = held * 4 / 5;
    let present: std::collections::BTreeSet<&str> = split
        .held_out
        .iter()
        .map(|&i| index.samples[i].label.as_str())
        .collect();
    let classes: std::collections::BTreeSet<&str> =
        index.samples.iter().map(|s| s.label.as_str()).collect();
    let max_k = cfg.downstream.knn.k.iter().copied().max().unwrap_or(0);
    let mut problems = vec![];
    if max_k > bank {
        problems.push(format!(
            "kNN's k up to {max_k} needs at least {max_k} reference images, and 80 % of them is {bank}"
        ));
    }
    if present.len() < classes.len() {
        let missing: Vec<&str> = classes.difference(&present).copied().collect();
        problems.push(format!(
            "{} of {} classes have no held-out image ({})",
            missing.len(),
            classes.len(),
            missing.join(", ")
        ));
    }
    if problems.is_empty() {
        return Ok(None);
    }
    let mut advice = vec![];
    if cfg.data.test_dir.is_none() {
        advice.push("data.test_dir (a separate test folder, scored by the evaluate stage)");
    }
    if cfg.data.split == crate::config::HeldOutSplit::Scdino {
        advice.push("data.split: stratified (every class in the held-out images)");
    }
    advice.push("a lower data.train_fraction");
    let message = format!(
        "the held-out split is too small to score: {held} of {} images (data.train_fraction {}); {}. The kNN, UMAP and held-out scores of every checkpoint will mean little; consider {}",
        index.len(),
        cfg.data.train_fraction,
        problems.join("; "),
        advice.join(", or ")
    );
    tracing::warn!("{message}");
    Ok(Some(message))
}

/// Runs the whole pipeline for the selected channel combinations of `cfg`.
///
/// Launched on several ranks, every rank runs this: training and features are collective
/// (data parallel), mean/std, kNN, UMAP, attention maps and the report run on rank 0 while
/// the others wait at the next collective stage (within `train.dist_timeout_seconds`).
pub fn run_pipeline(cfg: &Config, opts: &PipelineOptions) -> Result<PipelineOutcome, StageError> {
    let combos = opts
        .combinations
        .clone()
        .unwrap_or_else(|| (0..cfg.channel_sets.len()).collect());
    let env = crate::distributed::env::DistEnv::from_process_env()?;
    let mut r = Runner {
        runs: Vec::new(),
        stop: opts.stop.as_deref(),
        lead: env.rank == 0,
    };
    // Before a whole pipeline only: a stage run alone (`trainer knn`) is not told again.
    if r.lead && opts.only.is_none() {
        warn_small_held_out(cfg)?;
    }
    for &combination in &combos {
        let t = Target::new(cfg, combination)?;
        if r.run_model(&t, opts)? == Flow::Stopped {
            return Ok(PipelineOutcome::Preempted(r.runs));
        }
    }
    if r.lead && opts.runs(Stage::Report) {
        if let Some(path) = combinations::write_table(cfg)? {
            r.log(&format!("combinations: {}", path.display()));
        }
    }
    Ok(PipelineOutcome::Finished(r.runs))
}

#[cfg(test)]
mod tests {
    use super::Stage;

    #[test]
    fn the_stages_are_the_list_the_launcher_renders() {
        let names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names, crate::config::PIPELINE_STAGES);
    }
}
