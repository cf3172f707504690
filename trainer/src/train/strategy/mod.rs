//! The parallel strategy of a run: one process, data parallel (DDP) or fully sharded (FSDP).
//!
//! It is chosen once, in [`choose`], from `train.strategy` and the world size, and from then on
//! it alone decides how parameters and gradients move between the ranks, what a checkpoint
//! holds and who writes it, how a sharded resume finds its shards, and how the ranks prove
//! they hold the same model. The training step ([`Learner::step`]) and the epoch loop
//! ([`super::run`]) are the same for all three; they ask the strategy at the few points where
//! the strategies differ.
//!
//! Layering: `distributed` provides process groups, collectives, gradient bucketing and the
//! storage tricks sharding needs, and knows nothing of training; the strategies here combine
//! them with the [`Learner`] (networks, optimizer, loss).
pub mod fsdp;
pub mod fsdp_error;

use super::optim::{clip_gradients, ema_update};
use super::step::{Learner, StepError, StepHooks, StepParams};
use super::train_error::TrainError;
use crate::checkpoint::{self, Checkpoint, CheckpointMeta, RestoreError};
use crate::config::Strategy;
use crate::distributed::ddp::Ddp;
use crate::distributed::group::{DistError, ProcessGroup, ReduceOp};
use crate::distributed::{Collective, Single};
use crate::layout::ModelLayout;
use fsdp::Fsdp;
use std::collections::HashMap;
use std::path::PathBuf;
use tch::Tensor;

/// What differs between one process, DDP and FSDP, at the points where the shared loop needs
/// it; the step's own points are its supertrait [`StepHooks`] (declared beside the step, so
/// the step does not depend on the strategies). Every rank calls every method in the same
/// order (several are collectives).
pub trait ParallelStrategy: StepHooks {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Writes the checkpoint `meta` describes: `checkpoint.safetensors` of the model folder,
    /// and also `numbered` when given. Rank 0 writes the files; FSDP ranks also write their
    /// shards first.
    fn save(
        &mut self,
        learner: &Learner,
        files: &ModelLayout,
        meta: &CheckpointMeta,
        numbered: Option<PathBuf>,
    ) -> Result<(), TrainError>;
    /// Σ|θ| of the student over the whole model, the same on every rank when the ranks agree
    /// (a collective under FSDP).
    fn checksum(&mut self, learner: &Learner) -> Result<f64, DistError>;
}

/// The strategy of this run, and the checkpoint it resumed from if that is not the
/// consolidated one the caller already restored (FSDP shards newer than it).
pub struct Chosen {
    pub strategy: Box<dyn ParallelStrategy>,
    pub resumed_shards: Option<CheckpointMeta>,
}

/// Makes the choice once. `group` is `None` for a world of one. With a group, every rank
/// first takes rank 0's weights (a resume loads the same file everywhere, so that changes
/// nothing then); FSDP then shards the learner's parameters and optimizer state and resumes
/// from its shards when every rank has the same, at least as new, iteration as
/// `resumed_iteration` (a crash between the two writes, or a new world size, falls back to the
/// consolidated checkpoint, re-sharded here).
pub fn choose(
    kind: Strategy,
    group: Option<ProcessGroup>,
    learner: &mut Learner,
    files: &ModelLayout,
    fingerprint: &str,
    resumed_iteration: Option<usize>,
    options: StrategyOptions,
) -> Result<Chosen, TrainError> {
    let Some(group) = group else {
        return Ok(Chosen {
            strategy: Box::new(SingleProcess::default()),
            resumed_shards: None,
        });
    };
    let mut ddp = Ddp::new(group).on(learner.device);
    ddp.broadcast_parameters(&learner.nets.student_vs)?;
    ddp.broadcast_parameters(&learner.nets.teacher_vs)?;
    match kind {
        Strategy::Ddp => {
            if options.ddp_overlap {
                let mut names: Vec<String> = learner
                    .optimizer
                    .params
                    .iter()
                    .map(|p| p.name.clone())
                    .collect();
                learner
                    .nets
                    .units
                    .sort_forward(&mut names)
                    .map_err(|e| DistError {
                        what: "DDP overlap".into(),
                        message: e.to_string(),
                    })?;
                let by_name: HashMap<&str, &Tensor> = learner
                    .optimizer
                    .params
                    .iter()
                    .map(|p| (p.name.as_str(), &p.tensor))
                    .collect();
                let named: Vec<(String, Tensor)> = names
                    .iter()
                    .map(|n| (n.clone(), by_name[n.as_str()].shallow_clone()))
                    .collect();
                ddp.enable_overlap(&named)?;
            }
            Ok(Chosen {
                strategy: Box::new(DataParallel::new(ddp)),
                resumed_shards: None,
            })
        }
        Strategy::Fsdp => {
            let (rank, world) = (ddp.group.rank, ddp.group.world);
            let mut sharded = FullySharded::new(ddp, learner)?.with_shard_files(
                files.fsdp_shards(rank, world),
                format!("{fingerprint} fsdp rank {rank} of {world}"),
            );
            sharded
                .fsdp_mut()
                .set_reshard_after_forward(options.fsdp_reshard_after_forward);
            let resumed_shards = sharded.resume_shards(learner, resumed_iteration)?;
            if rank == 0 {
                let units = sharded.fsdp.units();
                let total: i64 = units.iter().map(|u| u.1).sum();
                tracing::info!(
                    "fsdp: {} units ({} parameters) sharded over {world} ranks",
                    units.len(),
                    total
                );
            }
            Ok(Chosen {
                strategy: Box::new(sharded),
                resumed_shards,
            })
        }
    }
}

/// The config keys that shape a strategy beyond its kind.
#[derive(Debug, Clone, Copy)]
pub struct StrategyOptions {
    pub ddp_overlap: bool,
    pub fsdp_reshard_after_forward: bool,
}

/// Every rank holds the whole model and updates its own copy; `group` averages the gradients
/// (bucketed, overlapped with backward when `train.ddp_overlap`) and rank 0 writes the
/// checkpoints. One process is the same with identity collectives.
#[derive(Default)]
pub struct Replicated<C: Collective> {
    group: C,
}

/// A world of one (also what a benchmark or a test of the step uses).
pub type SingleProcess = Replicated<Single>;
/// DDP.
pub type DataParallel = Replicated<Ddp>;

impl<C: Collective> Replicated<C> {
    pub fn new(group: C) -> Self {
        Self { group }
    }
}

/// Every rank holds 1/N of parameters, gradients, optimizer state and teacher (see [`fsdp`]).
pub struct FullySharded {
    fsdp: Fsdp,
    /// The process group's collectives for the step's shared parts.
    ddp: Ddp,
    /// This rank's shard folder and the fingerprint its checkpoints carry (`None` in tests
    /// that only step).
    shard_files: Option<(PathBuf, String)>,
}

impl<C: Collective> StepHooks for Replicated<C> {
    fn collective(&mut self) -> &mut dyn Collective {
        &mut self.group
    }
    fn backward_and_update(
        &mut self,
        learner: &mut Learner,
        loss: &Tensor,
        p: &StepParams,
    ) -> Result<(Vec<f64>, bool), StepError> {
        replicated_update(learner, loss, p, &mut self.group)
    }
}

impl<C: Collective> ParallelStrategy for Replicated<C> {
    fn rank(&self) -> usize {
        self.group.rank()
    }
    fn world_size(&self) -> usize {
        self.group.world_size()
    }
    fn save(
        &mut self,
        learner: &Learner,
        files: &ModelLayout,
        meta: &CheckpointMeta,
        numbered: Option<PathBuf>,
    ) -> Result<(), TrainError> {
        let written = if self.rank() == 0 {
            save_files(files, &checkpoint_tensors(learner), meta, numbered)
        } else {
            Ok(())
        };
        confirm_written(&mut self.group, written)
    }
    fn checksum(&mut self, learner: &Learner) -> Result<f64, DistError> {
        Ok(parameter_checksum(&learner.nets.student_vs))
    }
}

impl FullySharded {
    /// Shards the learner's (already broadcast) parameters and optimizer state over `ddp`'s
    /// group.
    pub fn new(ddp: Ddp, learner: &mut Learner) -> Result<Self, fsdp_error::FsdpError> {
        let fsdp = Fsdp::new(&ddp.group, learner)?;
        Ok(Self {
            fsdp,
            ddp,
            shard_files: None,
        })
    }

    /// Where this rank's shards are saved and resumed from.
    pub fn with_shard_files(mut self, dir: PathBuf, fingerprint: String) -> Self {
        self.shard_files = Some((dir, fingerprint));
        self
    }

    pub fn fsdp(&self) -> &Fsdp {
        &self.fsdp
    }

    pub fn fsdp_mut(&mut self) -> &mut Fsdp {
        &mut self.fsdp
    }

    fn shard_files(&self) -> Result<(PathBuf, String), TrainError> {
        self.shard_files.clone().ok_or(TrainError::NoShardFolder)
    }

    /// Loads this rank's shards when every rank has them at one iteration, at least as new as
    /// the consolidated checkpoint's (`resumed_iteration`).
    fn resume_shards(
        &mut self,
        learner: &mut Learner,
        resumed_iteration: Option<usize>,
    ) -> Result<Option<CheckpointMeta>, TrainError> {
        let (shard_dir, shard_fingerprint) = self.shard_files()?;
        let ck = checkpoint::load_latest(&shard_dir, &mut |w| tracing::warn!("{w}"))?
            .filter(|c| c.meta.fingerprint == shard_fingerprint);
        let mine = ck.as_ref().map_or(-1.0, |c| c.meta.iteration as f64);
        let device = learner.device;
        let (mut lo, mut hi) = (
            Tensor::from_slice(&[mine]).to_device(device),
            Tensor::from_slice(&[mine]).to_device(device),
        );
        let group = &mut self.ddp.group;
        group.all_reduce(std::slice::from_mut(&mut lo), ReduceOp::Min)?;
        group.all_reduce(std::slice::from_mut(&mut hi), ReduceOp::Max)?;
        let full_iter = resumed_iteration.map_or(-1.0, |i| i as f64);
        let (lo, hi) = (lo.double_value(&[0]), hi.double_value(&[0]));
        let Some(ck) = ck.filter(|_| lo == hi && lo >= 0.0 && lo >= full_iter) else {
            return Ok(None);
        };
        let resume_err = |source: RestoreError| TrainError::Resume {
            path: ck.path.clone(),
            source,
        };
        self.fsdp.load_shards(&ck, learner).map_err(resume_err)?;
        restore_loss_centres(&ck, learner).map_err(resume_err)?;
        if self.ddp.group.rank == 0 {
            tracing::info!(
                "resuming from the FSDP shards {} at epoch {}, batch {} (iteration {})",
                shard_dir.display(),
                ck.meta.epoch,
                ck.meta.epoch_batch,
                ck.meta.iteration
            );
        }
        Ok(Some(ck.meta))
    }
}

impl StepHooks for FullySharded {
    fn collective(&mut self) -> &mut dyn Collective {
        &mut self.ddp
    }
    fn before_teacher(&mut self) -> Result<(), StepError> {
        self.fsdp.before_teacher()
    }
    fn before_student(&mut self) -> Result<(), StepError> {
        self.fsdp.before_student()
    }
    fn after_student(&mut self) -> Result<(), StepError> {
        self.fsdp.after_student()
    }
    fn backward_and_update(
        &mut self,
        learner: &mut Learner,
        loss: &Tensor,
        p: &StepParams,
    ) -> Result<(Vec<f64>, bool), StepError> {
        self.fsdp.backward_and_update(learner, loss, p)
    }
    fn end_step(&mut self) -> Result<(), StepError> {
        self.fsdp.end_step()
    }
}

impl ParallelStrategy for FullySharded {
    fn rank(&self) -> usize {
        self.ddp.group.rank
    }
    fn world_size(&self) -> usize {
        self.ddp.group.world
    }
    /// Every rank writes its shard, then the consolidated checkpoint is gathered (its
    /// all-gathers complete only once every shard is on disk) and rank 0 writes it.
    fn save(
        &mut self,
        learner: &Learner,
        files: &ModelLayout,
        meta: &CheckpointMeta,
        numbered: Option<PathBuf>,
    ) -> Result<(), TrainError> {
        let centres = loss_centres(learner);
        let mut shard = self.fsdp.shard_tensors(learner);
        shard.extend(centres.iter().map(|(n, t)| (n.clone(), t.shallow_clone())));
        let (shard_dir, fingerprint) = self.shard_files()?;
        let shard_meta = CheckpointMeta {
            fingerprint,
            ..meta.clone()
        };
        checkpoint::save_latest(&shard_dir, &shard, &shard_meta)?;
        let mut full = self.fsdp.consolidated_tensors(learner)?;
        full.extend(centres);
        let written = if self.rank() == 0 {
            save_files(files, &full, meta, numbered)
        } else {
            Ok(())
        };
        confirm_written(&mut self.ddp, written)
    }
    fn checksum(&mut self, learner: &Learner) -> Result<f64, DistError> {
        self.fsdp.checksum(learner)
    }
}

/// Every rank waits for rank 0's checkpoint write (`written` on rank 0) and learns whether it
/// succeeded, so no rank returns from a save before the checkpoint is on disk: after a stop
/// signal each rank exits 75 once its save returns, and srun ends a step when its first task
/// exits, which must not cut rank 0's write short. A failed write fails every rank, rank 0
/// with its own error (it still takes part, so the others never wait for it in vain).
fn confirm_written(
    group: &mut dyn Collective,
    written: Result<(), TrainError>,
) -> Result<(), TrainError> {
    if group.world_size() == 1 {
        return written;
    }
    let mut ok =
        Tensor::from_slice(&[f64::from(u8::from(written.is_ok()))]).to_device(group.device());
    group.all_reduce_sum(&mut ok)?;
    written?;
    if group.rank() == 0 || ok.double_value(&[0]) == group.world_size() as f64 {
        return Ok(());
    }
    Err(TrainError::CheckpointNotWritten)
}

/// The update when every rank holds the whole model (one process or DDP): `group` averages
/// the gradients (the identity for one process), then each rank updates its full copy.
fn replicated_update(
    learner: &mut Learner,
    loss: &Tensor,
    p: &StepParams,
    group: &mut dyn Collective,
) -> Result<(Vec<f64>, bool), StepError> {
    learner.optimizer.zero_grad();
    group.begin_backward()?;
    match &learner.scaler {
        Some(scaler) => scaler.scale_loss(loss).backward(),
        None => loss.backward(),
    }
    let mut grads: Vec<Tensor> = learner
        .optimizer
        .params
        .iter()
        .map(|q| q.tensor.grad())
        .collect();
    group.average_gradients(&mut grads)?;
    // Re-read: an overlapped implementation wrote the averages into `.grad` itself.
    let mut grads: Vec<Tensor> = learner
        .optimizer
        .params
        .iter()
        .map(|q| q.tensor.grad())
        .collect();
    let mut skipped = false;
    if let Some(scaler) = &mut learner.scaler {
        skipped = scaler.unscale(&mut grads);
    }
    let grad_norms = if p.clip_grad > 0.0 {
        clip_gradients(&learner.optimizer.params, p.clip_grad)
    } else {
        vec![]
    };
    if !skipped {
        let units = &learner.nets.units;
        let frozen = |name: &str| p.freeze_last_layer && units.is_last_layer(name);
        learner.optimizer.step(p.lr, p.weight_decay, &frozen);
    }
    if let Some(scaler) = &mut learner.scaler {
        scaler.update(skipped);
    }
    ema_update(
        &learner.nets.teacher_vs,
        &learner.nets.student_vs,
        p.momentum,
    );
    Ok((grad_norms, skipped))
}

/// `checkpoint.safetensors` (the previous one kept) and, when asked, the numbered copy.
fn save_files(
    files: &ModelLayout,
    tensors: &[(String, Tensor)],
    meta: &CheckpointMeta,
    numbered: Option<PathBuf>,
) -> Result<(), TrainError> {
    checkpoint::save_latest(files.dir(), tensors, meta)?;
    if let Some(path) = numbered {
        checkpoint::save(&path, tensors, meta)?;
    }
    Ok(())
}

/// Student, teacher, optimizer state and centre under PyTorch-style names.
pub fn checkpoint_tensors(learner: &Learner) -> Vec<(String, Tensor)> {
    let (nets, opt) = (&learner.nets, &learner.optimizer);
    let mut out = Vec::new();
    for (prefix, vs) in [("student", &nets.student_vs), ("teacher", &nets.teacher_vs)] {
        let mut vars: Vec<_> = vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        out.extend(vars.into_iter().map(|(n, t)| (format!("{prefix}.{n}"), t)));
    }
    out.extend(
        opt.state_tensors()
            .into_iter()
            .map(|(n, t)| (format!("optimizer.{n}"), t)),
    );
    out.extend(loss_centres(learner));
    out
}

/// The loss terms' running state under DINOv2's names: the CLS targets' centre
/// (`dino_loss.center`) and, with iBOT, the patch targets' (`ibot_patch_loss.center`).
fn loss_centres(learner: &Learner) -> Vec<(String, Tensor)> {
    learner
        .terms
        .state()
        .into_iter()
        .map(|(name, t)| (name.to_string(), t))
        .collect()
}

/// Restores what [`loss_centres`] saved, into the learner's own tensors: a checkpoint is read
/// to the CPU, and a centre taken from it as it is stayed there while the step's outputs were on
/// the GPU (the first resume on a GPU stopped with "Expected all tensors to be on the same
/// device" at the first centring).
fn restore_loss_centres(ck: &Checkpoint, learner: &mut Learner) -> Result<(), RestoreError> {
    tch::no_grad(|| {
        for (name, mut t) in learner.terms.state() {
            RestoreError::copy_into(ck, name, &mut t)?;
        }
        Ok(())
    })
}

/// Σ|θ| over the student, in f64: equal on all ranks when they hold the same weights.
fn parameter_checksum(vs: &tch::nn::VarStore) -> f64 {
    let mut vars: Vec<_> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars.iter()
        .map(|(_, t)| t.abs().sum(tch::Kind::Double).double_value(&[]))
        .sum()
}

/// Restores a consolidated checkpoint into a full learner (before any sharding).
pub fn restore(
    ck: &Checkpoint,
    fingerprint: &str,
    learner: &mut Learner,
) -> Result<(), TrainError> {
    restore_tensors(ck, fingerprint, learner).map_err(|source| TrainError::Resume {
        path: ck.path.clone(),
        source,
    })
}

fn restore_tensors(
    ck: &Checkpoint,
    fingerprint: &str,
    learner: &mut Learner,
) -> Result<(), RestoreError> {
    let Learner {
        nets,
        optimizer,
        scaler,
        ..
    } = learner;
    if ck.meta.fingerprint != fingerprint {
        return Err(RestoreError::Fingerprint {
            saved: ck.meta.fingerprint.clone(),
            current: fingerprint.to_string(),
        });
    }
    tch::no_grad(|| {
        for (prefix, vs) in [
            ("student", &mut nets.student_vs),
            ("teacher", &mut nets.teacher_vs),
        ] {
            for (name, mut t) in vs.variables() {
                RestoreError::copy_into(ck, &format!("{prefix}.{name}"), &mut t)?;
            }
        }
        Ok::<(), RestoreError>(())
    })?;
    optimizer.load_state(ck)?;
    if scaler.is_some() {
        if let Some(saved) = &ck.meta.loss_scaler {
            *scaler = Some(saved.clone());
        }
    }
    restore_loss_centres(ck, learner)
}
