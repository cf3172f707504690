//! The epoch loop. Every rank runs the same steps and meets at the same collectives in the
//! same order (the step's own, the logged step's teacher statistics, the stop agreement after
//! every step and every epoch, FSDP's checkpoint writes), so any rank can decide to stop and
//! all stop at the same step with one checkpoint.
use super::batches::PreparedBatch;
use super::resume::Position;
use super::{TrainError, TrainOutcome, TrainingRun};
use crate::checkpoint::EpochTotals;
use crate::train::channels::{step_channels, teacher_channels};
use crate::train::collapse::TeacherSnapshot;
use crate::train::loss::DinoTerm;
use crate::train::step::{ChannelSubset, StepOutput, StepParams};
use crate::train::telemetry::progress::{Progress, ProgressLine};
use crate::train::telemetry::throughput::LogWindow;
use crate::train::telemetry::StepRecord;
use scdino_base::rng::SplitMix64;
use std::time::{Duration, Instant};

impl TrainingRun<'_> {
    /// Runs the epochs left, each ending with a checkpoint and its `log.txt` line, until all
    /// are done or the run stops (with a checkpoint at the step it stopped after).
    pub fn run(mut self) -> Result<TrainOutcome, TrainError> {
        if self.cfg.downstream.score_untrained
            && self.at == Position::default()
            && !self.checkpoints.files.initial_checkpoint().exists()
        {
            self.checkpoints
                .save_initial(self.strategy.as_mut(), &self.learner)?;
        }
        while self.at.epoch < self.cfg.train.epochs {
            if let Some(outcome) = self.epoch()? {
                return self.finish(outcome);
            }
        }
        self.finish(TrainOutcome::Finished)
    }

    /// The steps of the current epoch from `self.at`, then its end; returns how the run ends
    /// if it ends here.
    fn epoch(&mut self) -> Result<Option<TrainOutcome>, TrainError> {
        let epoch = self.at.epoch;
        let batches = self
            .data
            .epoch(self.cfg, &self.shape, epoch, self.at.batch)?;
        let mut window = LogWindow::start();
        let (epochs, niter, shown) = (
            self.cfg.train.epochs,
            self.shape.niter,
            self.shape.rank == 0,
        );
        let progress = Progress::new(epoch, epochs, niter, self.at.batch, shown);
        let epoch_start = Instant::now();
        for prepared in batches {
            let (prepared, wait) = prepared?;
            if let Some(outcome) = self.step(prepared, wait, &mut window, &progress)? {
                return Ok(Some(outcome));
            }
        }
        progress.finish();
        self.end_epoch(epoch_start)
    }

    /// One step on a prepared batch, its logging every `train.log_every` steps, and the stop
    /// check after it.
    fn step(
        &mut self,
        (batch, crops): PreparedBatch,
        wait: Duration,
        window: &mut LogWindow,
        progress: &Progress,
    ) -> Result<Option<TrainOutcome>, TrainError> {
        if batch.indices.is_empty() {
            tracing::warn!(
                "batch {} of epoch {} has no usable image; skipped",
                batch.batch_no,
                self.at.epoch
            );
            self.at.iteration += 1;
            return Ok(None);
        }
        let iteration = self.at.iteration;
        let among = self.data.batch_channels(&batch);
        let params = self.step_params(iteration, among.as_deref());
        let out = match &mut self.graphs {
            Some(g) => g.step(&mut self.learner, &crops, params, iteration)?,
            None => self
                .learner
                .step(&crops, params, iteration, self.strategy.as_mut())?,
        };
        if out.skipped {
            tracing::warn!("fp16: gradient overflow at iteration {iteration}; step skipped, loss scale lowered");
        }
        self.meter.loss += out.loss;
        self.meter.lr += params.lr;
        self.meter.wd += params.weight_decay;
        self.meter.steps += 1;
        window.add(batch.indices.len(), wait);
        self.at.iteration += 1;
        let done_in_epoch = batch.batch_no + 1;
        // SAFETY: the step is done with this batch (backward, optimizer, EMA) and kept no
        // handle on its crops.
        unsafe { self.data.recycle((batch, crops)) };
        progress.step(out.loss);
        if self.at.iteration.is_multiple_of(self.cfg.train.log_every)
            || done_in_epoch == self.shape.niter
        {
            self.log_step(&out, params, done_in_epoch, window, progress)?;
        }
        self.stop_mid_epoch(done_in_epoch)
    }

    /// The schedules' values, the step's generator seed and (`tokens`) its channel subset at
    /// `iteration`, drawn `among` the batch's channels when its cells bring their own.
    fn step_params(&self, iteration: usize, among: Option<&[usize]>) -> StepParams {
        let (cfg, epoch) = (self.cfg, self.at.epoch);
        let at = iteration.min(self.sched.lr.len() - 1);
        let channels = step_channels(
            cfg,
            iteration,
            self.channels.len(),
            &self.learner.nets.student.backbone,
            among,
        );
        let teacher = teacher_channels(cfg, channels.as_deref(), self.channels.len(), among);
        StepParams {
            lr: self.sched.lr[at],
            weight_decay: self.sched.weight_decay[at],
            momentum: self.sched.momentum[at],
            epoch,
            freeze_last_layer: epoch < cfg.train.freeze_last_layer,
            clip_grad: cfg.train.clip_grad,
            rng_seed: step_seed(cfg.run.seed, iteration),
            channels: channels.map(|c| ChannelSubset::from_indices(&c)),
            teacher_channels: teacher.map(|c| ChannelSubset::from_indices(&c)),
        }
    }

    /// A logged step: the teacher statistics over all ranks (a collective), the progress
    /// line, telemetry, and the collapse policy, which may stop the run here with a
    /// checkpoint.
    fn log_step(
        &mut self,
        out: &StepOutput,
        params: StepParams,
        done_in_epoch: usize,
        window: &mut LogWindow,
        progress: &Progress,
    ) -> Result<(), TrainError> {
        let rates = self.throughput.rates(window);
        // The collapse signals read the DINO term alone: a cross-entropy whose teacher
        // entropy they subtract.
        let dino = out
            .terms
            .get(DinoTerm::INFO.name)
            .expect("the DINO term is always on");
        let teacher =
            TeacherSnapshot::gather(&out.teacher.stats(), dino, self.strategy.collective())?;
        let (epoch, iteration) = (self.at.epoch, self.at.iteration);
        let record = StepRecord {
            iteration,
            epoch,
            loss: out.loss,
            terms: &out.terms,
            lr: params.lr,
            weight_decay: params.weight_decay,
            momentum: params.momentum,
            teacher_temp: self.learner.terms.teacher_temp(epoch),
            images_per_second: rates.images_per_second,
            data_wait_seconds: rates.data_wait_seconds,
            teacher: &teacher,
            utilisation: rates.utilisation,
            gpu: rates.gpu,
        };
        progress.line(&ProgressLine {
            record: &record,
            epochs: self.cfg.train.epochs,
            done_in_epoch,
            niter: self.shape.niter,
            mean_loss: self.meter.loss / self.meter.steps as f64,
            step_seconds: rates.step_seconds,
        });
        self.telemetry.step(&record)?;
        *window = LogWindow::start();
        let last_in_epoch = done_in_epoch >= self.shape.niter;
        if let Some(text) = self.collapse.observe(iteration, &teacher, last_in_epoch) {
            self.checkpoint_mid_epoch(epoch, done_in_epoch, iteration)?;
            return Err(TrainError::Collapsed(text));
        }
        Ok(())
    }

    /// Checkpoints the exact position `batch` steps into `epoch` (a collapse stop or a stop
    /// signal mid-epoch) and flushes the metrics.
    fn checkpoint_mid_epoch(
        &mut self,
        epoch: usize,
        batch: usize,
        iteration: usize,
    ) -> Result<(), TrainError> {
        let at = Position {
            epoch,
            batch,
            iteration,
        };
        self.checkpoints.save(
            self.strategy.as_mut(),
            &self.learner,
            at,
            &self.meter,
            false,
        )?;
        self.telemetry.flush()?;
        Ok(())
    }

    /// After a step that is not its epoch's last: a stop (signal or step limit) checkpoints
    /// the exact position here. The epoch's last step leaves the stop to [`Self::end_epoch`].
    fn stop_mid_epoch(&mut self, done_in_epoch: usize) -> Result<Option<TrainOutcome>, TrainError> {
        let stop = self.stop_reason()?;
        if stop.is_none() || done_in_epoch >= self.shape.niter {
            return Ok(None);
        }
        let (epoch, iteration) = (self.at.epoch, self.at.iteration);
        self.checkpoint_mid_epoch(epoch, done_in_epoch, iteration)?;
        tracing::info!(
            "checkpoint written at epoch {epoch}, batch {done_in_epoch} (iteration {iteration})"
        );
        Ok(stop)
    }

    /// The end of an epoch: checkpoint first, then the log line (a crash in between re-logs);
    /// then a collapse kept for this point, or a stop, may end the run.
    fn end_epoch(&mut self, epoch_start: Instant) -> Result<Option<TrainOutcome>, TrainError> {
        let (epoch, epochs) = (self.at.epoch, self.cfg.train.epochs);
        let finished = epoch + 1;
        let numbered = epoch % self.cfg.train.checkpoint_every == 0 || finished == epochs;
        let next = Position {
            epoch: finished,
            batch: 0,
            iteration: self.at.iteration,
        };
        let no_totals = EpochTotals::default();
        self.checkpoints.save(
            self.strategy.as_mut(),
            &self.learner,
            next,
            &no_totals,
            numbered,
        )?;
        let n = self.meter.steps.max(1) as f64;
        let line = serde_json::json!({
            "train_loss": self.meter.loss / n,
            "train_lr": self.meter.lr / n,
            "train_wd": self.meter.wd / n,
            "epoch": epoch,
        });
        self.telemetry.epoch(finished, &line, self.meter.loss / n)?;
        if let Some(text) = self.collapse.stop_after_epoch() {
            self.telemetry.flush()?;
            return Err(TrainError::Collapsed(text));
        }
        if self.shape.rank == 0 {
            tracing::info!(
                "Epoch: [{epoch}/{epochs}] Total time: {:.1}s ({:.3} s / it)",
                epoch_start.elapsed().as_secs_f64(),
                epoch_start.elapsed().as_secs_f64() / self.meter.steps.max(1) as f64
            );
        }
        self.data.report_epoch(epoch);
        self.at = next;
        self.meter = EpochTotals::default();
        let stop = self.stop_reason()?;
        Ok(stop.filter(|_| self.at.epoch < epochs))
    }

    /// Whether to stop at this boundary: a stop request on any rank (a collective, see
    /// [`crate::train::preempt`]), else the step limit.
    fn stop_reason(&mut self) -> Result<Option<TrainOutcome>, TrainError> {
        let requested = self.stop.agreed(self.strategy.collective())?;
        let step_limit = self.max_steps.is_some_and(|m| self.at.iteration >= m);
        Ok(if requested {
            Some(TrainOutcome::Preempted)
        } else if step_limit {
            Some(TrainOutcome::StepLimit)
        } else {
            None
        })
    }

    /// The end of every run that did not fail. With several ranks it logs the student's
    /// parameter checksum, so tests (and people) can check that data parallelism kept the
    /// ranks identical (a collective under FSDP: every rank calls this).
    fn finish(mut self, outcome: TrainOutcome) -> Result<TrainOutcome, TrainError> {
        if self.strategy.world_size() > 1 {
            let sum = self.strategy.checksum(&self.learner)?;
            tracing::info!(checksum = sum, "student parameter checksum {sum:.12e}");
        }
        Ok(outcome)
    }
}

/// libtorch's generator seed for one iteration (drop path draws).
fn step_seed(seed: u64, iteration: usize) -> i64 {
    let mut r = SplitMix64::new(seed ^ (iteration as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (r.next_u64() >> 1) as i64
}
