//! scDINO's multi-crop augmentation (`DataAugmentationDINO` for
//! multi-channel images) on plain `f32` C×H×W buffers.
//!
//! No libtorch here except in [`device`]: the rest runs in the loader's worker threads.
//! Everything
//! works on [`crate::data::ImageChw`] or on caller-provided slices, with
//! reusable scratch buffers, so a worker allocates nothing per sample once
//! warmed up.
//!
//! * [`rng`]: [`SampleRng`] (xoshiro256++) derived from
//!   [`SampleKey`] `(seed, epoch, index)` and a stream (the crop number), so
//!   augmentations do not depend on thread timing.
//! * [`ops`]: the operations with explicit parameters, each equal to its
//!   torchvision/PyTorch counterpart (tested against torchvision 0.28 to
//!   1e-5): [`resized_crop`] (crop + `F.interpolate(bicubic,
//!   align_corners=False)`, **no antialias, no clamping** — torchvision
//!   0.9.1's behaviour that scDINO trained with; torchvision ≥ 0.17 would
//!   antialias when downsampling, we deliberately do not), [`hflip`],
//!   [`vflip`], [`adjust_brightness`] (one factor per channel, clamp to
//!   [0, 1]), [`gaussian_blur`] (5×5, reflect padding), [`solarize`]
//!   (`v > t → 1 − v`), [`normalize`].
//! * [`params`]: torchvision's `RandomResizedCrop.get_params`, including
//!   Python's round-half-to-even and the centred fallback.
//! * [`multicrop`]: [`MultiCropAugment`], the per-crop pipeline with scDINO's
//!   probabilities, returning crops `[global1, global2, local1..N]`.
//! * [`device`]: [`DeviceAugment`], the same augmentation as batched tensor operations on
//!   the training device (`augment.augment_on: device`), with parameters from the same
//!   sampler and keys.

pub mod device;
pub mod multicrop_augment;
pub mod ops;
pub mod params;
pub mod resize;
pub mod rng;

pub use device::DeviceAugment;
pub use multicrop_augment::{
    AugmentOps, AugmentScratch, CropParams, CropPolicy, MultiCropAugment, MultiCropConfig, BLUR_P,
    BLUR_SIGMA_RANGE, BRIGHTNESS_P, BRIGHTNESS_RANGE, FLIP_P, SOLARIZE_P, SOLARIZE_THRESHOLD,
};
pub use ops::{
    adjust_brightness, gaussian_blur, gaussian_kernel5, hflip, normalize, resized_crop,
    resized_crop_hw, solarize, vflip, Dims,
};
pub use params::{crop_size_for_attempt, fallback_crop, random_resized_crop_params, SCDINO_RATIO};
pub use resize::{resized_crop_into, CropRect, ResizeScratch};
pub use rng::{SampleKey, SampleRng};

/// Errors of the augmentation entry points (invalid configuration or
/// mismatched buffers; the operations themselves cannot fail).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AugmentError {
    #[error("invalid augmentation config: {0}")]
    InvalidConfig(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("image is empty")]
    EmptyImage,
    #[error("{what}: expected {expected} channels, got {got}")]
    ChannelMismatch {
        what: String,
        expected: usize,
        got: usize,
    },
    #[error("{what}: expected {expected} values, got {got}")]
    BufferSize {
        what: String,
        expected: usize,
        got: usize,
    },
    #[error("crop {rect:?} does not fit in a {height}×{width} image")]
    CropOutside {
        rect: CropRect,
        height: usize,
        width: usize,
    },
}
