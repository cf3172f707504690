//! The `model:` keys that pretrained weights (`model.init.from`) fix: the architecture, patch
//! size, registers, LayerScale, the resolution of the position grid and, where the source
//! records it, the position-embedding layout. A run config need not repeat them: a key the file does not write is taken from the
//! source, a key it writes must agree with it. Resolved here, before validation, so every stage
//! that reads the file (training, features, export, `config show`) sees the same model.
//!
//! Reading a source needs libtorch (a `.pth`) or the trainer's checkpoint format, which this
//! crate does not have: the trainer hands in a [`ReadLayout`]. The launcher reads configs
//! without one and keeps the keys as written; it builds no network.
use crate::{Arch, ModelInit, ModelSection, PosEmbed, Validator};

/// What a source fixes of `model:`.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceLayout {
    pub arch: Arch,
    pub patch_size: usize,
    pub num_register_tokens: usize,
    /// `Some(initial value)` when the source has LayerScale (the value only matters for
    /// training from scratch: the source's gammas replace it).
    pub layer_scale: Option<f64>,
    /// None when the source does not record how its positions are resampled (a `.pth`: DINO's
    /// and DINOv2's files hold the same tensors for either).
    pub pos_embed: Option<PosEmbed>,
    /// The resolution of the source's position grid (grid side × patch size): the model keeps
    /// that grid, so its positions are resampled once, from the source's grid to each input's.
    pub img_size: usize,
}

/// Reads the layout of `model.init.from`; the error says why it cannot (it is reported under
/// the key `model.init.from`, with its line).
pub trait ReadLayout {
    fn read_layout(&self, init: &ModelInit) -> Result<SourceLayout, String>;
}

impl SourceLayout {
    /// Writes what `model` does not write (per `v`'s file) from the source; a written key
    /// that differs is refused, naming the key, its line, both values and the source, unless
    /// `model.init.strict` is false: then the file's value stands, and the tensors it does not
    /// fit are skipped and listed when the run starts.
    pub(crate) fn resolve(
        &self,
        model: &mut ModelSection,
        v: &Validator,
        from: &str,
    ) -> Result<(), crate::Invalid> {
        let keep_written = !model.init.strict;
        self.fit(model, &|key| v.written(key), keep_written)
            .map_err(|d| {
                v.err(
                    d.key,
                    &format!(
                        "is {}, but model.init.from {from} has {}; remove the key to take the source's, or start from another source",
                        d.configured, d.source
                    ),
                )
            })
    }

    /// `model` as it is (every key counts as written: a validated config, or one built in
    /// code) against the source: the first difference as `` `key` is X, but the source has Y``.
    pub fn check(&self, model: &ModelSection) -> Result<(), String> {
        self.fit(&mut model.clone(), &|_| true, false).map_err(|d| {
            format!(
                "`{}` is {}, but the source has {}",
                d.key, d.configured, d.source
            )
        })
    }

    /// Sets each key `written` says the file does not write; a written key that differs is a
    /// [`Difference`], or left as it is with `keep_written`.
    fn fit(
        &self,
        model: &mut ModelSection,
        written: &dyn Fn(&str) -> bool,
        keep_written: bool,
    ) -> Result<(), Difference> {
        let ls = |x: Option<f64>| match x {
            Some(_) => "set (LayerScale)".to_string(),
            None => "unset (no LayerScale)".to_string(),
        };
        // The key, whether it differs, its configured and the source's value as messages
        // write them, and how the source's value is set.
        type Set = fn(&mut ModelSection, &SourceLayout);
        let pos = self.pos_embed.unwrap_or(model.pos_embed);
        let px = |m: &ModelSection| match m.img_size {
            Some(s) => s.to_string(),
            None => format!("unset ({})", ModelSection::DEFAULT_IMG_SIZE),
        };
        let keys: [(&'static str, bool, String, String, Set); 6] = [
            (
                "model.arch",
                model.arch != self.arch,
                model.arch.name().into(),
                self.arch.name().into(),
                |m, s| m.arch = s.arch,
            ),
            (
                "model.patch_size",
                model.patch_size != self.patch_size,
                model.patch_size.to_string(),
                self.patch_size.to_string(),
                |m, s| m.patch_size = s.patch_size,
            ),
            (
                "model.num_register_tokens",
                model.num_register_tokens != self.num_register_tokens,
                model.num_register_tokens.to_string(),
                self.num_register_tokens.to_string(),
                |m, s| m.num_register_tokens = s.num_register_tokens,
            ),
            (
                "model.layer_scale",
                model.layer_scale.is_some() != self.layer_scale.is_some(),
                ls(model.layer_scale),
                ls(self.layer_scale),
                |m, s| m.layer_scale = s.layer_scale,
            ),
            // A source that does not record its resampling leaves the config's.
            (
                "model.pos_embed",
                model.pos_embed != pos,
                model.pos_embed.name().into(),
                pos.name().into(),
                |m, s| m.pos_embed = s.pos_embed.unwrap_or(m.pos_embed),
            ),
            // Unset is the default grid, so a source at 224 px leaves the key unwritten.
            (
                "model.img_size",
                model.img_size_px() != self.img_size,
                px(model),
                self.img_size.to_string(),
                |m, s| {
                    m.img_size =
                        (s.img_size != ModelSection::DEFAULT_IMG_SIZE).then_some(s.img_size)
                },
            ),
        ];
        for (key, differs, configured, source, set) in keys {
            if !written(key) {
                set(model, self);
            } else if differs && !keep_written {
                return Err(Difference {
                    key,
                    configured,
                    source,
                });
            }
        }
        Ok(())
    }
}

/// A written key the source contradicts.
struct Difference {
    key: &'static str,
    configured: String,
    source: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, ConfigError};

    /// A source as DINOv2's ViT-S/14 with registers is (the trainer's reader is tested against
    /// real folders and checkpoints in its integration tests).
    struct Dinov2Like(Option<PosEmbed>);

    impl ReadLayout for Dinov2Like {
        fn read_layout(&self, init: &ModelInit) -> Result<SourceLayout, String> {
            match init.from.as_deref() {
                Some("/models/dinov2") => Ok(SourceLayout {
                    arch: Arch::VitSmall,
                    patch_size: 14,
                    num_register_tokens: 4,
                    layer_scale: Some(1e-5),
                    pos_embed: self.0,
                    img_size: 518,
                }),
                other => Err(format!("no such folder: {other:?}")),
            }
        }
    }

    struct Unread;

    impl ReadLayout for Unread {
        fn read_layout(&self, _: &ModelInit) -> Result<SourceLayout, String> {
            panic!("a config without model.init.from read a source")
        }
    }

    const HEAD: &str = "data:\n  channel_names: [a, b, c]\n  channel_combinations: [\"012\"]\n";

    fn read(model: &str, source: &dyn ReadLayout) -> Result<Config, ConfigError> {
        Config::from_yaml_with(&format!("{HEAD}model:\n{model}"), "run.yaml", source)
    }

    #[test]
    fn keys_the_file_does_not_write_come_from_the_source() {
        let init = "  arch: vit_tiny\n  init:\n    from: /models/dinov2\n";
        let src = Dinov2Like(Some(PosEmbed::TimmNoClass));
        // arch is written (and differs): refused; without it everything is the source's.
        let err = read(init, &src).unwrap_err().to_string();
        assert!(
            err.contains("run.yaml:5: `model.arch`: is vit_tiny, but model.init.from /models/dinov2 has vit_small"),
            "{err}"
        );
        let cfg = read("  out_dim: 64\n  init:\n    from: /models/dinov2\n", &src).unwrap();
        let m = &cfg.model;
        assert_eq!(
            (
                m.arch,
                m.patch_size,
                m.num_register_tokens,
                m.layer_scale,
                m.pos_embed,
                m.img_size
            ),
            (
                Arch::VitSmall,
                14,
                4,
                Some(1e-5),
                PosEmbed::TimmNoClass,
                Some(518)
            )
        );
        assert_eq!(m.out_dim, 64);
        // The resolved values are what the run writes back (its checkpoint's config).
        let back = Config::from_yaml(&cfg.to_yaml(), "back").unwrap();
        assert_eq!(back.model, cfg.model);
        // Without a reader (the launcher) the file's values stand.
        let plain = Config::from_yaml(
            &format!("{HEAD}model:\n  init:\n    from: /models/dinov2\n"),
            "x",
        )
        .unwrap();
        assert_eq!(
            (plain.model.arch, plain.model.patch_size),
            (Arch::VitSmall, 16)
        );
    }

    #[test]
    fn written_keys_must_agree_and_a_source_that_fixes_no_layout_leaves_the_files() {
        let src = Dinov2Like(Some(PosEmbed::TimmNoClass));
        let agree = "  arch: vit_small\n  patch_size: 14\n  num_register_tokens: 4\n  layer_scale: 1.0e-6\n  pos_embed: timm_no_class\n  init:\n    from: /models/dinov2\n";
        let cfg = read(agree, &src).unwrap();
        // The initial LayerScale value is the file's (the source's gammas replace it anyway).
        assert_eq!(cfg.model.layer_scale, Some(1e-6));
        for (model, key, line, want) in [
            (
                "  patch_size: 16\n",
                "model.patch_size",
                5,
                "is 16, but model.init.from /models/dinov2 has 14",
            ),
            (
                "  num_register_tokens: 0\n",
                "model.num_register_tokens",
                5,
                "is 0, but",
            ),
            (
                "  layer_scale: null\n",
                "model.layer_scale",
                5,
                "is unset (no LayerScale), but model.init.from /models/dinov2 has set (LayerScale)",
            ),
            (
                "  pos_embed: dino\n",
                "model.pos_embed",
                5,
                "is dino, but model.init.from /models/dinov2 has timm_no_class",
            ),
            (
                "  img_size: 224\n",
                "model.img_size",
                5,
                "is 224, but model.init.from /models/dinov2 has 518",
            ),
        ] {
            let yaml = format!("{model}  init:\n    from: /models/dinov2\n");
            match read(&yaml, &src).unwrap_err() {
                ConfigError::Invalid {
                    key: k,
                    line: l,
                    message,
                    ..
                } => {
                    assert_eq!((k.as_str(), l), (key, Some(line)), "{message}");
                    assert!(message.contains(want), "{message}");
                    assert!(message.contains("remove the key"), "{message}");
                }
                other => panic!("{other}"),
            }
        }
        // strict: false keeps what the file writes (the tensors that do not fit are skipped
        // and listed when the run starts); the rest still comes from the source.
        let lax = "  patch_size: 16\n  init:\n    from: /models/dinov2\n    strict: false\n";
        let cfg = read(lax, &src).unwrap();
        assert_eq!(
            (
                cfg.model.patch_size,
                cfg.model.arch,
                cfg.model.num_register_tokens
            ),
            (16, Arch::VitSmall, 4)
        );
        // A config already validated (or built in code) checked as it stands.
        let layout = src.read_layout(&cfg.model.init).unwrap();
        assert_eq!(
            layout.check(&cfg.model).unwrap_err(),
            "`model.patch_size` is 16, but the source has 14"
        );
        let cfg = read("  init:\n    from: /models/dinov2\n", &src).unwrap();
        layout.check(&cfg.model).unwrap();
        // The grid too: a model built at the default grid is not the source's.
        let mut default_grid = cfg.model.clone();
        default_grid.img_size = None;
        assert_eq!(
            layout.check(&default_grid).unwrap_err(),
            "`model.img_size` is unset (224), but the source has 518"
        );
        // A source that does not record its resampling (a .pth) leaves pos_embed to the file.
        let pth = Dinov2Like(None);
        let cfg = read(
            "  pos_embed: timm\n  init:\n    from: /models/dinov2\n",
            &pth,
        )
        .unwrap();
        assert_eq!(cfg.model.pos_embed, PosEmbed::Timm);
        let cfg = read("  init:\n    from: /models/dinov2\n", &pth).unwrap();
        assert_eq!(cfg.model.pos_embed, PosEmbed::Dino);
    }

    #[test]
    fn an_unreadable_source_is_reported_under_its_key_and_no_init_reads_nothing() {
        let err = read("  init:\n    from: /models/missing\n", &Dinov2Like(None))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("run.yaml:6: `model.init.from`: cannot read the model /models/missing fixes: no such folder"),
            "{err}"
        );
        read("  arch: vit_tiny\n", &Unread).unwrap();
        Config::from_yaml_with(HEAD, "run.yaml", &Unread).unwrap();
    }
}
