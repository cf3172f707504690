//! The `features` stage: the held-out split's CLS features with each checkpoint (collective).
use crate::analysis::features;
use crate::analysis::profiles::{self, ProfileRows};
use crate::config::Stage;
use crate::distributed::env::DistEnv;
use crate::distributed::group::ProcessGroup;
use crate::pipeline::stage::{At, Flow, PipelineStage, Ranks};
use crate::pipeline::stage_error::StageError;
use crate::pipeline::target::Target;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// What [`run_features`] did on this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeaturesRun {
    /// Rank 0 (or the only process) wrote this many rows.
    Wrote(usize),
    /// Another rank: its share is in rank 0's files.
    Shared,
    /// A stop signal arrived while this rank waited for the others; nothing was written.
    Stopped,
}

/// Features, labels and paths of the held-out split with `ckpt`.
///
/// Launched on several ranks (`trainer launch`, srun), each rank embeds every W-th held-out
/// image, the shares are all-gathered and interleaved back into held-out order, and rank 0
/// alone writes: the same rows, once each, as one process would write. The other ranks reach
/// this stage's rendezvous while rank 0 still runs the single-rank stages of the previous
/// checkpoint; `stop` (the pipeline's stop flag) ends that wait.
pub fn run_features(
    t: &Target,
    ckpt: &Path,
    tag: &str,
    stop: Option<&AtomicBool>,
) -> Result<FeaturesRun, StageError> {
    let ms = t.mean_std_for(ckpt)?;
    let env = DistEnv::from_process_env()?;
    if env.world <= 1 {
        let set = features::extract(t.cfg, t.combination, ckpt, &ms)?;
        return write_features(t, tag, &set).map(FeaturesRun::Wrote);
    }
    let Some(mut group) = ProcessGroup::join_unless_stopped(
        &env.master_addr,
        env.master_port,
        env.rank,
        env.world,
        std::time::Duration::from_secs(t.cfg.train.dist_timeout_seconds),
        false,
        stop,
    )?
    else {
        return Ok(FeaturesRun::Stopped);
    };
    let mut set = features::extract_shard(t.cfg, t.combination, ckpt, &ms, env.rank, env.world)?;
    set.features = gather_shards(&mut group, env.world, &set.features, set.labels.len())
        .map_err(|source| StageError::GatherFeatures { source })?;
    let rows = if env.rank == 0 {
        FeaturesRun::Wrote(write_features(t, tag, &set)?)
    } else {
        FeaturesRun::Shared
    };
    // Nobody leaves before rank 0 has written (a following stage may start right away).
    group.barrier()?;
    Ok(rows)
}

/// All-gathers every rank's share (positions r, r+W, …) and interleaves them back into
/// held-out order.
fn gather_shards(
    group: &mut ProcessGroup,
    world: usize,
    mine: &tch::Tensor,
    total: usize,
) -> Result<tch::Tensor, crate::distributed::group::DistError> {
    use tch::{Kind, Tensor};
    let per = total.div_ceil(world) as i64;
    let dim = mine.size()[1];
    let padded = Tensor::zeros([per, dim], (Kind::Float, tch::Device::Cpu));
    padded.narrow(0, 0, mine.size()[0]).copy_(mine);
    let mut all = Tensor::zeros([world as i64 * per, dim], (Kind::Float, tch::Device::Cpu));
    group.all_gather(&mut all, &padded)?;
    let order: Vec<i64> = (0..total)
        .map(|p| ((p % world) as i64) * per + (p / world) as i64)
        .collect();
    Ok(all.index_select(0, &Tensor::from_slice(&order)))
}

fn write_features(t: &Target, tag: &str, set: &features::FeatureSet) -> Result<usize, StageError> {
    features::write(&t.files, tag, set)?;
    let rows = ProfileRows {
        set,
        split: "heldout",
        root: &t.cfg.data.dataset_dir,
    };
    profiles::write(&t.files.profiles(tag), &[rows], &t.channel_names())?;
    Ok(set.labels.len())
}

/// The `features` stage: collective, every rank embeds its share of each checkpoint's held-out
/// images.
pub struct Features;

impl PipelineStage for Features {
    fn stage(&self) -> Stage {
        Stage::Features
    }

    fn about(&self) -> &'static str {
        "CLS features, labels and image paths of the held-out split, per kept checkpoint."
    }

    fn ranks(&self) -> Ranks {
        Ranks::All
    }

    fn inputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.checkpoint().1.to_path_buf(), at.t.run.mean_std()]
    }

    fn outputs(&self, at: &At) -> Vec<PathBuf> {
        let tag = at.checkpoint().0;
        vec![at.t.files.bundle(tag), at.t.files.profiles(tag)]
    }

    fn run(&self, at: &At) -> Result<Flow, StageError> {
        let (tag, ckpt) = at.checkpoint();
        Ok(
            match run_features(at.t, ckpt, tag, at.options.stop.as_deref())? {
                FeaturesRun::Stopped => Flow::Stopped,
                FeaturesRun::Wrote(_) | FeaturesRun::Shared => Flow::Continue,
            },
        )
    }
}
