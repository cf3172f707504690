//! Checkpoints as the epoch loop writes and resumes them. A run stops anywhere (signal, step
//! limit, crash, collapse) and resumes bit for bit, so a checkpoint records the exact position
//! and the running epoch sums besides the weights; and a resume must refuse a checkpoint of
//! another model shape, so each carries the fingerprint of what shapes the weights.
use super::TrainError;
use crate::checkpoint::{self, CheckpointMeta, EpochTotals};
use crate::config::Config;
use crate::layout::ModelLayout;
use crate::train::step::Learner;
use crate::train::strategy::{self, ParallelStrategy};
use std::path::Path;

/// Where a run stands: the epoch to run, the batches of it already done and the global
/// iteration to run next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    pub epoch: usize,
    pub batch: usize,
    pub iteration: usize,
}

impl Position {
    fn of(meta: &CheckpointMeta) -> Self {
        Self {
            epoch: meta.epoch,
            batch: meta.epoch_batch,
            iteration: meta.iteration,
        }
    }
}

/// The fields a resume must agree on: they change the shape or meaning of the weights.
/// `model.channels` is in it only when not `fixed`, so that checkpoints written before the
/// key existed still resume.
pub fn fingerprint(cfg: &Config, channels: &[usize]) -> String {
    let m = &cfg.model;
    let mut fp = serde_json::json!({
        "arch": m.arch,
        "patch_size": m.patch_size,
        "out_dim": m.out_dim,
        "use_bn_in_head": m.use_bn_in_head,
        "norm_last_layer": m.norm_last_layer,
        "channels": channels,
        "channel_names": channels.iter().map(|&c| &cfg.data.channel_names[c]).collect::<Vec<_>>(),
    });
    crate::model::channels::write_record(&mut fp, m.channels);
    if m.num_register_tokens > 0 {
        fp["num_register_tokens"] = m.num_register_tokens.into();
    }
    // Written only when set, so the fingerprints of earlier runs stay valid.
    if let Some(ls) = m.layer_scale {
        fp["layer_scale"] = ls.into();
    }
    // The channel-separate and channel-mixing blocks change what the weights compute
    // (written only when set).
    if m.channel_separate_blocks > 0 {
        fp["channel_separate_blocks"] = m.channel_separate_blocks.into();
    }
    if m.channel_mixing_blocks > 0 {
        fp["channel_mixing_blocks"] = m.channel_mixing_blocks.into();
    }
    if m.pos_embed != crate::config::PosEmbed::Dino {
        fp["pos_embed"] = m.pos_embed.name().into();
    }
    // The position grid (a model.init source's); export, embed and a later model.init read it
    // back from here, and a record without it means the default grid.
    if m.img_size_px() != crate::config::ModelSection::DEFAULT_IMG_SIZE {
        fp["img_size"] = m.img_size_px().into();
    }
    // iBOT adds the mask token and perhaps a head; its loss settings are not shapes.
    let ibot = &cfg.train.ibot;
    if ibot.enabled() {
        fp["ibot"] = serde_json::json!({
            "separate_head": ibot.separate_head,
            "out_dim": ibot.separate_head.then(|| ibot.prototypes(m.out_dim)),
        });
    }
    fp.to_string()
}

/// Where a run starts: its position and the sums of the epoch it continues.
#[derive(Debug, Clone, Default)]
pub struct Start {
    pub at: Position,
    pub totals: EpochTotals,
    /// A consolidated checkpoint was restored (FSDP can also resume from its shards alone).
    pub resumed: bool,
}

impl Start {
    /// The start FSDP shards newer than the consolidated checkpoint give.
    pub fn from_shards(meta: &CheckpointMeta, resumed: bool) -> Self {
        Self {
            at: Position::of(meta),
            totals: meta.epoch_totals.clone(),
            resumed,
        }
    }
}

/// The dataset a run trains on, and whether it may differ from the one its checkpoint
/// trained on.
#[derive(Debug, Clone)]
pub struct DataOrigin {
    /// `data.dataset_dir`, canonical (what checkpoints record).
    pub location: String,
    /// `--allow-new-data`.
    pub allow_new: bool,
}

impl DataOrigin {
    pub fn new(cfg: &Config, allow_new: bool) -> Self {
        Self {
            location: cfg.data.dataset_dir.canonical(),
            allow_new,
        }
    }

    /// Refuses to resume from `meta` (read from `path`) on another dataset than it recorded,
    /// unless allowed. A checkpoint without a record predates it and resumes as it always did.
    pub fn check(&self, meta: &CheckpointMeta, path: &Path, rank: usize) -> Result<(), TrainError> {
        let Some(trained_on) = meta.dataset.as_deref() else {
            return Ok(());
        };
        if trained_on == self.location {
            return Ok(());
        }
        if !self.allow_new {
            return Err(TrainError::OtherDataset {
                checkpoint: path.to_path_buf(),
                trained_on: trained_on.to_string(),
                now: self.location.clone(),
            });
        }
        if rank == 0 {
            tracing::warn!(
                "resuming {} on {} (--allow-new-data); it trained on {} until now",
                path.display(),
                self.location,
                trained_on
            );
        }
        Ok(())
    }
}

/// Loads the newest readable checkpoint of `files` into `learner`, if there is one.
pub fn restore_latest(
    cfg: &Config,
    files: &ModelLayout,
    fingerprint: &str,
    data: &DataOrigin,
    learner: &mut Learner,
    rank: usize,
) -> Result<Option<Start>, TrainError> {
    let Some(ck) = checkpoint::load_latest(files.dir(), &mut |w| tracing::warn!("{w}"))? else {
        return Ok(None);
    };
    data.check(&ck.meta, &ck.path, rank)?;
    strategy::restore(&ck, fingerprint, learner)?;
    let at = Position::of(&ck.meta);
    tracing::info!(
        "resuming from {} at epoch {}, batch {} (iteration {})",
        ck.path.display(),
        at.epoch,
        at.batch,
        at.iteration
    );
    if rank == 0 {
        if let Some(note) = schedule_change_note(&ck.meta.config_yaml, cfg, at.iteration) {
            tracing::warn!("{note}");
        }
    }
    Ok(Some(Start {
        at,
        totals: ck.meta.epoch_totals.clone(),
        resumed: true,
    }))
}

/// What a resume with other `train.epochs` (or schedule keys) than the checkpoint's does: the
/// cosine lr, weight-decay and teacher-momentum schedules span the whole run, so they are
/// recomputed for the new length and change from the resumed iteration on (the weights are
/// still the checkpoint's). `None` when nothing that shapes a schedule changed.
pub fn schedule_change_note(saved_yaml: &str, cfg: &Config, iteration: usize) -> Option<String> {
    let saved = Config::from_yaml(saved_yaml, "checkpoint").ok()?;
    let old = serde_json::to_value(&saved.train).ok()?;
    let new = serde_json::to_value(&cfg.train).ok()?;
    let changed: Vec<String> = [
        "epochs",
        "lr",
        "min_lr",
        "warmup_epochs",
        "weight_decay",
        "weight_decay_end",
        "momentum_teacher",
        "warmup_teacher_temp",
        "teacher_temp",
        "warmup_teacher_temp_epochs",
    ]
    .iter()
    .filter(|key| old[**key] != new[**key])
    .map(|key| format!("train.{key} {} → {}", old[*key], new[*key]))
    .collect();
    (!changed.is_empty()).then(|| {
        format!(
            "the checkpoint was trained with other schedule settings ({}): the lr, weight-decay, \
             teacher-momentum and teacher-temperature schedules are recomputed for the new \
             settings and change from iteration {iteration} on; the run is no longer the one the \
             checkpoint started",
            changed.join(", ")
        )
    })
}

/// Everything of a checkpoint that is not the learner's state or the position: fixed for the
/// whole run.
pub struct CheckpointWriter {
    pub files: ModelLayout,
    pub seed: u64,
    pub fingerprint: String,
    /// The canonical dataset location ([`DataOrigin::location`]).
    pub dataset: String,
    pub config_yaml: String,
    /// Mean/std the crops are normalised with, per selected channel.
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

impl CheckpointWriter {
    /// Writes the checkpoint of `learner` at `at`, with the epoch's running `totals`; also the
    /// numbered one of the epoch before `at.epoch` when `numbered` (a collective under FSDP).
    pub fn save(
        &self,
        strategy: &mut dyn ParallelStrategy,
        learner: &Learner,
        at: Position,
        totals: &EpochTotals,
        numbered: bool,
    ) -> Result<(), TrainError> {
        let meta = CheckpointMeta {
            format: checkpoint::FORMAT.into(),
            epoch: at.epoch,
            epoch_batch: at.batch,
            iteration: at.iteration,
            seed: self.seed,
            fingerprint: self.fingerprint.clone(),
            config_yaml: self.config_yaml.clone(),
            mean: self.mean.clone(),
            std: self.std.clone(),
            epoch_totals: totals.clone(),
            loss_scaler: learner.scaler.clone(),
            dataset: Some(self.dataset.clone()),
        };
        let numbered = numbered.then(|| self.files.numbered_checkpoint(at.epoch - 1));
        strategy.save(learner, &self.files, &meta, numbered)
    }

    /// Writes the weights before the first step as `checkpoint_init.safetensors` (and the
    /// latest checkpoint at iteration 0, which a resume starts from as a fresh run would).
    pub fn save_initial(
        &self,
        strategy: &mut dyn ParallelStrategy,
        learner: &Learner,
    ) -> Result<(), TrainError> {
        let meta = CheckpointMeta {
            format: checkpoint::FORMAT.into(),
            epoch: 0,
            epoch_batch: 0,
            iteration: 0,
            seed: self.seed,
            fingerprint: self.fingerprint.clone(),
            config_yaml: self.config_yaml.clone(),
            mean: self.mean.clone(),
            std: self.std.clone(),
            epoch_totals: EpochTotals::default(),
            loss_scaler: learner.scaler.clone(),
            dataset: Some(self.dataset.clone()),
        };
        let init = self.files.initial_checkpoint();
        strategy.save(learner, &self.files, &meta, Some(init))
    }
}
