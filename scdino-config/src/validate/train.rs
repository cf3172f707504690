//! `train:` — epochs, the optimizer's schedule, the teacher, and `train.ibot` (whose masks
//! depend on the model's patch size and the global crop size).
use crate::{AugmentSection, IbotSection, Invalid, ModelSection, TrainSection, Validator};

impl TrainSection {
    pub(crate) fn validate(
        &self,
        v: &Validator,
        model: &ModelSection,
        aug: &AugmentSection,
    ) -> Result<(), Invalid> {
        self.validate_loop(v)?;
        self.validate_schedule(v)?;
        v.check(self.log_every > 0, "train.log_every", "must be at least 1")?;
        v.check(
            self.peak_tflops.is_none_or(|p| p.is_finite() && p > 0.0),
            "train.peak_tflops",
            "must be a positive number of TFLOP/s (or left out)",
        )?;
        v.check(
            model.dichavit.sampling != crate::ChannelSampling::Diverse
                || self.strategy != crate::Strategy::Fsdp,
            "model.dichavit.sampling",
            "diverse reads the student's channel embeddings before each step, which train.strategy: fsdp keeps sharded there; use ddp",
        )?;
        v.check(
            self.teacher_channels == crate::TeacherChannels::Step
                || model.channels == crate::ChannelMode::Tokens,
            "train.teacher_channels",
            &format!(
                "all shows the teacher every channel while the student sees a sampled subset: it needs model.channels: tokens (this run has {}); remove the key",
                model.channels.name()
            ),
        )?;
        self.validate_channel_dino(v, model)?;
        v.check(
            (0.0..=1.0).contains(&self.single_channel_steps),
            "train.single_channel_steps",
            &format!(
                "is {} but must be a fraction of the steps, from 0 to 1",
                self.single_channel_steps
            ),
        )?;
        v.check(
            self.single_channel_steps == 0.0 || model.channels == crate::ChannelMode::Tokens,
            "train.single_channel_steps",
            &format!(
                "steps on one channel alone are a channel draw of model.channels: tokens (this run has {}); set it to 0 or remove the key",
                model.channels.name()
            ),
        )?;
        self.ibot.validate(v, model, aug, self.batch_size_per_gpu)
    }

    /// `train.channel_dino_weight`: per-channel tokens exist in `tokens` models only, and the
    /// teacher's channels must be the student's (each of its tokens is a target of the same
    /// channel's).
    fn validate_channel_dino(&self, v: &Validator, model: &ModelSection) -> Result<(), Invalid> {
        v.non_negative(self.channel_dino_weight, "train.channel_dino_weight")?;
        if self.channel_dino_weight == 0.0 {
            return Ok(());
        }
        v.check(
            model.channels == crate::ChannelMode::Tokens,
            "train.channel_dino_weight",
            &format!(
                "the channel DINO term trains each channel's own token, which needs model.channels: tokens (this run has {}); set it to 0 or remove the key",
                model.channels.name()
            ),
        )?;
        v.check(
            self.teacher_channels == crate::TeacherChannels::Step,
            "train.channel_dino_weight",
            "the channel DINO term pairs each channel's student token with the teacher's token of the same channel, so the teacher must see the student's channels: remove train.teacher_channels: all or set the weight to 0",
        )
    }

    /// Epochs, GPUs, batch and the rendezvous.
    fn validate_loop(&self, v: &Validator) -> Result<(), Invalid> {
        v.check(self.epochs > 0, "train.epochs", "must be at least 1")?;
        v.check(
            self.checkpoint_every > 0,
            "train.checkpoint_every",
            "must be at least 1",
        )?;
        v.check(self.num_gpus > 0, "train.num_gpus", "must be at least 1")?;
        v.check(
            self.batch_size_per_gpu > 0,
            "train.batch_size_per_gpu",
            "must be at least 1",
        )?;
        v.check(
            self.dist_url == "env://" || self.dist_url.starts_with("tcp://"),
            "train.dist_url",
            "must be \"env://\" or \"tcp://HOST:PORT\"",
        )
    }

    /// The teacher's momentum and temperatures, the learning rate and weight decay, and the
    /// warm-ups and freezes that must fit in the epochs.
    fn validate_schedule(&self, v: &Validator) -> Result<(), Invalid> {
        v.check(
            (0.0..=1.0).contains(&self.momentum_teacher),
            "train.momentum_teacher",
            "must be in [0, 1] (0.996 is typical)",
        )?;
        v.positive(self.warmup_teacher_temp, "train.warmup_teacher_temp")?;
        v.positive(self.teacher_temp, "train.teacher_temp")?;
        self.within_epochs(
            v,
            self.warmup_teacher_temp_epochs,
            "train.warmup_teacher_temp_epochs",
        )?;
        v.non_negative(self.weight_decay, "train.weight_decay")?;
        v.non_negative(self.weight_decay_end, "train.weight_decay_end")?;
        v.non_negative(self.clip_grad, "train.clip_grad")?;
        v.non_negative(self.koleo_weight, "train.koleo_weight")?;
        v.positive(self.lr, "train.lr")?;
        v.non_negative(self.min_lr, "train.min_lr")?;
        v.check(
            self.min_lr <= self.lr,
            "train.min_lr",
            &format!(
                "is {} but must not exceed train.lr ({})",
                self.min_lr, self.lr
            ),
        )?;
        self.within_epochs(v, self.warmup_epochs, "train.warmup_epochs")?;
        v.check(
            self.freeze_last_layer <= self.epochs,
            "train.freeze_last_layer",
            &format!(
                "is {} but training has only {} epochs: the head's last layer would never train",
                self.freeze_last_layer, self.epochs
            ),
        )
    }
}

impl TrainSection {
    /// A warm-up of `epochs` that must fit in the training.
    fn within_epochs(&self, v: &Validator, epochs: usize, key: &str) -> Result<(), Invalid> {
        v.check(
            epochs <= self.epochs,
            key,
            &format!("is {epochs} but training has only {} epochs", self.epochs),
        )
    }
}

impl IbotSection {
    /// When on: masks that can exist at this batch and crop size, and a head layout the
    /// patches can go through.
    fn validate(
        &self,
        v: &Validator,
        model: &ModelSection,
        aug: &AugmentSection,
        batch_size_per_gpu: usize,
    ) -> Result<(), Invalid> {
        v.non_negative(self.weight, "train.ibot.weight")?;
        v.check(
            self.out_dim.is_none() || self.separate_head,
            "train.ibot.out_dim",
            "sets the prototypes of a separate iBOT head: set train.ibot.separate_head: true too (the shared head has model.out_dim)",
        )?;
        if !self.enabled() {
            return Ok(());
        }
        self.validate_masks(v, model, aug, batch_size_per_gpu)?;
        v.positive(self.student_temp, "train.ibot.student_temp")?;
        if let Some(t) = self.teacher_temp {
            v.positive(t, "train.ibot.teacher_temp")?;
        }
        if let Some(k) = self.out_dim {
            v.check(k > 0, "train.ibot.out_dim", "must be at least 1")?;
        }
        Ok(())
    }

    fn validate_masks(
        &self,
        v: &Validator,
        model: &ModelSection,
        aug: &AugmentSection,
        batch_size_per_gpu: usize,
    ) -> Result<(), Invalid> {
        v.check(
            (0.0..=1.0).contains(&self.mask_probability),
            "train.ibot.mask_probability",
            "must be in [0, 1] (0.5 in DINOv2)",
        )?;
        let masked_images = (2.0 * batch_size_per_gpu as f64 * self.mask_probability) as usize;
        v.check(
            masked_images > 0,
            "train.ibot.mask_probability",
            &format!(
                "is {} but with train.batch_size_per_gpu {batch_size_per_gpu} no global crop of a step would be masked (2 × batch × probability < 1)",
                self.mask_probability
            ),
        )?;
        let [lo, hi] = self.mask_ratio;
        v.check(
            0.0 <= lo && lo <= hi && hi <= 1.0,
            "train.ibot.mask_ratio",
            &format!("is [{lo}, {hi}]; needs 0 <= min <= max <= 1 ([0.1, 0.5] in DINOv2)"),
        )?;
        let grid = aug.global_crop_size / model.patch_size.max(1);
        let most = (grid * grid) as f64 * hi;
        v.check(
            grid >= 3 && most >= 4.0,
            "train.ibot.mask_ratio",
            &format!(
                "masks at most {most:.1} of the {} patches of a global crop ({} px, patch {}), but a mask is made of rectangles of at least 4 patches: raise the ratio or the crop size",
                grid * grid,
                aug.global_crop_size,
                model.patch_size
            ),
        )
    }
}
