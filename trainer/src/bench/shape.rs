//! The flags `trainer bench model` and `trainer bench step` share: the network and the
//! multi-crop batch they time and how many passes they time, declared once so both
//! benchmarks (and the PyTorch peers beside them) are asked for a shape the same way.
use super::parse_arch;
use crate::config::Arch;

/// The timed network, its batch of crops, and the timing loop's length.
#[derive(Debug, Clone, clap::Args)]
pub struct BatchShape {
    #[arg(long, value_parser = parse_arch, default_value = "vit_small")]
    pub arch: Arch,
    #[arg(long, default_value_t = 16)]
    pub patch: usize,
    #[arg(long, default_value_t = 5)]
    pub channels: usize,
    /// Images per crop (the per-GPU batch); imgs/s counts these per step.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    #[arg(long, default_value_t = 8)]
    pub local_crops: usize,
    #[arg(long, default_value_t = 65536)]
    pub out_dim: usize,
    #[arg(long, default_value_t = 2)]
    pub threads: i32,
    /// Untimed passes before the timed ones.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Timed passes (their median is reported).
    #[arg(long, default_value_t = 3)]
    pub iters: usize,
}
