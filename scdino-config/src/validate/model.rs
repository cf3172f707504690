//! `model:` — patch size, head and channel mode (which depends on the data's channels and
//! sample order).
use crate::{
    CellChannels, ChannelMode, DataSection, InitFormat, Invalid, ModelSection, SampleOrder,
    Validator,
};

impl ModelSection {
    pub(crate) fn validate(&self, v: &Validator, data: &DataSection) -> Result<(), Invalid> {
        let n_channels = data.channel_names.len();
        v.check(
            self.patch_size > 0 && self.patch_size <= 64,
            "model.patch_size",
            "must be between 1 and 64 pixels (scDINO uses 8 or 16)",
        )?;
        v.check(self.out_dim > 0, "model.out_dim", "must be positive")?;
        if let Some(px) = self.img_size {
            v.check(
                px >= self.patch_size && px <= 8192,
                "model.img_size",
                &format!(
                    "must be between model.patch_size ({}) and 8192 pixels: the position grid has img_size / patch_size patches per side",
                    self.patch_size
                ),
            )?;
        }
        v.check(
            self.channels != ChannelMode::Bag || data.order == SampleOrder::Exact,
            "model.channels",
            "bag trains on every channel of every image as its own sample, in an exact shuffle of those; data.order: shard_sequential or sites is not supported with it",
        )?;
        v.check(
            !self.channels.is_fixed()
                || data
                    .screen
                    .as_ref()
                    .is_none_or(|s| s.cell_channels == CellChannels::Shared),
            "model.channels",
            "fixed takes every channel of every cell, but data.screen.cell_channels: own gives \
             each cell only its own: train `bag` or `tokens` on it",
        )?;
        v.check(
            self.channels.is_fixed() || n_channels <= 64,
            "model.channels",
            &format!(
                "{} takes at most 64 channels (the images have {n_channels})",
                self.channels.name()
            ),
        )?;
        v.check(
            (0.0..1.0).contains(&self.drop_path_rate),
            "model.drop_path_rate",
            "must be in [0, 1)",
        )?;
        if let Some(ls) = self.layer_scale {
            v.positive(ls, "model.layer_scale")?;
        }
        self.dichavit.validate(v, self.channels)?;
        let init = &self.init;
        if let Some(from) = &init.from {
            v.check(
                !from.trim().is_empty(),
                "model.init.from",
                "must name the weights to start from (a timm folder, a run's checkpoint or a .pth)",
            )?;
        }
        v.check(
            !init.head || init.format == InitFormat::Run,
            "model.init.head",
            "only a run's checkpoint (format: run) has a DINO head to keep",
        )?;
        v.folder_name(&self.name, "model.name")
    }
}

impl crate::DiChaViTSection {
    /// Its keys act on channel tokens: with another `model.channels` any value other than
    /// the default is refused, so a run never silently ignores a loss it asked for.
    pub(crate) fn validate(
        &self,
        v: &crate::Validator,
        mode: crate::ChannelMode,
    ) -> Result<(), crate::Invalid> {
        v.check(
            mode == crate::ChannelMode::Tokens || *self == Self::default(),
            "model.dichavit",
            &format!(
                "DiChaViT's losses and channel sampling act on ChannelViT's channel embeddings and per-channel tokens: they need model.channels: tokens (this run has {}); remove the model.dichavit block",
                mode.name()
            ),
        )?;
        v.non_negative(
            self.channel_loss_weight,
            "model.dichavit.channel_loss_weight",
        )?;
        v.positive(
            self.channel_loss_temperature,
            "model.dichavit.channel_loss_temperature",
        )?;
        v.non_negative(self.token_loss_weight, "model.dichavit.token_loss_weight")?;
        v.non_negative(self.gamma_s, "model.dichavit.gamma_s")?;
        v.non_negative(self.gamma_d, "model.dichavit.gamma_d")?;
        v.positive(
            self.sampling_temperature,
            "model.dichavit.sampling_temperature",
        )
    }
}
