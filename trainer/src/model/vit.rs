//! Vision Transformer backbone as in DINO / scDINO (`vision_transformer.py`): pre-norm blocks,
//! a CLS token, learned position embeddings interpolated bicubically for other input sizes.
//! With `channel_tokens` the patches are ChannelViT's instead (Bao et al., ICLR 2024): every
//! channel is cut into patches by one shared single-channel projection, a learned embedding
//! per channel is added, and the position embedding is shared by the channels, so an image
//! with k of the model's channels gives k·N patch tokens and any subset of channels is a valid
//! input. Variable names mirror the PyTorch state dicts (DINO's; ChannelViT's
//! `patch_embed.channel_embed`) so checkpoints load by name.
use super::init::{orthogonal_rows, pytorch_default_uniform, trunc_normal_};
use super::pos_embed::{resample, PosResample};
use super::units::{module_name, names, Unit, UnitKind};
use crate::config::Arch;
use std::sync::Arc;
use tch::{nn, nn::Module, Kind, Tensor};

/// Sizes of a ViT; `Arch` picks the width/depth presets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VitConfig {
    pub embed_dim: i64,
    pub depth: i64,
    pub num_heads: i64,
    pub mlp_ratio: f64,
    pub patch_size: i64,
    pub in_chans: i64,
    /// The training resolution that fixes the number of position embeddings.
    pub img_size: i64,
    pub drop_path_rate: f64,
    /// ChannelViT tokens: `in_chans` is the number of channels the model knows (one
    /// channel embedding each), an input may hold any subset of them.
    pub channel_tokens: bool,
    /// DINOv2's register tokens, inserted after the CLS token (no position embedding).
    pub num_register_tokens: i64,
    /// DINOv2's `mask_token` (iBOT): the embedding a masked patch is replaced by. Only models
    /// trained with iBOT have the parameter, so scDINO's stays as it was.
    pub mask_token: bool,
    /// DiChaViT's learnable proxy per channel (`patch_embed.channel_emb_proxies`, `[C, D]`),
    /// only in models trained with its channel diversification loss (channel tokens only).
    pub channel_proxies: bool,
    /// LayerScale (CaiT; DINOv2's `ls1.gamma`, `ls2.gamma`): each residual branch scaled per
    /// channel by a learned vector initialised to this value. None: no LayerScale (DINO).
    pub layer_scale: Option<f64>,
    /// timm's `no_embed_class` (DINOv2's layout): `pos_embed` holds the patch positions only
    /// (`[1, N, D]`) and the class token gets none. Otherwise `[1, 1 + N, D]`, DINO's.
    pub no_embed_class: bool,
    /// Whose code the position embeddings are resampled with for other input sizes.
    pub pos_resample: PosResample,
    /// Channel tokens: the standard deviation the channel embeddings start at
    /// (`model.channel_embed_std`; init only).
    pub channel_embed_std: f64,
    /// Channel tokens: the first N blocks attend within a channel
    /// (`model.channel_separate_blocks`, see [`VisionTransformer::block_masks`]).
    pub channel_separate_blocks: i64,
    /// Channel tokens: the N blocks after the separate ones attend within a position
    /// (`model.channel_mixing_blocks`, see [`VisionTransformer::block_masks`]).
    pub channel_mixing_blocks: i64,
}

impl VitConfig {
    pub fn new(arch: Arch, patch_size: usize, in_chans: usize) -> Self {
        let (embed_dim, depth, num_heads) = match arch {
            Arch::VitTiny => (192, 12, 3),
            Arch::VitSmall => (384, 12, 6),
            Arch::VitBase => (768, 12, 12),
            Arch::VitLarge => (1024, 24, 16),
        };
        Self {
            embed_dim,
            depth,
            num_heads,
            mlp_ratio: 4.0,
            patch_size: patch_size as i64,
            in_chans: in_chans as i64,
            img_size: 224,
            drop_path_rate: 0.0,
            channel_tokens: false,
            num_register_tokens: 0,
            mask_token: false,
            channel_proxies: false,
            layer_scale: None,
            no_embed_class: false,
            pos_resample: PosResample::Dino,
            channel_embed_std: 0.02,
            channel_separate_blocks: 0,
            channel_mixing_blocks: 0,
        }
    }

    /// The number of position embeddings (the class position included unless
    /// `no_embed_class`).
    pub fn num_pos(&self) -> i64 {
        self.grid() * self.grid() + i64::from(!self.no_embed_class)
    }

    pub fn with_mask_token(mut self) -> Self {
        self.mask_token = true;
        self
    }

    pub fn with_registers(mut self, n: usize) -> Self {
        self.num_register_tokens = n as i64;
        self
    }

    pub fn with_channel_proxies(mut self) -> Self {
        self.channel_proxies = true;
        self
    }

    pub fn with_channel_tokens(mut self) -> Self {
        self.channel_tokens = true;
        self
    }

    pub fn with_drop_path(mut self, rate: f64) -> Self {
        self.drop_path_rate = rate;
        self
    }

    /// Patches per side at the training resolution.
    pub fn grid(&self) -> i64 {
        self.img_size / self.patch_size
    }
}

/// `nn.Linear` with DINO's init: trunc_normal(std=.02) weight, zero bias.
pub(crate) fn linear(p: nn::Path, in_dim: i64, out_dim: i64) -> nn::Linear {
    let ws = p.var("weight", &[out_dim, in_dim], nn::Init::Const(0.0));
    trunc_normal_(&ws, 0.02);
    let bs = p.var("bias", &[out_dim], nn::Init::Const(0.0));
    nn::Linear { ws, bs: Some(bs) }
}

pub(crate) fn layer_norm(p: nn::Path, dim: i64) -> nn::LayerNorm {
    nn::layer_norm(
        p,
        vec![dim],
        nn::LayerNormConfig {
            eps: 1e-6,
            ..Default::default()
        },
    )
}

/// Splits an image into non-overlapping patches and projects each to `embed_dim`.
#[derive(Debug)]
pub struct PatchEmbed {
    weight: Tensor,
    bias: Tensor,
    patch_size: i64,
    name: String,
}

impl PatchEmbed {
    fn new(p: nn::Path, cfg: &VitConfig) -> Self {
        // The conv keeps PyTorch's default init: DINO's `_init_weights` only touches Linear/LayerNorm.
        let fan_in = cfg.in_chans * cfg.patch_size * cfg.patch_size;
        let name = module_name(&p);
        let p = p / "proj";
        let weight = p.var(
            "weight",
            &[cfg.embed_dim, cfg.in_chans, cfg.patch_size, cfg.patch_size],
            pytorch_default_uniform(fan_in),
        );
        let bias = p.var("bias", &[cfg.embed_dim], pytorch_default_uniform(fan_in));
        Self {
            weight,
            bias,
            patch_size: cfg.patch_size,
            name,
        }
    }

    fn param_names(&self) -> Vec<String> {
        names(&self.name, &["proj.weight", "proj.bias"])
    }

    /// `[B, C, H, W]` → `[B, (H/P)·(W/P), D]`
    fn forward(&self, x: &Tensor) -> Tensor {
        let p = [self.patch_size, self.patch_size];
        x.conv2d(&self.weight, Some(&self.bias), p, [0, 0], [1, 1], 1)
            .flatten(2, -1)
            .transpose(1, 2)
    }
}

/// Backbone tensors that only training reads: iBOT's `mask_token` (it replaces masked
/// patches) and DiChaViT's `patch_embed.channel_emb_proxies` (its channel loss's targets). A
/// checkpoint may hold them; no inference network (ours or timm's) has them, and a source
/// for `model.init` need not.
pub const TRAINING_ONLY: [&str; 2] = ["mask_token", "patch_embed.channel_emb_proxies"];

/// ChannelViT's `PatchEmbedPerChannel`: one projection of single-channel patches shared by
/// every channel, plus a learned offset per channel (`channel_embed`). Both keep ChannelViT's
/// shapes (`proj` is its `Conv3d` with kernel `(1, P, P)`, weight `[D, 1, 1, P, P]`;
/// `channel_embed` is `[1, D, C, 1, 1]`), so its state dicts load by name; the projection runs
/// as the equivalent `Conv2d` over single-channel images.
#[derive(Debug)]
pub struct ChannelPatchEmbed {
    weight: Tensor,
    bias: Tensor,
    channel_embed: Tensor,
    /// DiChaViT's `channel_emb_proxies` `[C, D]`: what the channel diversification loss
    /// classifies each channel embedding to (training only: inference never reads them).
    channel_emb_proxies: Option<Tensor>,
    patch_size: i64,
    name: String,
}

impl ChannelPatchEmbed {
    fn new(p: nn::Path, cfg: &VitConfig) -> Self {
        let fan_in = cfg.patch_size * cfg.patch_size;
        let name = module_name(&p);
        let proj = &p / "proj";
        let weight = proj.var(
            "weight",
            &[cfg.embed_dim, 1, 1, cfg.patch_size, cfg.patch_size],
            pytorch_default_uniform(fan_in),
        );
        let bias = proj.var("bias", &[cfg.embed_dim], pytorch_default_uniform(fan_in));
        let channel_embed = p.var(
            "channel_embed",
            &[1, cfg.embed_dim, cfg.in_chans, 1, 1],
            nn::Init::Const(0.0),
        );
        // DiChaViT: orthogonal channel embeddings (distinct channels start distinguishable),
        // each as long as a trunc-normal row of `channel_embed_std` on average.
        let rows = orthogonal_rows(
            cfg.in_chans,
            cfg.embed_dim,
            cfg.channel_embed_std * (cfg.embed_dim as f64).sqrt(),
            channel_embed.device(),
        );
        tch::no_grad(|| {
            channel_embed
                .shallow_clone()
                .copy_(
                    &rows
                        .transpose(0, 1)
                        .reshape([1, cfg.embed_dim, cfg.in_chans, 1, 1]),
                )
        });
        // DiChaViT: torch.randn(in_chans, embed_dim) / 8.
        let channel_emb_proxies = cfg.channel_proxies.then(|| {
            p.var(
                "channel_emb_proxies",
                &[cfg.in_chans, cfg.embed_dim],
                nn::Init::Randn {
                    mean: 0.0,
                    stdev: 0.125,
                },
            )
        });
        Self {
            weight,
            bias,
            channel_embed,
            channel_emb_proxies,
            patch_size: cfg.patch_size,
            name,
        }
    }

    /// The projection runs before the channel embedding is added.
    fn param_names(&self) -> Vec<String> {
        let mut leaves = vec!["proj.weight", "proj.bias", "channel_embed"];
        if self.channel_emb_proxies.is_some() {
            leaves.push("channel_emb_proxies");
        }
        names(&self.name, &leaves)
    }

    /// Every channel's embedding, `[C, D]` (row c: channel c's; the parameter itself, so a
    /// loss on it reaches `channel_embed`).
    pub fn channel_embeddings(&self) -> Tensor {
        let d = self.weight.size()[0];
        self.channel_embed.reshape([d, -1]).transpose(0, 1)
    }

    /// DiChaViT's proxies `[C, D]`, when the model was built with them.
    pub fn proxies(&self) -> Option<&Tensor> {
        self.channel_emb_proxies.as_ref()
    }

    /// The shared projection alone, before any channel embedding: `x` `[B, k, H, W]` →
    /// `[B, k, (H/P)·(W/P), D]` (DiChaViT's token diversification loss reads these).
    pub fn project(&self, x: &Tensor) -> Tensor {
        let k = x.size()[1];
        let p = [self.patch_size, self.patch_size];
        let d = self.weight.size()[0];
        let weight = self
            .weight
            .reshape([d, 1, self.patch_size, self.patch_size]);
        let y =
            x.flatten(0, 1)
                .unsqueeze(1)
                .conv2d(&weight, Some(&self.bias), p, [0, 0], [1, 1], 1);
        // [B·k, D, h', w'] → [B, k, n, D].
        y.flatten(2, 3).unflatten(0, [-1, k]).transpose(2, 3)
    }

    /// `x`: `[B, k, H, W]` holding the model's channels `channels` (k indices, in the order of
    /// x's channels) → `[B, k·(H/P)·(W/P), D]`, channel-major (all patches of the first channel,
    /// then the next), as ChannelViT orders them.
    /// `channels`: the model's channel of each input channel; None: all of them, in order.
    fn forward(&self, x: &Tensor, channels: Option<&ChannelIndex>) -> Tensor {
        let k = x.size()[1];
        let d = self.weight.size()[0];
        // [B, k, n, D], plus channel c's embedding on each of its tokens.
        let tokens = self.project(x);
        let embed = self.channel_embed.reshape([d, -1]);
        let embed = match channels {
            Some(ChannelIndex::Run { first, len }) => embed.narrow(1, *first, *len),
            Some(ChannelIndex::List(index)) => embed.index_select(1, index),
            None => {
                assert_eq!(embed.size()[1], k, "the input holds every model channel");
                embed
            }
        };
        let embed = embed.transpose(0, 1).reshape([1, k, 1, d]);
        (tokens + embed).flatten(1, 2)
    }
}

/// Which of the model's channel embeddings an input's channels take.
enum ChannelIndex {
    /// Consecutive channels `first..first + len`: a slice of the embeddings, no index tensor.
    /// Every channel and each channel alone (the TorchScript export's passes, `joint_and_alone`)
    /// are runs, so a trace of them holds no index tensor made on the host, whose device the
    /// trace would fix.
    Run { first: i64, len: i64 },
    /// Any other list, on the input's device.
    List(Tensor),
}

impl ChannelIndex {
    fn of(channels: &[i64], x: &Tensor) -> Self {
        let first = channels[0];
        if channels.iter().zip(first..).all(|(c, want)| *c == want) {
            ChannelIndex::Run {
                first,
                len: channels.len() as i64,
            }
        } else {
            ChannelIndex::List(Tensor::from_slice(channels).to_device(x.device()))
        }
    }
}

/// `0..n` (int64) on `like`'s device (`like` not empty), made from `like` by ops that name no
/// device: a factory (`arange`, `full`) in a traced forward records the tracing device, and
/// the TorchScript export is meant to run wherever `map_location` puts it.
fn arange_on(like: &Tensor, n: i64) -> Tensor {
    like.flatten(0, -1)
        .narrow(0, 0, 1)
        .ones_like()
        .expand([n], false)
        .cumsum(0, Kind::Int64)
        - 1
}

/// How images become patch tokens: DINO's patch embedding over all input channels, or
/// ChannelViT's per-channel tokens.
#[derive(Debug)]
enum Tokenizer {
    Image(PatchEmbed),
    PerChannel(ChannelPatchEmbed),
}

impl Tokenizer {
    fn param_names(&self) -> Vec<String> {
        match self {
            Tokenizer::Image(e) => e.param_names(),
            Tokenizer::PerChannel(e) => e.param_names(),
        }
    }
}

/// Multi-head self-attention with one fused `qkv` projection.
#[derive(Debug)]
pub struct Attention {
    qkv: nn::Linear,
    proj: nn::Linear,
    num_heads: i64,
    name: String,
}

impl Attention {
    fn new(p: nn::Path, dim: i64, num_heads: i64) -> Self {
        Self {
            qkv: linear(&p / "qkv", dim, 3 * dim),
            proj: linear(&p / "proj", dim, dim),
            num_heads,
            name: module_name(&p),
        }
    }

    fn param_names(&self) -> Vec<String> {
        names(
            &self.name,
            &["qkv.weight", "qkv.bias", "proj.weight", "proj.bias"],
        )
    }

    /// `[B, N, D]` → q, k, v each `[B, heads, N, D/heads]`. Shapes are split and merged
    /// without naming B or N (`unflatten`, `flatten`), so a traced forward keeps them free.
    fn qkv(&self, x: &Tensor) -> (Tensor, Tensor, Tensor) {
        let d = x.size()[2];
        let qkv = self
            .qkv
            .forward(x)
            .unflatten(-1, [3, self.num_heads, d / self.num_heads])
            .permute([2, 0, 3, 1, 4]);
        (qkv.get(0), qkv.get(1), qkv.get(2))
    }

    /// `mask`: `[N, N]` bool, true where a token (row) may attend to another (column).
    fn forward(&self, x: &Tensor, mask: Option<&Tensor>) -> Tensor {
        let (q, k, v) = self.qkv(x);
        // Fused kernel; its default scale is head_dim^-0.5, as in DINO.
        let out = Tensor::scaled_dot_product_attention(&q, &k, &v, mask, 0.0, false, None, false);
        self.proj.forward(&out.transpose(1, 2).flatten(2, 3))
    }

    /// softmax(q·kᵀ·scale): `[B, heads, N, N]`, for attention maps; where `mask` forbids a
    /// pair its weight is 0, as in [`Attention::forward`].
    fn attention_weights(&self, x: &Tensor, mask: Option<&Tensor>) -> Tensor {
        let (q, k, _) = self.qkv(x);
        let head_dim = q.size()[3] as f64;
        let scores = q.matmul(&k.transpose(-2, -1)) * head_dim.powf(-0.5);
        let scores = match mask {
            Some(m) => scores.masked_fill(&m.logical_not(), f64::NEG_INFINITY),
            None => scores,
        };
        scores.softmax(-1, Kind::Float)
    }
}

#[derive(Debug)]
pub struct Mlp {
    fc1: nn::Linear,
    fc2: nn::Linear,
    name: String,
}

impl Mlp {
    fn new(p: nn::Path, dim: i64, hidden: i64) -> Self {
        Self {
            fc1: linear(&p / "fc1", dim, hidden),
            fc2: linear(&p / "fc2", hidden, dim),
            name: module_name(&p),
        }
    }

    fn param_names(&self) -> Vec<String> {
        names(
            &self.name,
            &["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
        )
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.fc2.forward(&self.fc1.forward(x).gelu("none"))
    }
}

/// timm's and DINOv2's `LayerScale`: the branch times a learned per-channel `gamma`.
#[derive(Debug)]
pub struct LayerScale {
    gamma: Tensor,
}

impl LayerScale {
    fn new(p: nn::Path, dim: i64, init: f64) -> Self {
        Self {
            gamma: p.var("gamma", &[dim], nn::Init::Const(init)),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x * &self.gamma
    }
}

/// An optional LayerScale: the identity without one.
fn scaled(ls: &Option<LayerScale>, x: Tensor) -> Tensor {
    match ls {
        Some(ls) => ls.forward(&x),
        None => x,
    }
}

/// Pre-norm transformer block: x + DropPath(LS1(Attn(LN(x)))), then
/// x + DropPath(LS2(MLP(LN(x)))), the LayerScales only where the model has them.
#[derive(Debug)]
pub struct Block {
    norm1: nn::LayerNorm,
    attn: Attention,
    ls1: Option<LayerScale>,
    norm2: nn::LayerNorm,
    mlp: Mlp,
    ls2: Option<LayerScale>,
    drop_path: f64,
    name: String,
}

impl Block {
    fn new(p: nn::Path, cfg: &VitConfig, drop_path: f64) -> Self {
        let d = cfg.embed_dim;
        Self {
            norm1: layer_norm(&p / "norm1", d),
            attn: Attention::new(&p / "attn", d, cfg.num_heads),
            ls1: cfg.layer_scale.map(|v| LayerScale::new(&p / "ls1", d, v)),
            norm2: layer_norm(&p / "norm2", d),
            mlp: Mlp::new(&p / "mlp", d, (d as f64 * cfg.mlp_ratio) as i64),
            ls2: cfg.layer_scale.map(|v| LayerScale::new(&p / "ls2", d, v)),
            drop_path,
            name: module_name(&p),
        }
    }

    fn param_names(&self) -> Vec<String> {
        let mut out = names(&self.name, &["norm1.weight", "norm1.bias"]);
        out.extend(self.attn.param_names());
        if self.ls1.is_some() {
            out.extend(names(&self.name, &["ls1.gamma"]));
        }
        out.extend(names(&self.name, &["norm2.weight", "norm2.bias"]));
        out.extend(self.mlp.param_names());
        if self.ls2.is_some() {
            out.extend(names(&self.name, &["ls2.gamma"]));
        }
        out
    }

    /// `mask`: the attention mask of this block (None: every token attends to every token).
    fn forward_t(&self, x: &Tensor, train: bool, mask: Option<&Tensor>) -> Tensor {
        let attn = scaled(&self.ls1, self.attn.forward(&self.norm1.forward(x), mask));
        let x = x + drop_path(&attn, self.drop_path, train);
        let mlp = scaled(&self.ls2, self.mlp.forward(&self.norm2.forward(&x)));
        &x + drop_path(&mlp, self.drop_path, train)
    }
}

/// `param` (`[1, K, D]`) as a `[B, K, D]` view for the batch of `like` (`[B, N, D]`). The batch
/// size comes from a tensor, not a Rust integer, so a traced forward (TorchScript export,
/// `export/torchscript.rs`) takes any batch size instead of the one it was traced with.
fn batch_expand(param: &Tensor, like: &Tensor) -> Tensor {
    let batch = like.narrow(1, 0, 1).narrow(2, 0, 1);
    Tensor::broadcast_tensors(&[param, &batch]).swap_remove(0)
}

/// Stochastic depth: drops the whole residual branch per sample, rescaling the survivors.
fn drop_path(x: &Tensor, rate: f64, train: bool) -> Tensor {
    if rate == 0.0 || !train {
        return x.shallow_clone();
    }
    let keep = 1.0 - rate;
    let mut shape = vec![x.size()[0]];
    shape.resize(x.dim(), 1);
    let mask = (Tensor::rand(&shape, (x.kind(), x.device())) + keep).floor();
    x / keep * mask
}

/// Callbacks around each transformer block of a training forward, for FSDP: it all-gathers a
/// block's parameters in [`BlockHooks::before`] and frees them again (registering pre- and
/// post-backward gradient hooks on the block's input and output) in [`BlockHooks::after`].
pub trait BlockHooks: Send + Sync {
    /// Block `block` is about to run.
    fn before(&self, block: usize);
    /// Block `block` ran on `input` and produced `output`.
    fn after(&self, block: usize, input: &Tensor, output: &Tensor);
}

/// An optional [`BlockHooks`] (a wrapper so the backbone can keep deriving `Debug`).
#[derive(Default, Clone)]
struct HookSlot(Option<Arc<dyn BlockHooks>>);

impl std::fmt::Debug for HookSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Some(..)" } else { "None" })
    }
}

/// The attention masks of one forward ([`VisionTransformer::block_masks`]): which blocks
/// attend within a channel, which within a position, and the masks themselves.
pub struct BlockMasks {
    separate_blocks: usize,
    mixing_blocks: usize,
    separate: Option<Tensor>,
    mixing: Option<Tensor>,
}

impl BlockMasks {
    /// The mask of block `i`: within a channel for the first `channel_separate_blocks`,
    /// within a position for the `channel_mixing_blocks` after them, None (every token) after.
    pub fn of_block(&self, i: usize) -> Option<&Tensor> {
        if i < self.separate_blocks {
            self.separate.as_ref()
        } else if i < self.separate_blocks + self.mixing_blocks {
            self.mixing.as_ref()
        } else {
            None
        }
    }
}

/// The ViT backbone; its output is the CLS token after the final LayerNorm.
#[derive(Debug)]
pub struct VisionTransformer {
    patch_embed: Tokenizer,
    cls_token: Tensor,
    pos_embed: Tensor,
    /// `[1, R, D]` (DINOv2's name and shape), absent without registers.
    register_tokens: Option<Tensor>,
    /// `[1, D]` (DINOv2's name and shape), absent unless trained with iBOT.
    mask_token: Option<Tensor>,
    blocks: Vec<Block>,
    norm: nn::LayerNorm,
    cfg: VitConfig,
    hooks: HookSlot,
    name: String,
}

impl VisionTransformer {
    pub fn new(p: nn::Path, cfg: VitConfig) -> Self {
        let d = cfg.embed_dim;
        let patch_embed = if cfg.channel_tokens {
            Tokenizer::PerChannel(ChannelPatchEmbed::new(&p / "patch_embed", &cfg))
        } else {
            Tokenizer::Image(PatchEmbed::new(&p / "patch_embed", &cfg))
        };
        let cls_token = p.var("cls_token", &[1, 1, d], nn::Init::Const(0.0));
        let pos_embed = p.var("pos_embed", &[1, cfg.num_pos(), d], nn::Init::Const(0.0));
        trunc_normal_(&pos_embed, 0.02);
        trunc_normal_(&cls_token, 0.02);
        // DINOv2: nn.init.normal_(self.register_tokens, std=1e-6).
        let register_tokens = (cfg.num_register_tokens > 0).then(|| {
            p.var(
                "register_tokens",
                &[1, cfg.num_register_tokens, d],
                nn::Init::Randn {
                    mean: 0.0,
                    stdev: 1e-6,
                },
            )
        });
        // DINOv2: nn.Parameter(torch.zeros(1, embed_dim)).
        let mask_token = cfg
            .mask_token
            .then(|| p.var("mask_token", &[1, d], nn::Init::Const(0.0)));
        let depth = cfg.depth;
        // Per-block drop rates: `torch.linspace(0, drop_path_rate, depth)` in float32, as DINO
        // computes them; the f32 rounding of each rate reaches the outputs through 1/keep.
        let rates = Vec::<f32>::try_from(&Tensor::linspace(
            0.0,
            cfg.drop_path_rate,
            depth,
            (Kind::Float, tch::Device::Cpu),
        ))
        .expect("linspace yields floats");
        let blocks = (0..depth)
            .map(|i| Block::new(&p / "blocks" / i, &cfg, f64::from(rates[i as usize])))
            .collect();
        let norm = layer_norm(&p / "norm", d);
        Self {
            patch_embed,
            cls_token,
            pos_embed,
            register_tokens,
            mask_token,
            blocks,
            norm,
            cfg,
            hooks: HookSlot::default(),
            name: module_name(&p),
        }
    }

    /// ChannelViT's patch embedding (channel tokens only).
    pub fn channel_patch_embed(&self) -> Option<&ChannelPatchEmbed> {
        match &self.patch_embed {
            Tokenizer::PerChannel(e) => Some(e),
            Tokenizer::Image(_) => None,
        }
    }

    /// The backbone's units in forward order: the embeddings (tokens, then the class token
    /// and position embedding added to them), each block, the final norm.
    pub fn units(&self) -> Vec<Unit> {
        let mut embeddings = self.patch_embed.param_names();
        embeddings.extend(names(&self.name, &["cls_token", "pos_embed"]));
        if self.register_tokens.is_some() {
            embeddings.extend(names(&self.name, &["register_tokens"]));
        }
        if self.mask_token.is_some() {
            embeddings.extend(names(&self.name, &["mask_token"]));
        }
        let mut units = vec![Unit {
            kind: UnitKind::Embeddings,
            name: self.name.clone(),
            params: embeddings,
        }];
        units.extend(self.blocks.iter().enumerate().map(|(i, b)| Unit {
            kind: UnitKind::Block(i),
            name: b.name.clone(),
            params: b.param_names(),
        }));
        let norm = format!("{}.norm", self.name);
        units.push(Unit {
            kind: UnitKind::Norm,
            params: names(&norm, &["weight", "bias"]),
            name: norm,
        });
        units
    }

    /// Installs (or with `None` removes) the callbacks [`VisionTransformer::forward_t`] makes
    /// around every block.
    pub fn set_block_hooks(&mut self, hooks: Option<Arc<dyn BlockHooks>>) {
        self.hooks = HookSlot(hooks);
    }

    pub fn depth(&self) -> usize {
        self.blocks.len()
    }

    pub fn config(&self) -> &VitConfig {
        &self.cfg
    }

    /// The position embeddings for an `h × w`-pixel input: the class position (None with
    /// `no_embed_class`) and the patch positions `[1, patches, D]`, unchanged at the training
    /// grid, otherwise resampled as the source's code does ([`PosResample`]).
    pub fn interpolate_pos_encoding(&self, h: i64, w: i64) -> (Option<Tensor>, Tensor) {
        let n = self.pos_embed.size()[1];
        let (class_pos, patch_pos) = if self.cfg.no_embed_class {
            (None, self.pos_embed.shallow_clone())
        } else {
            (
                Some(self.pos_embed.narrow(1, 0, 1)),
                self.pos_embed.narrow(1, 1, n - 1),
            )
        };
        let p = self.cfg.patch_size;
        let patch_pos = resample(&patch_pos, self.cfg.pos_resample, h / p, w / p);
        (class_pos, patch_pos)
    }

    /// The `pos_embed` tensor (this model's layout) for `h × w`-pixel inputs.
    pub fn pos_embed_for(&self, h: i64, w: i64) -> Tensor {
        match self.interpolate_pos_encoding(h, w) {
            (Some(class_pos), patch_pos) => Tensor::cat(&[class_pos, patch_pos], 1),
            (None, patch_pos) => patch_pos,
        }
    }

    /// `[B, C, H, W]` → `[B, 1 + R + patches, D]`: CLS token prepended, positions added,
    /// then the R register tokens inserted after the CLS token (DINOv2's order, no position).
    /// With channel tokens, `x`'s channels are the model's channels `channels` (all of them,
    /// in order, when None), and each channel's patches get the same position embeddings.
    pub fn prepare_tokens(&self, x: &Tensor, channels: Option<&[i64]>) -> Tensor {
        self.prepare_tokens_with_masks(x, channels, None)
    }

    /// [`VisionTransformer::prepare_tokens`] with the patches where `masks` (`[B, patches]`,
    /// bool) is set replaced by the mask token before positions are added (DINOv2's
    /// `prepare_tokens_with_masks`, iBOT's student input).
    pub fn prepare_tokens_with_masks(
        &self,
        x: &Tensor,
        channels: Option<&[i64]>,
        masks: Option<&Tensor>,
    ) -> Tensor {
        let t = self.prepare_tokens_without_registers(x, channels, masks);
        match &self.register_tokens {
            None => t,
            Some(r) => {
                let n = t.size()[1];
                Tensor::cat(
                    &[
                        t.narrow(1, 0, 1),
                        batch_expand(r, &t),
                        t.narrow(1, 1, n - 1),
                    ],
                    1,
                )
            }
        }
    }

    /// The number of register tokens (after the CLS token in every sequence).
    pub fn num_register_tokens(&self) -> i64 {
        self.cfg.num_register_tokens
    }

    fn prepare_tokens_without_registers(
        &self,
        x: &Tensor,
        channels: Option<&[i64]>,
        masks: Option<&Tensor>,
    ) -> Tensor {
        let (_, c, h, w) = x.size4().expect("images are [B, C, H, W]");
        let masked = |patches: Tensor| match masks {
            None => patches,
            Some(m) => {
                let token = self
                    .mask_token
                    .as_ref()
                    .expect("masks need a model built with a mask token");
                patches.where_self(
                    &m.unsqueeze(-1).logical_not(),
                    &token.to_kind(patches.kind()).unsqueeze(0),
                )
            }
        };
        match &self.patch_embed {
            Tokenizer::Image(embed) => {
                let patches = masked(embed.forward(x));
                let cls = batch_expand(&self.cls_token, &patches);
                match self.interpolate_pos_encoding(h, w) {
                    // DINO: concatenate, then add (one tensor, the same rounding as DINO).
                    (Some(class_pos), patch_pos) => {
                        Tensor::cat(&[cls, patches], 1) + Tensor::cat(&[class_pos, patch_pos], 1)
                    }
                    // timm's no_embed_class: add to the patches, then concatenate.
                    (None, patch_pos) => Tensor::cat(&[cls, patches + patch_pos], 1),
                }
            }
            Tokenizer::PerChannel(embed) => {
                let index = channels.map(|channels| {
                    assert_eq!(
                        channels.len() as i64,
                        c,
                        "the channel list must name each of the input's channels"
                    );
                    ChannelIndex::of(channels, x)
                });
                let patches = masked(embed.forward(x, index.as_ref()));
                let cls = batch_expand(&self.cls_token, &patches);
                let (class_pos, patch_pos) = self.interpolate_pos_encoding(h, w);
                let cls = match class_pos {
                    Some(class_pos) => cls + class_pos,
                    None => cls,
                };
                Tensor::cat(&[cls, patches + patch_pos.repeat([1, c, 1])], 1)
            }
        }
    }

    /// `[B, C, H, W]` → CLS features `[B, D]`.
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        self.forward_channels_t(x, None, train)
    }

    /// [`VisionTransformer::forward_t`] on an input holding the model's channels `channels`
    /// (channel tokens only; None: all of them, in order).
    pub fn forward_channels_t(&self, x: &Tensor, channels: Option<&[i64]>, train: bool) -> Tensor {
        let masks = self.block_masks(x);
        self.blocks_and_norm(self.prepare_tokens(x, channels), train, &masks)
            .select(1, 0)
    }

    /// DINOv2's `x_norm_clstoken` `[B, D]` and `x_norm_patchtokens` `[B, patches, D]`
    /// (registers left out), with the patches where `masks` is set replaced by the mask token
    /// (iBOT: masked for the student, None for the teacher).
    pub fn forward_features_t(
        &self,
        x: &Tensor,
        channels: Option<&[i64]>,
        masks: Option<&Tensor>,
        train: bool,
    ) -> (Tensor, Tensor) {
        let block_masks = self.block_masks(x);
        let t = self.blocks_and_norm(
            self.prepare_tokens_with_masks(x, channels, masks),
            train,
            &block_masks,
        );
        let skip = 1 + self.cfg.num_register_tokens;
        let n = t.size()[1];
        (t.select(1, 0), t.narrow(1, skip, n - skip))
    }

    /// Every block (with the installed hooks around each), then the final norm; `masks`
    /// ([`VisionTransformer::block_masks`]) restrict the attention of the first blocks.
    fn blocks_and_norm(&self, mut t: Tensor, train: bool, masks: &BlockMasks) -> Tensor {
        for (i, block) in self.blocks.iter().enumerate() {
            let mask = masks.of_block(i);
            match &self.hooks.0 {
                Some(h) => {
                    h.before(i);
                    let out = block.forward_t(&t, train, mask);
                    h.after(i, &t, &out);
                    t = out;
                }
                None => t = block.forward_t(&t, train, mask),
            }
        }
        self.norm.forward(&t)
    }

    /// The attention masks of the restricted blocks for the input `x` (`[B, k, H, W]`), each
    /// `[L, L]` bool over the tokens `1 + R + k·n` (CLS, R registers, then the k channels' n
    /// patches each, channel-major), true where a row may attend to a column; the CLS and
    /// register rows attend to everything. The first `channel_separate_blocks` blocks attend
    /// within a channel: a patch token (c, p) attends only to the patch tokens (c, p′) of its
    /// own channel, not even to the CLS and registers (which gather every channel), so those
    /// blocks encode each channel's patches exactly as they would with the channel alone, as
    /// `bag` encodes it (BENCHMARKS.md run 14). The next `channel_mixing_blocks` blocks attend
    /// within a position: (c, p) attends to the tokens (c′, p) of every channel of the input
    /// and to the CLS and registers, reading how the channels meet at each place (run 9).
    /// Built per forward because k changes per step (hierarchical channel sampling) and n with
    /// the crop size. Without channel tokens, or with neither key, no block is restricted.
    pub fn block_masks(&self, x: &Tensor) -> BlockMasks {
        let (separate, mixing) = (
            self.cfg.channel_separate_blocks,
            self.cfg.channel_mixing_blocks,
        );
        let mut masks = BlockMasks {
            separate_blocks: separate as usize,
            mixing_blocks: mixing as usize,
            separate: None,
            mixing: None,
        };
        if !self.cfg.channel_tokens || separate + mixing == 0 {
            return masks;
        }
        let (_, k, h, w) = x.size4().expect("images are [B, C, H, W]");
        let p = self.cfg.patch_size;
        let n = (h / p) * (w / p);
        let special = 1 + self.cfg.num_register_tokens;
        // Each token's channel slot or patch index; −1 for the CLS and register tokens, whose
        // rows attend to everything (and, if `patches_see_special`, whose columns every row
        // sees). Built from the CLS token (on the model's device, never empty, unlike a batch
        // of none) by ops that name no device (`arange_on`), so the TorchScript export's trace
        // follows `map_location`.
        let like = &self.cls_token;
        let free = arange_on(like, special).zeros_like() - 1;
        let restricted = |label: Tensor, patches_see_special: bool| {
            let label = Tensor::cat(&[&free, &label], 0);
            let same = label.unsqueeze(1).eq_tensor(&label.unsqueeze(0));
            let free = label.lt(0);
            let mask = same.logical_or(&free.unsqueeze(1));
            if patches_see_special {
                mask.logical_or(&free.unsqueeze(0))
            } else {
                mask
            }
        };
        if separate > 0 {
            let channel = arange_on(like, k).repeat_interleave_self_int(n, 0, None);
            masks.separate = Some(restricted(channel, false));
        }
        if mixing > 0 {
            masks.mixing = Some(restricted(arange_on(like, n).repeat([k]), true));
        }
        masks
    }

    /// The last block's softmax attention over the CLS and patch tokens, `[B, heads, N, N]`
    /// (inference only). Register tokens are left out (their rows and columns), so the
    /// layout is the same with and without them; with registers a row sums to the attention
    /// it gives the CLS and the patches (below 1).
    pub fn last_selfattention(&self, x: &Tensor) -> Tensor {
        self.last_selfattention_channels(x, None)
    }

    /// [`VisionTransformer::last_selfattention`] for an input holding the model's channels
    /// `channels` (channel tokens: the tokens after the CLS are channel-major).
    pub fn last_selfattention_channels(&self, x: &Tensor, channels: Option<&[i64]>) -> Tensor {
        let mut t = self.prepare_tokens(x, channels);
        let masks = self.block_masks(x);
        let (last, rest) = self
            .blocks
            .split_last()
            .expect("a ViT has at least one block");
        for (i, block) in rest.iter().enumerate() {
            t = block.forward_t(&t, false, masks.of_block(i));
        }
        let last_mask = masks.of_block(rest.len());
        let attn = last
            .attn
            .attention_weights(&last.norm1.forward(&t), last_mask);
        let r = self.cfg.num_register_tokens;
        if r == 0 {
            return attn;
        }
        let n = attn.size()[2];
        let keep: Vec<i64> = std::iter::once(0).chain(1 + r..n).collect();
        let keep = Tensor::from_slice(&keep).to_device(attn.device());
        attn.index_select(2, &keep).index_select(3, &keep)
    }
}
