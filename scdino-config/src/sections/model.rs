//! `model:`: the backbone, the head, the channel mode and the weights a run starts from.
use serde::{Deserialize, Serialize};

/// ViT backbone and DINO head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// `train_scDINO.dino_vit_name`: prefix of the model and analysis folders.
    pub name: String,
    /// `hyperparameters.arch`.
    pub arch: Arch,
    /// `hyperparameters.patch_size`.
    pub patch_size: usize,
    /// argparse `--out_dim`: prototypes of the DINO head.
    pub out_dim: usize,
    /// `hyperparameters.norm_last_layer`: freeze `weight_g` of the head's last layer at 1.
    pub norm_last_layer: bool,
    /// `hyperparameters.use_bn_in_head`.
    pub use_bn_in_head: bool,
    /// `hyperparameters.drop_path_rate`: stochastic depth of the student only.
    pub drop_path_rate: f64,
    /// How the model takes channels (new; scDINO has `fixed` only).
    pub channels: ChannelMode,
    /// DINOv2's register tokens (Darcet et al., ICLR 2024; `num_register_tokens`, 4 in the
    /// released `*_reg` models; 0 = none, scDINO): learned tokens after the CLS token, without
    /// position embedding, that take over the high-norm "artefact" tokens which spoil the
    /// attention maps. Attention maps leave them out.
    pub num_register_tokens: usize,
    /// LayerScale (CaiT; DINOv2's `ls1.gamma`, `ls2.gamma`): each residual branch scaled per
    /// channel by a learned vector starting at this value (DINOv2: 1e-5). Unset: none (scDINO).
    pub layer_scale: Option<f64>,
    /// The position-embedding layout and how it is resampled for other input sizes:
    /// `dino` (scDINO: a class position, DINO's `interpolate_pos_encoding`), `timm` (a class
    /// position, timm's `resample_abs_pos_embed`), `timm_no_class` (timm's `no_embed_class`,
    /// DINOv2's layout: patch positions only, timm's resampling).
    pub pos_embed: PosEmbed,
    /// The resolution whose patch grid the position embeddings are learned for (DINO's and
    /// timm's `img_size`): (img_size / patch_size)² positions, resampled once, with
    /// `model.pos_embed`'s method, to the grid of each input. Unset: 224 px (scDINO). With
    /// `model.init` it is the source's (DINOv2: 518), so the run computes what the source did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub img_size: Option<usize>,
    /// `model.channels: tokens` only: the standard deviation the channel embeddings start at
    /// (orthogonal rows of norm std·√D, DiChaViT's init; 0.02 = DINO's trunc-normal scale).
    /// At 0.02 a channel's embedding is ~1–2 % of a token after LayerNorm, too little for the
    /// first blocks to tell "a's dot on b's disk" from "b's dot on a's disk" (BENCHMARKS.md
    /// run 9: 1.0 with `channel_mixing_blocks: 1` learned the interaction task). Init only.
    pub channel_embed_std: f64,
    /// `model.channels: tokens` only: the first N blocks attend within a channel: a patch
    /// token (channel c, patch p) attends only to the patch tokens (c, p′) of its own channel,
    /// not to the CLS and register tokens (which attend to everything). Those blocks encode
    /// each channel's patches exactly as with the channel alone, as `bag` encodes it, before
    /// the channels meet (BENCHMARKS.md run 14). 0 = ChannelViT.
    pub channel_separate_blocks: usize,
    /// `model.channels: tokens` only: the N blocks after `channel_separate_blocks` attend
    /// within a position: a patch token (channel c, patch p) attends only to the tokens
    /// (c′, p) of every channel the input holds and to the CLS and register tokens, which
    /// attend to everything. It keeps those blocks reading how the channels meet at each
    /// place, which plain attention at DINO's init does not find (BENCHMARKS.md run 9).
    /// With `channel_separate_blocks` at most the depth; 0 = ChannelViT.
    pub channel_mixing_blocks: usize,
    /// Start training from pretrained weights (once, when a run starts; a resumed run
    /// continues from its own checkpoint).
    pub init: ModelInit,
    /// DiChaViT's diversification losses and channel sampling (`model.channels: tokens` only).
    pub dichavit: crate::DiChaViTSection,
}

/// `model.pos_embed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PosEmbed {
    #[default]
    Dino,
    Timm,
    TimmNoClass,
}

impl PosEmbed {
    /// The YAML spelling.
    pub fn name(&self) -> &'static str {
        match self {
            PosEmbed::Dino => "dino",
            PosEmbed::Timm => "timm",
            PosEmbed::TimmNoClass => "timm_no_class",
        }
    }
}

/// `model.init`: the weights a run starts from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelInit {
    /// A timm folder, a checkpoint of another run, or a `.pth`. Unset: a random init (scDINO).
    pub from: Option<String>,
    /// What `from` is.
    pub format: InitFormat,
    /// How a source with another channel count meets the run's channels.
    pub channels: ChannelAdapt,
    /// `run` only: keep the source's DINO head too (else it starts fresh).
    pub head: bool,
    /// `false`: tensors that do not fit are skipped (and listed) instead of refused.
    pub strict: bool,
}

impl Default for ModelInit {
    fn default() -> Self {
        Self {
            from: None,
            format: InitFormat::Timm,
            channels: ChannelAdapt::Repeat,
            head: false,
            strict: true,
        }
    }
}

/// `model.init.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InitFormat {
    /// `config.json` + `model.safetensors` as timm writes them.
    #[default]
    Timm,
    /// A checkpoint of one of our runs (its teacher backbone).
    Run,
    /// A scDINO/DINO `.pth` (its teacher backbone).
    Pth,
}

/// `model.init.channels`: the patch embedding of a source with S channels for C channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelAdapt {
    /// timm's `adapt_input_conv`: the source kernels repeated cyclically over the C channels,
    /// scaled by S/C (summed for C = 1).
    #[default]
    Repeat,
    /// Every channel gets the mean kernel, scaled by S/C.
    Mean,
}

/// `model.channels`: one model per channel combination, or one for all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelMode {
    /// scDINO: a combination's channels are the ViT's input channels; one model per entry of
    /// `data.channel_combinations`.
    #[default]
    Fixed,
    /// DINO Bag-of-Channels: one single-channel ViT trained on every channel of every image
    /// as its own image; a combination's feature is its channels' CLS tokens, concatenated.
    Bag,
    /// ChannelViT: one shared single-channel patch projection, a learned embedding per
    /// channel, one token per channel and patch; trained with hierarchical channel sampling.
    Tokens,
}

impl ChannelMode {
    pub fn is_fixed(&self) -> bool {
        *self == ChannelMode::Fixed
    }

    /// One model for every combination (`bag`, `tokens`).
    pub fn is_adaptive(&self) -> bool {
        !self.is_fixed()
    }

    /// The YAML spelling.
    pub fn name(&self) -> &'static str {
        match self {
            ChannelMode::Fixed => "fixed",
            ChannelMode::Bag => "bag",
            ChannelMode::Tokens => "tokens",
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            name: "name_of_model".into(),
            arch: Arch::VitSmall,
            patch_size: 16,
            out_dim: 65536,
            norm_last_layer: true,
            use_bn_in_head: false,
            drop_path_rate: 0.1,
            channels: ChannelMode::Fixed,
            num_register_tokens: 0,
            layer_scale: None,
            pos_embed: PosEmbed::Dino,
            img_size: None,
            channel_embed_std: Self::DEFAULT_CHANNEL_EMBED_STD,
            channel_separate_blocks: 0,
            channel_mixing_blocks: 0,
            init: ModelInit::default(),
            dichavit: crate::DiChaViTSection::default(),
        }
    }
}

impl ModelSection {
    /// The position grid's resolution of a model that does not say (scDINO's, DINO's).
    pub const DEFAULT_IMG_SIZE: usize = 224;

    /// The channel embeddings' init scale of ChannelViT / DiChaViT (`channel_embed_std`).
    pub const DEFAULT_CHANNEL_EMBED_STD: f64 = 0.02;

    /// `img_size`, 224 when unset. Unset is not written back (`skip_serializing_if`), so the
    /// recorded config of a run at the default grid is byte for byte what it was before the
    /// key existed.
    pub fn img_size_px(&self) -> usize {
        self.img_size.unwrap_or(Self::DEFAULT_IMG_SIZE)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    VitTiny,
    VitSmall,
    VitBase,
    /// ViT-L: width 1024, 24 blocks, 16 heads (DINOv2's ViT-L/14).
    VitLarge,
}

impl Arch {
    /// The number of transformer blocks of the preset.
    pub fn depth(&self) -> usize {
        match self {
            Arch::VitLarge => 24,
            _ => 12,
        }
    }

    /// The YAML spelling.
    pub fn name(&self) -> &'static str {
        match self {
            Arch::VitTiny => "vit_tiny",
            Arch::VitSmall => "vit_small",
            Arch::VitBase => "vit_base",
            Arch::VitLarge => "vit_large",
        }
    }
}
