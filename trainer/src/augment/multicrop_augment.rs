//! scDINO's `DataAugmentationDINO` for multi-channel images.
//!
//! Per crop, in this order (`scDINO: pyscripts/main_dino.py L490-577`):
//!
//! | Step | global 1 | global 2 | each local |
//! |---|---|---|---|
//! | RandomResizedCrop (bicubic, ratio 3/4–4/3) | `global_size`, `global_crops_scale` | same | `local_size`, `local_crops_scale` |
//! | horizontal flip | p 0.5 | p 0.5 | p 0.5 |
//! | vertical flip | p 0.5 | p 0.5 | p 0.5 |
//! | brightness, one factor U(0.5, 1.25) per channel, clamp [0, 1] | p 0.8 | p 0.8 | p 0.8 |
//! | Gaussian blur 5×5, σ ~ U(0.1, 1.5) | p 1.0 | p 0.1 | p 0.5 |
//! | solarise (v > 0.5 → 1 − v) | — | p 0.2 | — |
//! | normalise with the dataset mean/std | yes | yes | yes |
//!
//! Randomness: crop `k` of sample `key` draws from `key.rng(k)` only (so
//! streams `0..num_crops` of a [`SampleKey`] belong to this module), in the
//! order crop geometry (torchvision's `get_params`), hflip, vflip, brightness
//! decision then one factor per channel, blur decision then σ, and (crop 1
//! only) the solarisation decision. The comparisons are scDINO's: `<` for
//! flips, brightness and solarisation, `<=` for the blur (so p = 1 always
//! blurs).
//!
//! Implementation: the flips are folded into the resampling tables (exactly
//! `flip(resize(x))`); brightness, solarisation and normalisation are applied
//! to each output row right after the resize (or, if the crop blurs, the
//! blur's vertical pass) computes it; the whole crop pipeline is compiled
//! for AVX-512 and AVX2 and picked at run time.

use std::cell::RefCell;

use super::ops::{brightness_row, gaussian_blur_with, normalize_row, BlurScratch, Dims};
use super::params::{random_resized_crop_params, SCDINO_RATIO};
use super::resize::{resized_crop_into_with, CropRect, ResizeScratch};
use super::rng::SampleKey;
use super::AugmentError;
use crate::data::ImageChw;

/// Probability of each flip.
pub const FLIP_P: f64 = 0.5;
/// Probability of the per-channel brightness change.
pub const BRIGHTNESS_P: f64 = 0.8;
/// Range of the brightness factors.
pub const BRIGHTNESS_RANGE: (f64, f64) = (0.5, 1.25);
/// Blur probability of global crop 1, global crop 2 and each local crop.
pub const BLUR_P: [f64; 3] = [1.0, 0.1, 0.5];
/// Range of the blur σ (used for both axes).
pub const BLUR_SIGMA_RANGE: (f32, f32) = (0.1, 1.5);
/// Solarisation probability of global crop 2 (no other crop solarises).
pub const SOLARIZE_P: f64 = 0.2;
/// Solarisation threshold.
pub const SOLARIZE_THRESHOLD: f32 = 0.5;

/// What the multi-crop augmentation needs to know.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiCropConfig {
    /// Area fraction range of the global crops (scDINO `global_crops_scale`).
    pub global_crops_scale: (f64, f64),
    /// Area fraction range of the local crops (scDINO `local_crops_scale`).
    pub local_crops_scale: (f64, f64),
    /// Side of the two global crops (224 in scDINO).
    pub global_size: usize,
    /// Side of the local crops (96 in scDINO).
    pub local_size: usize,
    /// Number of local crops (8 in scDINO).
    pub local_crops_number: usize,
    /// Dataset mean of each (selected) channel.
    pub mean: Vec<f32>,
    /// Dataset std of each (selected) channel.
    pub std: Vec<f32>,
    /// Which random transforms apply (scDINO: all).
    pub ops: AugmentOps,
}

/// The random transforms that can be switched off (`augment.flips`, ...). A switched-off
/// transform still draws its random numbers, so the other transforms of a sample (and its
/// crops) stay the same whether it is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AugmentOps {
    pub flips: bool,
    pub brightness: bool,
    pub blur: bool,
    pub solarize: bool,
}

impl From<&crate::config::AugmentSection> for AugmentOps {
    fn from(a: &crate::config::AugmentSection) -> Self {
        Self {
            flips: a.flips,
            brightness: a.brightness,
            blur: a.blur,
            solarize: a.solarize,
        }
    }
}

impl Default for AugmentOps {
    /// scDINO: every transform on.
    fn default() -> Self {
        Self {
            flips: true,
            brightness: true,
            blur: true,
            solarize: true,
        }
    }
}

impl MultiCropConfig {
    /// scDINO's argparse defaults, which the published PBMC model and the AWS
    /// runs used: scales (0.4, 1) and (0.05, 0.4), sizes 224 and 96, 8 local
    /// crops. (scDINO's yaml has (0.14, 1) and (0.05, 0.14) instead.)
    pub fn scdino(mean: Vec<f32>, std: Vec<f32>) -> Self {
        Self {
            global_crops_scale: (0.4, 1.0),
            local_crops_scale: (0.05, 0.4),
            global_size: 224,
            local_size: 96,
            local_crops_number: 8,
            mean,
            std,
            ops: AugmentOps::default(),
        }
    }

    fn validate(&self) -> Result<(), AugmentError> {
        let bad = |m: String| Err(AugmentError::InvalidConfig(m));
        for (name, (lo, hi)) in [
            ("global_crops_scale", self.global_crops_scale),
            ("local_crops_scale", self.local_crops_scale),
        ] {
            if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
                return bad(format!(
                    "{name} must satisfy 0 < lo <= hi, got ({lo}, {hi})"
                ));
            }
        }
        if self.global_size == 0 || self.local_size == 0 {
            return bad("crop sizes must be positive".into());
        }
        if self.mean.is_empty() || self.mean.len() != self.std.len() {
            return bad(format!(
                "mean and std need one value per channel, got {} and {}",
                self.mean.len(),
                self.std.len()
            ));
        }
        if let Some(s) = self.std.iter().find(|s| **s == 0.0 || !s.is_finite()) {
            return bad(format!("std values must be non-zero and finite, got {s}"));
        }
        if let Some(m) = self.mean.iter().find(|m| !m.is_finite()) {
            return bad(format!("mean values must be finite, got {m}"));
        }
        Ok(())
    }
}

/// The random choices made for one crop (for tests, logging, replay).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CropParams {
    /// Crop in the input image (torchvision's `(i, j, h, w)`).
    pub rect: CropRect,
    /// Output side.
    pub out_size: usize,
    pub hflip: bool,
    pub vflip: bool,
    /// One factor per channel if the brightness branch fired, else empty.
    pub brightness: Vec<f32>,
    /// σ if the blur branch fired.
    pub blur_sigma: Option<f32>,
    /// Whether solarisation fired (only ever on global crop 2).
    pub solarize: bool,
}

/// Fixed per-crop settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CropPolicy {
    pub size: usize,
    pub scale: (f64, f64),
    pub blur_p: f64,
    pub solarize_p: f64,
}

/// Reusable per-thread buffers of [`MultiCropAugment::apply_into_with`].
#[derive(Debug, Clone, Default)]
pub struct AugmentScratch {
    resize: ResizeScratch,
    blur: BlurScratch,
    params: CropParams,
}

thread_local! {
    static SCRATCH: RefCell<AugmentScratch> = RefCell::new(AugmentScratch::default());
}

/// scDINO's multi-crop augmentation (see the module docs). Immutable and
/// `Sync`: share one across loader threads.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiCropAugment {
    cfg: MultiCropConfig,
}

impl MultiCropAugment {
    pub fn new(cfg: MultiCropConfig) -> Result<Self, AugmentError> {
        cfg.validate()?;
        Ok(Self { cfg })
    }

    pub fn config(&self) -> &MultiCropConfig {
        &self.cfg
    }

    /// 2 + `local_crops_number`.
    pub fn num_crops(&self) -> usize {
        2 + self.cfg.local_crops_number
    }

    /// Number of channels the mean/std describe (the images must match).
    pub fn channels(&self) -> usize {
        self.cfg.mean.len()
    }

    /// Settings of crop `k` (0, 1: global; 2..: local).
    pub fn policy(&self, k: usize) -> CropPolicy {
        assert!(k < self.num_crops(), "crop {k} of {}", self.num_crops());
        match k {
            0 | 1 => CropPolicy {
                size: self.cfg.global_size,
                scale: self.cfg.global_crops_scale,
                blur_p: BLUR_P[k],
                solarize_p: if k == 1 { SOLARIZE_P } else { 0.0 },
            },
            _ => CropPolicy {
                size: self.cfg.local_size,
                scale: self.cfg.local_crops_scale,
                blur_p: BLUR_P[2],
                solarize_p: 0.0,
            },
        }
    }

    /// Number of `f32` values of crop `k` (C·S·S).
    pub fn crop_len(&self, k: usize) -> usize {
        let s = self.policy(k).size;
        self.channels() * s * s
    }

    /// Draw the parameters of crop `k` for a `height × width` image.
    pub fn sample_params(
        &self,
        k: usize,
        height: usize,
        width: usize,
        key: SampleKey,
    ) -> CropParams {
        let mut p = CropParams::default();
        self.sample_params_into(k, height, width, key, &mut p);
        p
    }

    /// [`Self::sample_params`] reusing `p`'s allocation.
    pub fn sample_params_into(
        &self,
        k: usize,
        height: usize,
        width: usize,
        key: SampleKey,
        p: &mut CropParams,
    ) {
        let pol = self.policy(k);
        let mut rng = key.rng(k as u64);
        p.rect = random_resized_crop_params(height, width, pol.scale, SCDINO_RATIO, &mut rng);
        p.out_size = pol.size;
        let ops = self.cfg.ops;
        p.hflip = rng.bernoulli(FLIP_P) && ops.flips;
        p.vflip = rng.bernoulli(FLIP_P) && ops.flips;
        p.brightness.clear();
        if rng.bernoulli(BRIGHTNESS_P) {
            let (lo, hi) = BRIGHTNESS_RANGE;
            p.brightness
                .extend((0..self.channels()).map(|_| rng.uniform_range(lo, hi) as f32));
            if !ops.brightness {
                p.brightness.clear();
            }
        }
        // GaussianBlur_forGreyscaleMultiChan: `random.random() <= p`.
        p.blur_sigma = (rng.uniform() <= pol.blur_p)
            .then(|| rng.uniform_range_f32(BLUR_SIGMA_RANGE.0, BLUR_SIGMA_RANGE.1))
            .filter(|_| ops.blur);
        p.solarize = pol.solarize_p > 0.0 && rng.bernoulli(pol.solarize_p) && ops.solarize;
    }

    /// Parameters of all crops of one sample, in crop order.
    pub fn plan(&self, height: usize, width: usize, key: SampleKey) -> Vec<CropParams> {
        (0..self.num_crops())
            .map(|k| self.sample_params(k, height, width, key))
            .collect()
    }

    fn check_image(&self, img: &ImageChw) -> Result<(), AugmentError> {
        if img.channels == 0 || img.height == 0 || img.width == 0 {
            return Err(AugmentError::EmptyImage);
        }
        if img.channels != self.channels() {
            return Err(AugmentError::ChannelMismatch {
                what: "image (vs. mean/std)".into(),
                expected: self.channels(),
                got: img.channels,
            });
        }
        let n = img.channels * img.height * img.width;
        if img.data.len() != n {
            return Err(AugmentError::BufferSize {
                what: "image data".into(),
                expected: n,
                got: img.data.len(),
            });
        }
        Ok(())
    }

    /// All crops of one sample: `[global1, global2, local1, …, localN]`.
    pub fn apply(&self, img: &ImageChw, key: SampleKey) -> Result<Vec<ImageChw>, AugmentError> {
        self.check_image(img)?;
        let c = img.channels;
        let mut crops: Vec<ImageChw> = (0..self.num_crops())
            .map(|k| {
                let s = self.policy(k).size;
                ImageChw {
                    channels: c,
                    height: s,
                    width: s,
                    data: vec![0.0; c * s * s],
                }
            })
            .collect();
        let mut out: Vec<&mut [f32]> = crops.iter_mut().map(|x| x.data.as_mut_slice()).collect();
        self.apply_into(img, key, &mut out)?;
        Ok(crops)
    }

    /// Like [`Self::apply`], but writes crop `k` into `out[k]` (C·S·S values,
    /// C×S×S layout, e.g. sample b's slot of a batch buffer), using this
    /// thread's scratch buffers. No allocation once the thread's scratch has
    /// grown to size.
    pub fn apply_into(
        &self,
        img: &ImageChw,
        key: SampleKey,
        out: &mut [&mut [f32]],
    ) -> Result<(), AugmentError> {
        SCRATCH.with(|s| self.apply_into_with(img, key, out, &mut s.borrow_mut()))
    }

    /// [`Self::apply_into`] with explicit scratch buffers.
    pub fn apply_into_with(
        &self,
        img: &ImageChw,
        key: SampleKey,
        out: &mut [&mut [f32]],
        scratch: &mut AugmentScratch,
    ) -> Result<(), AugmentError> {
        self.check_image(img)?;
        if out.len() != self.num_crops() {
            return Err(AugmentError::BufferSize {
                what: "number of output crops".into(),
                expected: self.num_crops(),
                got: out.len(),
            });
        }
        for (k, buf) in out.iter().enumerate() {
            if buf.len() != self.crop_len(k) {
                return Err(AugmentError::BufferSize {
                    what: format!("output buffer of crop {k}"),
                    expected: self.crop_len(k),
                    got: buf.len(),
                });
            }
        }
        let AugmentScratch {
            resize,
            blur,
            params,
        } = scratch;
        for (k, buf) in out.iter_mut().enumerate() {
            self.sample_params_into(k, img.height, img.width, key, params);
            self.render_into(img, params, buf, resize, blur);
        }
        Ok(())
    }

    /// Render one crop with given parameters (e.g. from [`Self::plan`]).
    pub fn render(&self, img: &ImageChw, p: &CropParams) -> Result<ImageChw, AugmentError> {
        self.check_image(img)?;
        if !p.rect.fits(img.height, img.width) {
            return Err(AugmentError::CropOutside {
                rect: p.rect,
                height: img.height,
                width: img.width,
            });
        }
        if p.out_size == 0 || !(p.brightness.is_empty() || p.brightness.len() == img.channels) {
            return Err(AugmentError::InvalidArgument(format!(
                "bad crop parameters {p:?}"
            )));
        }
        let s = p.out_size;
        let mut data = vec![0.0; img.channels * s * s];
        self.render_into(
            img,
            p,
            &mut data,
            &mut ResizeScratch::default(),
            &mut BlurScratch::default(),
        );
        Ok(ImageChw {
            channels: img.channels,
            height: s,
            width: s,
            data,
        })
    }

    fn render_into(
        &self,
        img: &ImageChw,
        p: &CropParams,
        out: &mut [f32],
        resize: &mut ResizeScratch,
        blur: &mut BlurScratch,
    ) {
        let args = RenderArgs {
            img,
            p,
            mean: &self.cfg.mean,
            std: &self.cfg.std,
        };
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports the features the function is compiled for.
                return unsafe { render_avx512(args, out, resize, blur) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: as above.
                return unsafe { render_avx2(args, out, resize, blur) };
            }
        }
        render_impl(args, out, resize, blur);
    }
}

/// Inputs of one crop's rendering.
#[derive(Clone, Copy)]
struct RenderArgs<'a> {
    img: &'a ImageChw,
    p: &'a CropParams,
    mean: &'a [f32],
    std: &'a [f32],
}

/// The crop pipeline compiled for AVX-512: the same scalar code (so the same results, bit
/// for bit; no FMA contraction happens in Rust), auto-vectorised 16 lanes wide.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
unsafe fn render_avx512(
    args: RenderArgs<'_>,
    out: &mut [f32],
    resize: &mut ResizeScratch,
    blur: &mut BlurScratch,
) {
    render_impl(args, out, resize, blur)
}

/// As [`render_avx512`], 8 lanes wide.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn render_avx2(
    args: RenderArgs<'_>,
    out: &mut [f32],
    resize: &mut ResizeScratch,
    blur: &mut BlurScratch,
) {
    render_impl(args, out, resize, blur)
}

/// Resize (flips folded in) → brightness → blur → solarise + normalise, with the
/// element-wise steps applied row by row inside the resize or blur pass that produces the
/// row, so a crop is written once by the resize and once more by the blur, never re-read
/// by separate passes. Same operations in the same order as the separate ops in [`super::ops`].
#[inline(always)]
fn render_impl(
    args: RenderArgs<'_>,
    out: &mut [f32],
    resize: &mut ResizeScratch,
    blur: &mut BlurScratch,
) {
    let RenderArgs { img, p, mean, std } = args;
    let s = p.out_size;
    let solar = p.solarize.then_some(SOLARIZE_THRESHOLD);
    let bright = p.brightness.as_slice();
    let blurs = p.blur_sigma.is_some();
    resized_crop_into_with(
        &img.data,
        img.channels,
        img.height,
        img.width,
        p.rect,
        (s, s),
        (p.hflip, p.vflip),
        out,
        resize,
        |c, row| {
            if !bright.is_empty() {
                brightness_row(row, bright[c]);
            }
            if !blurs {
                normalize_row(row, mean[c], std[c], solar);
            }
        },
    );
    if let Some(sigma) = p.blur_sigma {
        gaussian_blur_with(out, Dims::new(img.channels, s, s), sigma, blur, |c, row| {
            normalize_row(row, mean[c], std[c], solar)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn augment(ops: AugmentOps) -> MultiCropAugment {
        let mut cfg = MultiCropConfig::scdino(vec![0.5; 2], vec![0.25; 2]);
        cfg.ops = ops;
        MultiCropAugment::new(cfg).unwrap()
    }

    /// A switched-off transform never fires, and the crops and the other transforms of every
    /// sample stay exactly what they are with everything on.
    #[test]
    fn switched_off_transforms_never_fire_and_change_nothing_else() {
        let all = augment(AugmentOps::default());
        let off = |ops: AugmentOps| augment(ops);
        let no_flips = off(AugmentOps {
            flips: false,
            ..Default::default()
        });
        let none = off(AugmentOps {
            flips: false,
            brightness: false,
            blur: false,
            solarize: false,
        });
        let (mut fired, mut solarised) = (0, 0);
        for i in 0..200 {
            let key = SampleKey::new(3, 1, i);
            let (a, f, n) = (
                all.plan(40, 40, key),
                no_flips.plan(40, 40, key),
                none.plan(40, 40, key),
            );
            for ((a, f), n) in a.iter().zip(&f).zip(&n) {
                fired += usize::from(a.hflip || a.vflip);
                solarised += usize::from(a.solarize);
                assert_eq!((a.rect, f.rect, n.rect), (a.rect, a.rect, a.rect));
                assert!(!f.hflip && !f.vflip && !n.hflip && !n.vflip);
                assert_eq!(
                    (&f.brightness, f.blur_sigma, f.solarize),
                    (&a.brightness, a.blur_sigma, a.solarize)
                );
                assert!(n.brightness.is_empty() && n.blur_sigma.is_none() && !n.solarize);
            }
        }
        // With everything on, the transforms did fire (the checks above are not vacuous).
        assert!(fired > 1000 && solarised > 10, "{fired} {solarised}");
    }
}
