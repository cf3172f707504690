//! The arithmetic of one training step, counted analytically from the configured ViT, DINO
//! head and multi-crop, so that every logged interval can report achieved FLOP/s and the model
//! FLOPs utilisation (MFU) without a profiler in the loop.
//!
//! Counted as `torch.utils.flop_counter` counts (and as MFU is conventionally defined): two
//! FLOPs per multiply–add of the matrix products (linear layers, the patch-embedding
//! convolution, attention's two batched products); element-wise work (norms, softmax, GELU,
//! the loss) is not counted. The backward pass of a product computes the gradient of its input
//! and of its weight, twice the forward, except the patch embedding whose input (the image)
//! needs no gradient. The teacher runs forward only on the two global crops; the student
//! forward and backward on all crops.
//!
//! The channel-adaptive layouts: `tokens` has k·N patch tokens for k channels (the shared
//! projection runs once per channel and patch), and under hierarchical channel sampling k is
//! uniform on 1..=C, so a step's expected FLOPs are the mean over k (attention grows with k²,
//! so this is not the count at the mean k). `bag` counts per item, one channel of one image
//! (C items per image).
//!
//! iBOT adds the head over the masked patches of the global crops (teacher forward, student
//! forward and backward); the mask token replaces a patch embedding, which costs nothing
//! counted. The number of masked patches is random: a step is counted at its expectation,
//! the masked images times the mean target ratio of their patches (the block masks can fall
//! short of their target, so this is an upper estimate of the heads' share; by how much is not
//! measured).
use crate::config::Config;
use crate::model::channels::for_mode;
use crate::model::{configs_for, ibot_head_config, HeadConfig, VitConfig};

/// FLOPs of one step on one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepFlops {
    pub teacher_forward: f64,
    pub student_forward: f64,
    pub student_backward: f64,
}

impl StepFlops {
    pub fn total(&self) -> f64 {
        self.teacher_forward + self.student_forward + self.student_backward
    }
}

/// Forward FLOPs of the backbone for one image of `size`×`size` pixels, split as (patch
/// embedding, everything after it).
pub fn vit_forward(vit: &VitConfig, size: usize) -> (f64, f64) {
    vit_forward_channels(vit, size, vit.in_chans as usize)
}

/// [`vit_forward`] for an input of `k` channels: with channel tokens, k·N patch tokens from
/// a single-channel projection; otherwise `k` must be the input channels.
pub fn vit_forward_channels(vit: &VitConfig, size: usize, k: usize) -> (f64, f64) {
    let d = vit.embed_dim as f64;
    let p = vit.patch_size as f64;
    let per_channel = (size as f64 / p).floor().powi(2);
    let (patches, proj_chans) = if vit.channel_tokens {
        (k as f64 * per_channel, 1.0)
    } else {
        (per_channel, vit.in_chans as f64)
    };
    let n = patches + 1.0 + vit.num_register_tokens as f64; // + CLS and register tokens
    let embed = 2.0 * patches * d * proj_chans * p * p;
    let hidden = (d * vit.mlp_ratio).floor();
    // qkv (3d) + projection (d) + MLP (2 · hidden), and q·kᵀ and attn·v (n² · d each).
    let per_block = 2.0 * n * d * (3.0 * d + d + 2.0 * hidden) + 4.0 * n * n * d;
    (embed, vit.depth as f64 * per_block)
}

/// Forward FLOPs of the DINO head for one image (the CLS token only).
pub fn head_forward(head: &HeadConfig) -> f64 {
    let (i, h, b, k) = (
        head.in_dim as f64,
        head.hidden_dim as f64,
        head.bottleneck_dim as f64,
        head.out_dim as f64,
    );
    let mlp = if head.nlayers <= 1 {
        i * b
    } else {
        i * h + (head.nlayers - 2).max(0) as f64 * h * h + h * b
    };
    2.0 * (mlp + b * k)
}

/// One step with `batch` images (`bag`: items) per crop on this rank, for a model over
/// `in_chans` channels; the mean over the channel counts the mode's steps hold (for `tokens`
/// the expectation under hierarchical channel sampling).
pub fn step_flops(cfg: &Config, in_chans: usize, batch: usize) -> StepFlops {
    let each: Vec<StepFlops> = for_mode(cfg.model.channels)
        .step_channel_counts(in_chans)
        .into_iter()
        .map(|k| step_flops_on(cfg, in_chans, batch, k))
        .collect();
    let mean = |f: fn(&StepFlops) -> f64| each.iter().map(f).sum::<f64>() / each.len() as f64;
    StepFlops {
        teacher_forward: mean(|s| s.teacher_forward),
        student_forward: mean(|s| s.student_forward),
        student_backward: mean(|s| s.student_backward),
    }
}

/// One step whose crops hold `k` of the model's `in_chans` channels (k = in_chans except for
/// `tokens`).
pub fn step_flops_on(cfg: &Config, in_chans: usize, batch: usize, k: usize) -> StepFlops {
    let (student_vit, student_head) = configs_for(cfg, in_chans, true);
    let (teacher_vit, teacher_head) = configs_for(cfg, in_chans, false);
    let a = &cfg.augment;
    let crops = [
        (2, a.global_crop_size),
        (a.local_crops_number, a.local_crop_size),
    ];
    let b = batch as f64;
    let mut flops = StepFlops {
        teacher_forward: 0.0,
        student_forward: 0.0,
        student_backward: 0.0,
    };
    let k = if teacher_vit.channel_tokens {
        k
    } else {
        teacher_vit.in_chans as usize
    };
    let (embed, rest) = vit_forward_channels(&teacher_vit, a.global_crop_size, k);
    flops.teacher_forward = 2.0 * b * (embed + rest + head_forward(&teacher_head));
    for (count, size) in crops {
        let (embed, rest) = vit_forward_channels(&student_vit, size, k);
        let head = head_forward(&student_head);
        let images = count as f64 * b;
        flops.student_forward += images * (embed + rest + head);
        // The patch embedding's backward computes its weight gradient only.
        flops.student_backward += images * (embed + 2.0 * (rest + head));
    }
    // ChannelViT tokens: a masked position is masked in each of the k channels.
    let token_channels = if teacher_vit.channel_tokens { k } else { 1 };
    let masked = expected_masked_patches(cfg, batch) * token_channels as f64;
    let ibot = ibot_flops(cfg, in_chans, masked);
    flops.teacher_forward += ibot.teacher_forward;
    flops.student_forward += ibot.student_forward;
    flops.student_backward += ibot.student_backward;
    flops
}

/// iBOT's masked patches in one step on one rank, in expectation (0 without iBOT): DINOv2's
/// collate masks ⌊2·B·probability⌋ of the 2·B global-crop images, with target ratios spread
/// evenly over `mask_ratio`.
pub fn expected_masked_patches(cfg: &Config, batch: usize) -> f64 {
    let ibot = &cfg.train.ibot;
    if !ibot.enabled() {
        return 0.0;
    }
    let grid = (cfg.augment.global_crop_size / cfg.model.patch_size) as f64;
    let images = (2.0 * batch as f64 * ibot.mask_probability).floor();
    let mean_ratio = (ibot.mask_ratio[0] + ibot.mask_ratio[1]) / 2.0;
    images * grid * grid * mean_ratio
}

/// The head work of iBOT on `masked` patches: the teacher's forward, the student's forward
/// and backward (its separate head, or the DINO head).
pub fn ibot_flops(cfg: &Config, in_chans: usize, masked: f64) -> StepFlops {
    let mut flops = StepFlops {
        teacher_forward: 0.0,
        student_forward: 0.0,
        student_backward: 0.0,
    };
    if !cfg.train.ibot.enabled() {
        return flops;
    }
    let head = |student: bool| {
        let (vit, head) = configs_for(cfg, in_chans, student);
        head_forward(&ibot_head_config(cfg, &vit, student).unwrap_or(head))
    };
    flops.teacher_forward = masked * head(false);
    flops.student_forward = masked * head(true);
    flops.student_backward = 2.0 * masked * head(true);
    flops
}

/// Achieved FLOP/s and, with a peak, the MFU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Utilisation {
    pub flops_per_second: f64,
    /// Fraction of `train.peak_tflops` (absent when no peak is configured).
    pub mfu: Option<f64>,
}

impl Utilisation {
    /// `steps` steps of `per_step` FLOPs in `seconds`, against `peak_tflops` per rank.
    pub fn measure(per_step: f64, steps: f64, seconds: f64, peak_tflops: Option<f64>) -> Self {
        let flops_per_second = per_step * steps / seconds.max(1e-9);
        Self {
            flops_per_second,
            mfu: peak_tflops.map(|peak| flops_per_second / (peak * 1e12)),
        }
    }
}
