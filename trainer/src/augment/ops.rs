//! The augmentation operations with explicit parameters.
//!
//! Each has a checked [`ImageChw`] form and a buffer form (`*_buf`) working in
//! place on C×H×W `f32` slices, which the multi-crop pipeline uses on the
//! caller's output buffers. Each matches its torchvision/PyTorch counterpart
//! (see the module docs of [`super`]).

use super::resize::{resized_crop_into, CropRect, ResizeScratch};
use super::AugmentError;
use crate::data::ImageChw;

/// Shape of a C×H×W buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dims {
    pub channels: usize,
    pub height: usize,
    pub width: usize,
}

impl Dims {
    pub const fn new(channels: usize, height: usize, width: usize) -> Self {
        Self {
            channels,
            height,
            width,
        }
    }

    pub const fn plane(&self) -> usize {
        self.height * self.width
    }

    pub const fn len(&self) -> usize {
        self.channels * self.height * self.width
    }

    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn of(img: &ImageChw) -> Self {
        Self::new(img.channels, img.height, img.width)
    }
}

fn check_image(img: &ImageChw) -> Result<Dims, AugmentError> {
    let d = Dims::of(img);
    if d.is_empty() {
        return Err(AugmentError::EmptyImage);
    }
    if img.data.len() != d.len() {
        return Err(AugmentError::BufferSize {
            what: "image data".into(),
            expected: d.len(),
            got: img.data.len(),
        });
    }
    Ok(d)
}

fn check_per_channel(what: &str, got: usize, channels: usize) -> Result<(), AugmentError> {
    if got == channels {
        Ok(())
    } else {
        Err(AugmentError::ChannelMismatch {
            what: what.into(),
            expected: channels,
            got,
        })
    }
}

/// `torchvision.transforms.functional.resized_crop(img, top, left, h, w,
/// [out_size, out_size], BICUBIC, antialias=False)`: crop, then
/// `F.interpolate(mode="bicubic", align_corners=False)` without antialias and
/// without clamping. The crop must lie inside the image.
pub fn resized_crop(
    img: &ImageChw,
    top: usize,
    left: usize,
    h: usize,
    w: usize,
    out_size: usize,
) -> Result<ImageChw, AugmentError> {
    resized_crop_hw(img, CropRect::new(top, left, h, w), out_size, out_size)
}

/// [`resized_crop`] to a non-square `out_h × out_w`.
pub fn resized_crop_hw(
    img: &ImageChw,
    rect: CropRect,
    out_h: usize,
    out_w: usize,
) -> Result<ImageChw, AugmentError> {
    let d = check_image(img)?;
    if !rect.fits(d.height, d.width) {
        return Err(AugmentError::CropOutside {
            rect,
            height: d.height,
            width: d.width,
        });
    }
    if out_h == 0 || out_w == 0 {
        return Err(AugmentError::InvalidArgument("output size 0".into()));
    }
    let mut data = vec![0.0; d.channels * out_h * out_w];
    resized_crop_into(
        &img.data,
        d.channels,
        d.height,
        d.width,
        rect,
        out_h,
        out_w,
        false,
        false,
        &mut data,
        &mut ResizeScratch::default(),
    );
    Ok(ImageChw {
        channels: d.channels,
        height: out_h,
        width: out_w,
        data,
    })
}

/// Mirror left–right in place (`F.hflip`).
pub fn hflip(img: &mut ImageChw) {
    let d = Dims::of(img);
    hflip_buf(&mut img.data, d);
}

/// Mirror top–bottom in place (`F.vflip`).
pub fn vflip(img: &mut ImageChw) {
    let d = Dims::of(img);
    vflip_buf(&mut img.data, d);
}

pub fn hflip_buf(data: &mut [f32], d: Dims) {
    assert_eq!(data.len(), d.len(), "buffer length");
    if d.width == 0 {
        return;
    }
    for row in data.chunks_exact_mut(d.width) {
        row.reverse();
    }
}

pub fn vflip_buf(data: &mut [f32], d: Dims) {
    assert_eq!(data.len(), d.len(), "buffer length");
    if d.plane() == 0 {
        return;
    }
    for plane in data.chunks_exact_mut(d.plane()) {
        for y in 0..d.height / 2 {
            let (a, b) = plane.split_at_mut((d.height - 1 - y) * d.width);
            a[y * d.width..(y + 1) * d.width].swap_with_slice(&mut b[..d.width]);
        }
    }
}

/// Per channel `x ← clamp(f_c·x, 0, 1)`: torchvision's `adjust_brightness`
/// (`_blend(img, 0, f)`) applied to each channel with its own factor, as
/// scDINO's `AdjustBrightness`.
pub fn adjust_brightness(img: &mut ImageChw, factors: &[f32]) -> Result<(), AugmentError> {
    let d = check_image(img)?;
    check_per_channel("brightness factors", factors.len(), d.channels)?;
    adjust_brightness_buf(&mut img.data, d, factors);
    Ok(())
}

pub fn adjust_brightness_buf(data: &mut [f32], d: Dims, factors: &[f32]) {
    assert_eq!(data.len(), d.len(), "buffer length");
    assert_eq!(factors.len(), d.channels, "one factor per channel");
    if d.plane() == 0 {
        return;
    }
    for (plane, &f) in data.chunks_exact_mut(d.plane()).zip(factors) {
        brightness_row(plane, f);
    }
}

/// `x ← clamp(f·x, 0, 1)` over a slice (one channel's values).
#[inline(always)]
pub fn brightness_row(values: &mut [f32], f: f32) {
    for v in values {
        *v = (f * *v).clamp(0.0, 1.0);
    }
}

/// Kernel size of scDINO's blur (`GaussianBlur(kernel_size=(5, 5))`).
pub const BLUR_KERNEL: usize = 5;
const HALF: usize = BLUR_KERNEL / 2;

/// torchvision's `_get_gaussian_kernel1d(5, σ)` in `f32`:
/// `exp(−½(x/σ)²)` over `linspace(−2, 2, 5)`, normalised to sum 1.
pub fn gaussian_kernel5(sigma: f32) -> [f32; BLUR_KERNEL] {
    let mut k = [0.0f32; BLUR_KERNEL];
    for (i, v) in k.iter_mut().enumerate() {
        let x = i as f32 - HALF as f32;
        let r = x / sigma;
        *v = (-0.5 * (r * r)).exp();
    }
    let sum: f32 = k.iter().sum();
    for v in &mut k {
        *v /= sum;
    }
    k
}

/// Reflect-padding index (`torch.nn.functional.pad(mode="reflect")`, edge
/// sample not repeated) for any `i`; sizes below 3 never occur with
/// PyTorch (it rejects padding ≥ size) and fold periodically here.
#[inline]
fn reflect(i: isize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let m = i.rem_euclid(period);
    (if m >= n as isize { period - m } else { m }) as usize
}

/// `F.gaussian_blur(img, [5, 5], [σ, σ])`: separable 5×5 Gaussian, reflect
/// padding of 2, depthwise over channels. `σ` must be positive.
pub fn gaussian_blur(img: &mut ImageChw, sigma: f32) -> Result<(), AugmentError> {
    let d = check_image(img)?;
    if !(sigma > 0.0 && sigma.is_finite()) {
        return Err(AugmentError::InvalidArgument(format!(
            "blur sigma must be positive, got {sigma}"
        )));
    }
    gaussian_blur_buf(&mut img.data, d, sigma, &mut BlurScratch::default());
    Ok(())
}

/// Reusable buffers of the blur.
#[derive(Debug, Clone, Default)]
pub struct BlurScratch {
    pad: Vec<f32>,
    plane: Vec<f32>,
    rows: Vec<usize>,
}

pub fn gaussian_blur_buf(data: &mut [f32], d: Dims, sigma: f32, scratch: &mut BlurScratch) {
    gaussian_blur_with(data, d, sigma, scratch, |_, _| {});
}

/// [`gaussian_blur_buf`] calling `post(channel, row)` on every output row as soon as it is
/// computed (the multi-crop pipeline fuses solarisation and normalisation in this way).
#[inline(always)]
pub fn gaussian_blur_with(
    data: &mut [f32],
    d: Dims,
    sigma: f32,
    scratch: &mut BlurScratch,
    mut post: impl FnMut(usize, &mut [f32]),
) {
    assert_eq!(data.len(), d.len(), "buffer length");
    if d.is_empty() {
        return;
    }
    let k = gaussian_kernel5(sigma);
    let (h, w) = (d.height, d.width);
    let BlurScratch { pad, plane, rows } = scratch;
    pad.clear();
    pad.resize(w + 2 * HALF, 0.0);
    plane.clear();
    plane.resize(h * w, 0.0);
    // Source row of every padded row position (reflect), computed once.
    rows.clear();
    rows.extend((0..h + 2 * HALF).map(|p| reflect(p as isize - HALF as isize, h)));
    for (c, img_plane) in data.chunks_exact_mut(d.plane()).enumerate() {
        // Horizontal pass into `plane`.
        for (src, dst) in img_plane.chunks_exact(w).zip(plane.chunks_exact_mut(w)) {
            pad[HALF..HALF + w].copy_from_slice(src);
            for p in (0..HALF).chain(w + HALF..w + 2 * HALF) {
                pad[p] = src[reflect(p as isize - HALF as isize, w)];
            }
            let t = |i: usize| &pad[i..i + w];
            weighted5(dst, [t(0), t(1), t(2), t(3), t(4)], &k);
        }
        // Vertical pass back into the image.
        for (y, dst) in img_plane.chunks_exact_mut(w).enumerate() {
            let r = |t: usize| &plane[rows[y + t] * w..][..w];
            weighted5(dst, [r(0), r(1), r(2), r(3), r(4)], &k);
            post(c, dst);
        }
    }
}

/// `dst[x] = Σ_t k[t]·src[t][x]` (five equally long rows; vectorises).
#[inline(always)]
fn weighted5(dst: &mut [f32], src: [&[f32]; 5], k: &[f32; BLUR_KERNEL]) {
    let [a, b, c, d, e] = src;
    let n = dst.len();
    let (a, b, c, d, e) = (&a[..n], &b[..n], &c[..n], &d[..n], &e[..n]);
    for i in 0..n {
        dst[i] = k[0] * a[i] + k[1] * b[i] + k[2] * c[i] + k[3] * d[i] + k[4] * e[i];
    }
}

/// scDINO's `Solarization_forGreyscaleMultiChan`: every value `> threshold`
/// becomes `1 − v`, in all channels. (torchvision's `F.solarize` uses `>=`
/// and accepts only 1 or 3 channels; at scDINO's threshold 0.5 the two agree
/// because `1 − 0.5 = 0.5`.)
pub fn solarize(img: &mut ImageChw, threshold: f32) {
    solarize_buf(&mut img.data, threshold);
}

pub fn solarize_buf(data: &mut [f32], threshold: f32) {
    for v in data {
        if *v > threshold {
            *v = 1.0 - *v;
        }
    }
}

/// `F.normalize(img, mean, std)`: per channel `(x − mean_c) / std_c`.
pub fn normalize(img: &mut ImageChw, mean: &[f32], std: &[f32]) -> Result<(), AugmentError> {
    let d = check_image(img)?;
    check_per_channel("mean", mean.len(), d.channels)?;
    check_per_channel("std", std.len(), d.channels)?;
    if let Some(s) = std.iter().find(|s| **s == 0.0 || !s.is_finite()) {
        return Err(AugmentError::InvalidArgument(format!(
            "std must be non-zero and finite, got {s}"
        )));
    }
    normalize_buf(&mut img.data, d, mean, std, None);
    Ok(())
}

/// Normalise in place; if `solarize_threshold` is given, solarise each value
/// first (the fused last pass of a crop).
pub fn normalize_buf(
    data: &mut [f32],
    d: Dims,
    mean: &[f32],
    std: &[f32],
    solarize_threshold: Option<f32>,
) {
    assert_eq!(data.len(), d.len(), "buffer length");
    assert!(mean.len() == d.channels && std.len() == d.channels);
    if d.plane() == 0 {
        return;
    }
    for ((plane, &m), &s) in data.chunks_exact_mut(d.plane()).zip(mean).zip(std) {
        normalize_row(plane, m, s, solarize_threshold);
    }
}

/// `x ← (x − m)/s` over a slice, solarising first if a threshold is given.
#[inline(always)]
pub fn normalize_row(values: &mut [f32], m: f32, s: f32, solarize_threshold: Option<f32>) {
    match solarize_threshold {
        None => {
            for v in values {
                *v = (*v - m) / s;
            }
        }
        Some(t) => {
            for v in values {
                let x = if *v > t { 1.0 - *v } else { *v };
                *v = (x - m) / s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflect_matches_torch_pad() {
        // torch.nn.functional.pad(arange(5), (2, 2), mode='reflect') = 2 1 0 1 2 3 4 3 2
        let got: Vec<usize> = (-2..7).map(|i| reflect(i, 5)).collect();
        assert_eq!(got, [2, 1, 0, 1, 2, 3, 4, 3, 2]);
        let got: Vec<usize> = (-2..5).map(|i| reflect(i, 3)).collect();
        assert_eq!(got, [2, 1, 0, 1, 2, 1, 0]);
    }

    #[test]
    fn flips_are_involutions() {
        let d = Dims::new(2, 3, 4);
        let orig: Vec<f32> = (0..d.len()).map(|v| v as f32).collect();
        let mut x = orig.clone();
        vflip_buf(&mut x, d);
        assert_eq!(&x[..4], &orig[8..12]);
        vflip_buf(&mut x, d);
        hflip_buf(&mut x, d);
        assert_eq!(&x[..4], &[3.0, 2.0, 1.0, 0.0]);
        hflip_buf(&mut x, d);
        assert_eq!(x, orig);
    }
}
