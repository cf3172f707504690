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
        v.positive(self.channel_embed_std, "model.channel_embed_std")?;
        let tokens = self.channels == ChannelMode::Tokens;
        v.check(
            tokens || self.channel_embed_std == Self::DEFAULT_CHANNEL_EMBED_STD,
            "model.channel_embed_std",
            &format!(
                "sets the init of ChannelViT's channel embeddings: it needs model.channels: tokens (this run has {}); remove the key",
                self.channels.name()
            ),
        )?;
        v.check(
            tokens || self.channel_mixing_blocks == 0,
            "model.channel_mixing_blocks",
            &format!(
                "restricts the attention of per-channel tokens to their own position: it needs model.channels: tokens (this run has {}); remove the key",
                self.channels.name()
            ),
        )?;
        v.check(
            tokens || self.channel_separate_blocks == 0,
            "model.channel_separate_blocks",
            &format!(
                "restricts the attention of per-channel tokens to their own channel: it needs model.channels: tokens (this run has {}); remove the key",
                self.channels.name()
            ),
        )?;
        for (key, n) in [
            (
                "model.channel_separate_blocks",
                self.channel_separate_blocks,
            ),
            ("model.channel_mixing_blocks", self.channel_mixing_blocks),
        ] {
            v.check(
                n <= self.arch.depth(),
                key,
                &format!(
                    "is {n} but {} has {} blocks",
                    self.arch.name(),
                    self.arch.depth()
                ),
            )?;
        }
        v.check(
            self.channel_separate_blocks + self.channel_mixing_blocks <= self.arch.depth(),
            "model.channel_mixing_blocks",
            &format!(
                "is {} after {} model.channel_separate_blocks, {} blocks in all, but {} has {}",
                self.channel_mixing_blocks,
                self.channel_separate_blocks,
                self.channel_separate_blocks + self.channel_mixing_blocks,
                self.arch.name(),
                self.arch.depth()
            ),
        )?;
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

#[cfg(test)]
mod tests {
    use crate::{Config, ConfigError};

    const TOKENS: &str = "data:\n  channel_names: [a, b, c]\n  channel_combinations: [\"012\"]\nmodel:\n  arch: vit_tiny\n  channels: tokens\n";

    fn refused(yaml: &str) -> (String, String) {
        match Config::from_yaml(yaml, "t.yaml") {
            Err(ConfigError::Invalid { key, message, .. }) => (key, message),
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    /// The two keys that make `tokens` learn where channels interact are read, written back,
    /// and refused by name where they cannot act: another channel mode, a scale that is not
    /// positive, more masked blocks than the model has.
    #[test]
    fn channel_mixing_keys_need_tokens_and_are_checked() {
        let c = Config::from_yaml(
            &format!("{TOKENS}  channel_embed_std: 1.0\n  channel_mixing_blocks: 12\n"),
            "t",
        )
        .unwrap();
        assert_eq!(
            (c.model.channel_embed_std, c.model.channel_mixing_blocks),
            (1.0, 12)
        );
        assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
        let plain = Config::from_yaml(TOKENS, "t").unwrap();
        assert_eq!(
            (
                plain.model.channel_embed_std,
                plain.model.channel_mixing_blocks
            ),
            (0.02, 0)
        );
        for mode in ["fixed", "bag"] {
            let text = TOKENS.replace("tokens", mode);
            for (key, line) in [
                ("model.channel_embed_std", "  channel_embed_std: 1.0\n"),
                (
                    "model.channel_mixing_blocks",
                    "  channel_mixing_blocks: 1\n",
                ),
            ] {
                let (k, msg) = refused(&format!("{text}{line}"));
                assert_eq!(k, key);
                assert!(
                    msg.contains("model.channels: tokens") && msg.contains(mode),
                    "{msg}"
                );
            }
            // The defaults written out (as `config show` does) are accepted.
            let shown = Config::from_yaml(&text, "t").unwrap().to_yaml();
            assert!(Config::from_yaml(&shown, "shown").is_ok());
        }
        for bad in ["0", "-1.0", ".nan"] {
            let (k, _) = refused(&format!("{TOKENS}  channel_embed_std: {bad}\n"));
            assert_eq!(k, "model.channel_embed_std");
        }
        let (k, msg) = refused(&format!("{TOKENS}  channel_mixing_blocks: 13\n"));
        assert_eq!(k, "model.channel_mixing_blocks");
        assert!(msg.contains("13") && msg.contains("12 blocks"), "{msg}");
        let e = Config::from_yaml(&format!("{TOKENS}  channel_mixing_blocks: -1\n"), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("channel_mixing_blocks"), "{e}");
    }

    /// `channel_separate_blocks` is read and written back, needs `tokens`, and with the mixing
    /// blocks after it fits the depth: refused naming the key and both counts otherwise.
    #[test]
    fn channel_separate_blocks_need_tokens_and_fit_the_depth() {
        let c = Config::from_yaml(
            &format!("{TOKENS}  channel_separate_blocks: 6\n  channel_mixing_blocks: 6\n"),
            "t",
        )
        .unwrap();
        assert_eq!(
            (
                c.model.channel_separate_blocks,
                c.model.channel_mixing_blocks
            ),
            (6, 6)
        );
        assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
        assert_eq!(
            Config::from_yaml(TOKENS, "t")
                .unwrap()
                .model
                .channel_separate_blocks,
            0
        );
        for mode in ["fixed", "bag"] {
            let (k, msg) = refused(&format!(
                "{}  channel_separate_blocks: 2\n",
                TOKENS.replace("tokens", mode)
            ));
            assert_eq!(k, "model.channel_separate_blocks");
            assert!(
                msg.contains("model.channels: tokens") && msg.contains(mode),
                "{msg}"
            );
        }
        let (k, msg) = refused(&format!("{TOKENS}  channel_separate_blocks: 13\n"));
        assert_eq!(k, "model.channel_separate_blocks");
        assert!(msg.contains("13") && msg.contains("12 blocks"), "{msg}");
        let (k, msg) = refused(&format!(
            "{TOKENS}  channel_separate_blocks: 8\n  channel_mixing_blocks: 5\n"
        ));
        assert_eq!(k, "model.channel_mixing_blocks");
        assert!(
            msg.contains("13 blocks in all") && msg.contains("has 12"),
            "{msg}"
        );
    }
}
