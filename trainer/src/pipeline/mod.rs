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
pub mod profiling;
pub mod report;
pub mod stages;

use crate::config::Config;
use crate::train::run::{train, TrainOptions, TrainOutcome};
use stages::Target;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Features(#[from] crate::analysis::features::FeaturesError),
    #[error(transparent)]
    Knn(#[from] crate::analysis::knn::KnnError),
    #[error(transparent)]
    Umap(#[from] crate::analysis::umap::UmapError),
    #[error(transparent)]
    Profiles(#[from] crate::analysis::profiles::ProfilesError),
    #[error(transparent)]
    Scoring(#[from] crate::scoring::ScoringError),
    #[error(transparent)]
    Attention(#[from] crate::analysis::attention::AttentionError),
    /// The profiling stage's embedding of a screen.
    #[error(transparent)]
    Embed(#[from] crate::embed::run::EmbedError),
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    #[error(transparent)]
    Plot(#[from] crate::plot::PlotError),
    #[error(transparent)]
    Train(#[from] crate::train::run::TrainError),
    #[error(transparent)]
    MeanStd(#[from] crate::data::mean_std::MeanStdError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    DistEnv(#[from] crate::distributed::env::DistEnvError),
    /// The features stage's rendezvous and barrier.
    #[error(transparent)]
    Dist(#[from] crate::distributed::group::DistError),
    #[error("gathering features: {source}")]
    GatherFeatures {
        #[source]
        source: crate::distributed::group::DistError,
    },
    #[error("channel combination {index} does not exist (the config has {count})")]
    NoCombination { index: usize, count: usize },
    /// Every stage after training needs the dataset statistics.
    #[error("{source} (run `trainer mean-std` or `trainer pipeline` first)")]
    NoMeanStd {
        #[source]
        source: crate::data::mean_std::MeanStdError,
    },
    /// Nothing to analyse: training kept no checkpoint.
    #[error("training finished but {} has no numbered checkpoints", dir.display())]
    NoNumberedCheckpoints { dir: PathBuf },
    /// A JSON file a stage wrote that does not parse as what it should hold.
    #[error("{}: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: not an evaluation report: {source}", path.display())]
    NotEvaluationReport {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// An evaluation report without a value the combinations table shows.
    #[error("{}: {what}", path.display())]
    IncompleteEvaluation { path: PathBuf, what: &'static str },
    /// A line of `log.txt` that is not JSON (`line` counts from 1).
    #[error("{} line {line}: {source}", path.display())]
    LogLine {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    /// A stage failed; the source stays typed so callers can tell, e.g., a dead rank from a
    /// bad file.
    #[error("stage {label}: {source}")]
    Stage {
        label: String,
        #[source]
        source: Box<StageError>,
    },
}

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

#[derive(Debug, Clone, Default)]
pub struct PipelineOptions {
    /// Channel combinations to run (default: all).
    pub combinations: Option<Vec<usize>>,
    pub stop: Option<Arc<AtomicBool>>,
    /// Training may resume on another dataset than its checkpoint's (see
    /// [`TrainOptions::allow_new_data`]).
    pub allow_new_data: bool,
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

/// Which ranks run a stage when the pipeline runs on several (`trainer launch`, srun).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ranks {
    /// Collective: every rank takes part.
    All,
    /// Rank 0 alone; the others go on to the next collective stage and wait for it there.
    Lead,
}

struct Runner<'a> {
    runs: Vec<StageRun>,
    stop: Option<&'a AtomicBool>,
    /// Rank 0 (or the only process): runs the single-rank stages and writes the log lines.
    lead: bool,
}

impl Runner<'_> {
    /// The analyses of one numbered checkpoint (`tag`): features on every rank, then kNN,
    /// evaluation with the profiling scores, UMAP and attention maps on rank 0.
    fn analyse_checkpoint(
        &mut self,
        t: &Target,
        tag: &str,
        ckpt: &Path,
        ms_path: &Path,
    ) -> Result<(), StageError> {
        let bundle = t.files.bundle(tag);
        self.stage(
            Stage::Features,
            Ranks::All,
            t,
            Some(tag),
            &[ckpt.to_path_buf(), ms_path.to_path_buf()],
            &[bundle.clone(), t.files.profiles(tag)],
            || stages::run_features(t, ckpt, tag).map(|_| ()),
        )?;
        self.stage(
            Stage::Knn,
            Ranks::Lead,
            t,
            Some(tag),
            std::slice::from_ref(&bundle),
            &[t.files.knn_json(tag)],
            || stages::run_knn(t, tag).map(|_| ()),
        )?;
        let mut eval_inputs = vec![ckpt.to_path_buf(), ms_path.to_path_buf()];
        // A local test folder is an input (its change reruns the evaluation); an S3 one
        // has no modification time to compare.
        let local_test = t.cfg.data.test_dir.as_ref().and_then(|d| d.local());
        eval_inputs.extend(local_test.filter(|d| d.exists()).map(Path::to_path_buf));
        self.stage(
            Stage::Evaluate,
            Ranks::Lead,
            t,
            Some(tag),
            &eval_inputs,
            &[
                t.files.evaluation_json(tag),
                t.files.evaluation_profiles(tag),
                t.files.scores_json(tag),
            ],
            || {
                stages::run_evaluate(t, ckpt, tag)?;
                stages::run_scores(t, tag)
            },
        )?;
        self.stage(
            Stage::Umap,
            Ranks::Lead,
            t,
            Some(tag),
            std::slice::from_ref(&bundle),
            &[t.files.umap_json(tag)],
            || stages::run_umap(t, tag).map(|_| ()),
        )?;
        self.stage(
            Stage::Attention,
            Ranks::Lead,
            t,
            Some(tag),
            &[ckpt.to_path_buf(), ms_path.to_path_buf()],
            &[t.files.attention_manifest(tag)],
            || stages::run_attention(t, ckpt, tag).map(|_| ()),
        )?;
        Ok(())
    }

    /// The profiling stage (`downstream.profiling`) for the checkpoints it names: every rank
    /// embeds its share of the cells, rank 0 runs the recipe. Returns the records written (the
    /// report's inputs); nothing when the stage is off.
    fn profile_checkpoints(
        &mut self,
        t: &Target,
        checkpoints: &[(String, PathBuf)],
    ) -> Result<Vec<PathBuf>, StageError> {
        if !t.cfg.downstream.profiling.enabled {
            return Ok(vec![]);
        }
        let recipe = profiling::configured_recipe(t.cfg).map_err(|e| StageError::Stage {
            label: Stage::Profiling.name().to_string(),
            source: Box::new(e.into()),
        })?;
        let mut records = vec![];
        for p in profiling::plan(t, checkpoints, &recipe) {
            self.stage_unless(
                Stage::Profiling,
                Ranks::All,
                t,
                Some(&p.tag),
                p.done,
                || profiling::run_profiling(t, &p.tag, &p.checkpoint, &recipe).map(|_| ()),
            )?;
            records.push(t.files.profiling_record(&p.tag));
            if self.stopped() {
                break;
            }
        }
        Ok(records)
    }

    fn log(&self, what: &str) {
        if self.lead {
            tracing::info!("[pipeline] {what}");
        }
    }

    fn stopped(&self) -> bool {
        self.stop.is_some_and(|s| s.load(Ordering::SeqCst))
    }

    /// Runs `work` unless `outputs` are up to date with `inputs`.
    #[allow(clippy::too_many_arguments)]
    fn stage(
        &mut self,
        stage: Stage,
        ranks: Ranks,
        t: &Target,
        tag: Option<&str>,
        inputs: &[PathBuf],
        outputs: &[PathBuf],
        work: impl FnOnce() -> Result<(), StageError>,
    ) -> Result<(), StageError> {
        // Every rank decides a collective stage from the same files: rank 0 writes them only
        // inside collective stages, which end with all ranks together.
        let done = up_to_date(outputs, inputs);
        self.stage_unless(stage, ranks, t, tag, done, work)
    }

    /// Runs `work` unless `done` (decided by the caller from files every rank reads alike).
    fn stage_unless(
        &mut self,
        stage: Stage,
        ranks: Ranks,
        t: &Target,
        tag: Option<&str>,
        done: bool,
        work: impl FnOnce() -> Result<(), StageError>,
    ) -> Result<(), StageError> {
        if ranks == Ranks::Lead && !self.lead {
            return Ok(());
        }
        let label = match tag {
            Some(tag) => format!("{} {tag}", stage.name()),
            None => stage.name().to_string(),
        };
        let start = Instant::now();
        let ran = !done;
        if ran {
            self.log(&format!("{label}: running"));
            work().map_err(|e| StageError::Stage {
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
            stage,
            combination: t.combination,
            tag: tag.map(str::to_string),
            ran,
            seconds: start.elapsed().as_secs_f64(),
        });
        Ok(())
    }
}

/// Runs the whole pipeline for the selected channel combinations of `cfg`.
///
/// Launched on several ranks, every rank runs this: training and features are collective
/// (data parallel), mean/std, kNN, UMAP, attention maps and the report run on rank 0 while
/// the others wait at the next collective stage (within `train.dist_timeout_seconds`).
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
    if r.lead {
        warn_small_held_out(cfg)?;
    }
    for &combination in &combos {
        let t = Target::new(cfg, combination)?;
        let ms_path = t.run.mean_std();
        // Rank 0 only: training's ranks wait for it at their rendezvous and read the file.
        r.stage(
            Stage::MeanStd,
            Ranks::Lead,
            &t,
            None,
            &[],
            std::slice::from_ref(&ms_path),
            || {
                let source = crate::data::open_source(&cfg.data)?;
                crate::data::mean_std::load_or_compute(cfg, source.as_ref(), &ms_path)?;
                Ok(())
            },
        )?;
        if r.stopped() {
            return Ok(PipelineOutcome::Preempted(r.runs));
        }

        // Training decides for itself how far it is (it resumes from checkpoint.safetensors).
        let latest = t.files.latest_checkpoint();
        let finished = crate::checkpoint::read_meta(&latest)
            .map(|m| m.epoch >= cfg.train.epochs)
            .unwrap_or(false);
        let start = Instant::now();
        let mut outcome = TrainOutcome::Finished;
        if !finished {
            r.log("train: running");
            outcome = train(
                cfg,
                &TrainOptions {
                    combination,
                    max_steps: None,
                    stop: opts.stop.clone(),
                    allow_new_data: opts.allow_new_data,
                },
            )?;
        } else {
            r.log("train: finished earlier, skipped");
        }
        r.runs.push(StageRun {
            stage: Stage::Train,
            combination,
            tag: None,
            ran: !finished,
            seconds: start.elapsed().as_secs_f64(),
        });
        if outcome != TrainOutcome::Finished || r.stopped() {
            return Ok(PipelineOutcome::Preempted(r.runs));
        }

        let checkpoints = t.numbered_checkpoints();
        if checkpoints.is_empty() {
            return Err(StageError::NoNumberedCheckpoints {
                dir: t.files.dir().to_path_buf(),
            });
        }
        for (tag, ckpt) in &checkpoints {
            r.analyse_checkpoint(&t, tag, ckpt, &ms_path)?;
            if r.stopped() {
                return Ok(PipelineOutcome::Preempted(r.runs));
            }
        }
        let profiled = r.profile_checkpoints(&t, &checkpoints)?;
        if r.stopped() {
            return Ok(PipelineOutcome::Preempted(r.runs));
        }
        let mut report_inputs = vec![ms_path.clone(), t.files.log()];
        report_inputs.extend(profiled);
        for (tag, _) in &checkpoints {
            report_inputs.push(t.files.knn_json(tag));
            report_inputs.push(t.files.evaluation_json(tag));
            report_inputs.push(t.files.scores_json(tag));
            report_inputs.push(t.files.umap_json(tag));
            report_inputs.push(t.files.attention_manifest(tag));
        }
        r.stage(
            Stage::Report,
            Ranks::Lead,
            &t,
            None,
            &report_inputs,
            &[t.files.report_html()],
            || report::write_report(&t, t.dataset()?).map(|_| ()),
        )?;
    }
    if r.lead {
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
