//! Per-image preprocessing shared by every stage (scDINO `main_dino.py`
//! `Multichannel_dataset.__getitem__`, and its copies in the mean/std,
//! CLS-feature, label and attention scripts), in scDINO's order:
//!
//! 1. [`select_channels`] — `x[:, :, selected_channels]`, *before* scaling
//!    (the mean/std stage skips it and keeps every channel);
//! 2. [`center_crop`] — torchvision `CenterCrop(n)` if `center_crop != 0`;
//! 3. [`minmax_scale`] — `utils.normalize_numpy_0_to_1`, per image and per
//!    channel, in f64;
//! 4. guards where scDINO produced NaN: a constant channel and a NaN/∞ pixel scale to 0
//!    (scDINO dropped such an image in training and mean/std and replaced it by dataset
//!    image 0 in the features; a padded stain made every image NaN, its issue #5). Every
//!    image is used; the outcome tells what was guarded so the caller can warn.

use super::data_error::DataError;
use super::tiff_reader::{Chw, ImageChw};

/// Keep `channels` (in that order; repeats allowed, as with numpy fancy
/// indexing). Every index must be below the image's channel count.
pub fn select_channels(img: &ImageChw, channels: &[usize]) -> Result<ImageChw, DataError> {
    let mut data = Vec::with_capacity(channels.len() * img.plane_len());
    for &c in channels {
        data.extend_from_slice(img.try_channel(c)?);
    }
    Chw::new(channels.len(), img.height, img.width, data)
}

/// torchvision `CenterCrop(size)` (square) on a C×H×W tensor.
pub fn center_crop(img: &ImageChw, size: usize) -> Result<ImageChw, DataError> {
    center_crop_hw(img, size, size)
}

/// torchvision `F.center_crop` for tensors, including its padding rule: if
/// the crop is larger than the image in a dimension, the image is first
/// zero-padded by `(crop - size) // 2` before and `(crop - size + 1) // 2`
/// after; the offset is then `int(round((size - crop) / 2))` with Python's
/// round-half-to-even. Zero-padding matters downstream: the zeros take part
/// in the min–max scaling that follows.
pub fn center_crop_hw(img: &ImageChw, crop_h: usize, crop_w: usize) -> Result<ImageChw, DataError> {
    if crop_h == 0 || crop_w == 0 {
        return Err(DataError::InvalidArgument(format!(
            "center crop size must be positive, got {crop_h}×{crop_w}"
        )));
    }
    let mut data = vec![0.0; img.channels * crop_h * crop_w];
    for (c, dst) in data.chunks_exact_mut(crop_h * crop_w).enumerate() {
        crop_plane_into(img.channel(c), img.height, img.width, crop_h, crop_w, dst);
    }
    Chw::new(img.channels, crop_h, crop_w, data)
}

/// One plane of [`center_crop_hw`], written into `dst` (`crop_h·crop_w` values).
fn crop_plane_into(
    plane: &[f32],
    height: usize,
    width: usize,
    crop_h: usize,
    crop_w: usize,
    dst: &mut [f32],
) {
    // Padding before the crop (only in a dimension where crop > size).
    let pad_top = crop_h.saturating_sub(height) / 2;
    let pad_left = crop_w.saturating_sub(width) / 2;
    let top = python_round_half(height.max(crop_h) - crop_h);
    let left = python_round_half(width.max(crop_w) - crop_w);
    for (y, row) in dst.chunks_exact_mut(crop_w).enumerate() {
        // Row in the padded image, then in the original one.
        let src_y = (y + top).checked_sub(pad_top).filter(|&v| v < height);
        for (x, v) in row.iter_mut().enumerate() {
            let src_x = (x + left).checked_sub(pad_left).filter(|&v| v < width);
            *v = match (src_y, src_x) {
                (Some(sy), Some(sx)) => plane[sy * width + sx],
                _ => 0.0,
            };
        }
    }
}

/// `int(round(diff / 2.0))` with Python's round-half-to-even.
fn python_round_half(diff: usize) -> usize {
    let half = diff / 2;
    if diff % 2 == 1 && half % 2 == 1 {
        half + 1
    } else {
        half
    }
}

/// What min–max scaling did to an image.
#[derive(Debug, Clone, PartialEq)]
pub struct MinMaxOutcome {
    /// Per-channel minimum of the finite pixels before scaling (0 if none is finite).
    pub min: Vec<f64>,
    /// Per-channel maximum actually divided by, i.e. after the zero-max rule.
    pub max: Vec<f64>,
    /// True if some channel had `max - min == 0`, so every channel with
    /// `max == 0` got `max := 1`.
    pub zero_max_rule_applied: bool,
    /// Channels whose finite pixels all have one value (a constant, padded or empty stain).
    /// They scale to 0; scDINO did too for an all-zero channel (zero-max rule) but divided 0
    /// by 0 for any other constant, which made the image NaN (its issue #5).
    pub constant_channels: Vec<usize>,
    /// Input pixels that were NaN or ±∞. They are left out of min and max and scaled to 0,
    /// so one bad pixel no longer poisons its whole channel.
    pub nonfinite_pixels: usize,
}

/// Per-channel min/max over the finite pixels, and how many pixels were not finite.
/// A channel without a finite pixel reports (0, 0), i.e. it is constant.
fn channel_min_max(plane: &[f32]) -> (f64, f64, usize) {
    let mut min = f64::INFINITY;
    let mut max = f64::NEG_INFINITY;
    let mut nonfinite = 0;
    for &v in plane {
        if !v.is_finite() {
            nonfinite += 1;
            continue;
        }
        let v = f64::from(v);
        min = min.min(v);
        max = max.max(v);
    }
    if min > max {
        (0.0, 0.0, nonfinite)
    } else {
        (min, max, nonfinite)
    }
}

/// The scaling parameters of scDINO's `normalize_numpy_0_to_1` (HEAD, with the zero-max
/// fix of commit 8b2236b): `x_min`, `x_max` per channel; if any channel has
/// `x_max - x_min == 0`, `x_max := 1` for every channel whose `x_max == 0`. Non-finite
/// pixels are left out of min and max.
fn minmax_params(img: &ImageChw) -> (Vec<f64>, Vec<f64>, bool, usize, Vec<usize>) {
    let mut nonfinite = 0;
    let (mins, mut maxs): (Vec<f64>, Vec<f64>) = (0..img.channels)
        .map(|c| {
            let (lo, hi, n) = channel_min_max(img.channel(c));
            nonfinite += n;
            (lo, hi)
        })
        .unzip();
    let constant: Vec<usize> = (0..img.channels)
        .filter(|&c| maxs[c] - mins[c] == 0.0)
        .collect();
    let any_zero_range = !constant.is_empty();
    if any_zero_range {
        for hi in maxs.iter_mut().filter(|hi| **hi == 0.0) {
            *hi = 1.0;
        }
    }
    (mins, maxs, any_zero_range, nonfinite, constant)
}

/// One pixel of scDINO's `(x - x_min) / (x_max - x_min)`, in f64, guarded: a zero range or a
/// non-finite pixel gives 0 instead of NaN. Wherever scDINO's result is finite, this is the
/// same arithmetic and the same bits.
#[inline]
fn scale_pixel(v: f32, lo: f64, range: f64) -> f64 {
    if range == 0.0 || !v.is_finite() {
        0.0
    } else {
        (f64::from(v) - lo) / range
    }
}

/// Per-image, per-channel min–max scaling to [0, 1], in place. The arithmetic
/// is `(x - x_min) / (x_max - x_min)` in f64, rounded to f32 afterwards —
/// bit-identical to `torch.from_numpy(normalize_numpy_0_to_1(x)).float()` wherever that is
/// finite. Where scDINO gives NaN (a constant non-zero channel, a NaN or ∞ pixel) the result
/// is 0 instead, and the returned [`MinMaxOutcome`] says so.
pub fn minmax_scale(img: &mut ImageChw) -> MinMaxOutcome {
    let (min, max, zero_max_rule_applied, nonfinite_pixels, constant_channels) = minmax_params(img);
    for c in 0..img.channels {
        let (lo, range) = (min[c], max[c] - min[c]);
        for v in img.channel_mut(c) {
            *v = scale_pixel(*v, lo, range) as f32;
        }
    }
    MinMaxOutcome {
        constant_channels,
        min,
        max,
        zero_max_rule_applied,
        nonfinite_pixels,
    }
}

/// Like [`minmax_scale`] but keeps the f64 result (the CLS-feature stage of
/// scDINO feeds float64 tensors). Returned in C×H×W order.
pub fn minmax_scale_f64(img: &ImageChw) -> (Vec<f64>, MinMaxOutcome) {
    let (min, max, zero_max_rule_applied, nonfinite_pixels, constant_channels) = minmax_params(img);
    let mut out = Vec::with_capacity(img.data.len());
    for c in 0..img.channels {
        let (lo, range) = (min[c], max[c] - min[c]);
        out.extend(img.channel(c).iter().map(|&v| scale_pixel(v, lo, range)));
    }
    let outcome = MinMaxOutcome {
        constant_channels,
        min,
        max,
        zero_max_rule_applied,
        nonfinite_pixels,
    };
    (out, outcome)
}

/// The §3 steps that every stage shares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreprocessOptions {
    /// Channels to keep, in order; `None` keeps all (mean/std stage).
    pub selected_channels: Option<Vec<usize>>,
    /// `center_crop` from the config; 0 disables it (the default).
    pub center_crop: usize,
}

/// Channel selection → optional center crop → min–max scaling. Returns the
/// scaled image and what scaling guarded against.
pub fn preprocess(
    img: &ImageChw,
    opts: &PreprocessOptions,
) -> Result<(ImageChw, MinMaxOutcome), DataError> {
    let mut out = match &opts.selected_channels {
        Some(sel) => select_channels(img, sel)?,
        None => img.clone(),
    };
    if opts.center_crop != 0 {
        out = center_crop(&out, opts.center_crop)?;
    }
    let outcome = minmax_scale(&mut out);
    Ok((out, outcome))
}

/// What [`preprocess_into`] had to guard against in one image, without allocating: the
/// training loader reports the first occurrence of each kind once per run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScaleNotes {
    /// The first output channel whose range was zero (scaled to 0), if any.
    pub first_constant_channel: Option<usize>,
    /// Input pixels that were NaN or ±∞ (scaled to 0).
    pub nonfinite_pixels: usize,
}

/// [`preprocess`] for the training loader: channel selection and centre crop in one pass
/// into `out` (reusing its allocation), then min–max scaling in place without allocating.
/// Values are bit-identical to [`preprocess`]'s.
pub fn preprocess_into(
    img: &ImageChw,
    opts: &PreprocessOptions,
    out: &mut ImageChw,
) -> Result<ScaleNotes, DataError> {
    let channels = opts
        .selected_channels
        .as_ref()
        .map_or(img.channels, |sel| sel.len());
    let (h, w) = match opts.center_crop {
        0 => (img.height, img.width),
        n => (n, n),
    };
    let plane = checked_len(1, h, w)?;
    out.channels = channels;
    out.height = h;
    out.width = w;
    out.data.clear();
    out.data.resize(checked_len(channels, h, w)?, 0.0);
    for (k, dst) in out.data.chunks_exact_mut(plane.max(1)).enumerate() {
        let src = match &opts.selected_channels {
            Some(sel) => img.try_channel(sel[k])?,
            None => img.channel(k),
        };
        if opts.center_crop == 0 {
            dst.copy_from_slice(src);
        } else {
            crop_plane_into(src, img.height, img.width, h, w, dst);
        }
    }
    Ok(minmax_scale_in_place(out))
}

fn checked_len(c: usize, h: usize, w: usize) -> Result<usize, DataError> {
    c.checked_mul(h)
        .and_then(|n| n.checked_mul(w))
        .ok_or_else(|| DataError::InvalidArgument(format!("image size {c}×{h}×{w} overflows")))
}

/// [`minmax_scale`] without the outcome (and without allocating): the same arithmetic. The
/// zero-range rule needs every channel's range before any is scaled.
fn minmax_scale_in_place(img: &mut ImageChw) -> ScaleNotes {
    let mut notes = ScaleNotes::default();
    if img.plane_len() == 0 {
        return notes;
    }
    // Ranges of the first STASH channels are kept on the stack; more channels (rare) are
    // scanned again rather than allocated for.
    const STASH: usize = 64;
    let mut stash = [(0.0f64, 0.0f64); STASH];
    let mut any_zero_range = false;
    for c in 0..img.channels {
        let (lo, hi, nonfinite) = channel_min_max(img.channel(c));
        notes.nonfinite_pixels += nonfinite;
        any_zero_range |= hi - lo == 0.0;
        if let Some(slot) = stash.get_mut(c) {
            *slot = (lo, hi);
        }
    }
    for c in 0..img.channels {
        let (lo, mut hi) = match stash.get(c) {
            Some(&range) => range,
            None => {
                let (lo, hi, _) = channel_min_max(img.channel(c));
                (lo, hi)
            }
        };
        if hi - lo == 0.0 && notes.first_constant_channel.is_none() {
            notes.first_constant_channel = Some(c);
        }
        if any_zero_range && hi == 0.0 {
            hi = 1.0;
        }
        let range = hi - lo;
        for v in img.channel_mut(c) {
            *v = scale_pixel(*v, lo, range) as f32;
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(c: usize, h: usize, w: usize, f: impl Fn(usize, usize, usize) -> f32) -> ImageChw {
        let mut data = Vec::new();
        for ci in 0..c {
            for y in 0..h {
                for x in 0..w {
                    data.push(f(ci, y, x));
                }
            }
        }
        Chw::new(c, h, w, data).unwrap()
    }

    #[test]
    fn selection_order_and_range() {
        let im = img(3, 2, 2, |c, _, _| c as f32);
        let s = select_channels(&im, &[2, 0, 2]).unwrap();
        assert_eq!(s.channels, 3);
        assert_eq!(s.channel(0), &[2.0; 4]);
        assert_eq!(s.channel(1), &[0.0; 4]);
        assert!(matches!(
            select_channels(&im, &[3]),
            Err(DataError::ChannelOutOfRange {
                channel: 3,
                channels: 3
            })
        ));
    }

    #[test]
    fn crop_offsets_follow_python_round() {
        // 50 → 45: diff 5, 5/2 = 2.5 rounds to 2 (half to even).
        let im = img(1, 50, 50, |_, y, x| (y * 100 + x) as f32);
        let c = center_crop(&im, 45).unwrap();
        assert_eq!(c.get(0, 0, 0), 202.0);
        // 50 → 47: diff 3, 1.5 rounds to 2.
        let c = center_crop(&im, 47).unwrap();
        assert_eq!(c.get(0, 0, 0), 202.0);
        // 50 → 49: diff 1, 0.5 rounds to 0.
        assert_eq!(center_crop(&im, 49).unwrap().get(0, 0, 0), 0.0);
        assert_eq!(center_crop(&im, 50).unwrap(), im);
    }

    #[test]
    fn crop_pads_with_zeros_when_larger() {
        // 3×3 → 6×6: pad (6-3)//2 = 1 before, 2 after.
        let im = img(1, 3, 3, |_, y, x| (1 + y * 3 + x) as f32);
        let c = center_crop(&im, 6).unwrap();
        assert_eq!(c.get(0, 0, 0), 0.0);
        assert_eq!(c.get(0, 1, 1), 1.0);
        assert_eq!(c.get(0, 3, 3), 9.0);
        assert_eq!(c.get(0, 4, 4), 0.0);
        assert!(center_crop(&im, 0).is_err());
    }

    #[test]
    fn minmax_edge_cases() {
        // ch0 normal, ch1 all zero, ch2 constant 7 (NaN in scDINO, 0 here).
        let mut im = img(3, 2, 2, |c, y, x| match c {
            0 => (y * 2 + x) as f32,
            1 => 0.0,
            _ => 7.0,
        });
        let out = minmax_scale(&mut im);
        assert!(out.zero_max_rule_applied);
        assert_eq!(out.constant_channels, vec![1, 2]);
        assert_eq!(out.nonfinite_pixels, 0);
        assert_eq!(im.channel(0), &[0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0]);
        assert_eq!(im.channel(1), &[0.0; 4]);
        assert_eq!(im.channel(2), &[0.0; 4]);
    }

    #[test]
    fn zero_max_rule_only_when_some_range_is_zero() {
        // ch0 in [-2, 0] (max == 0 but range 2), ch1 normal: no fix applied.
        let mut im = img(
            2,
            1,
            2,
            |c, _, x| if c == 0 { -2.0 * x as f32 } else { x as f32 },
        );
        let out = minmax_scale(&mut im);
        assert!(!out.zero_max_rule_applied);
        assert_eq!(im.channel(0), &[1.0, 0.0]);
        // Add an all-zero channel: now ch0's max becomes 1 too.
        let mut im = img(3, 1, 2, |c, _, x| match c {
            0 => -2.0 * x as f32,
            1 => x as f32,
            _ => 0.0,
        });
        let out = minmax_scale(&mut im);
        assert!(out.zero_max_rule_applied);
        assert_eq!(out.max, vec![1.0, 1.0, 1.0]);
        assert_eq!(im.channel(0), &[2.0 / 3.0, 0.0]);
        assert_eq!(out.constant_channels, vec![2]);
    }

    #[test]
    fn nonfinite_pixels_are_left_out_and_scale_to_zero() {
        let mut im = img(1, 1, 4, |_, _, x| match x {
            1 => f32::NAN,
            2 => f32::INFINITY,
            _ => x as f32 * 2.0,
        });
        let out = minmax_scale(&mut im);
        assert_eq!(out.nonfinite_pixels, 2);
        assert_eq!((out.min[0], out.max[0]), (0.0, 6.0));
        assert_eq!(im.data, vec![0.0, 0.0, 0.0, 1.0]);
        // A channel without one finite pixel is constant and scales to 0.
        let mut im = img(2, 1, 2, |c, _, x| if c == 0 { f32::NAN } else { x as f32 });
        let out = minmax_scale(&mut im);
        assert_eq!(out.constant_channels, vec![0]);
        assert_eq!(im.data, vec![0.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn f64_variant_matches_f32_variant() {
        let im = img(2, 3, 3, |c, y, x| ((c + 1) * (y * 7 + x * 3) % 11) as f32);
        let (v64, o64) = minmax_scale_f64(&im);
        let mut im32 = im.clone();
        let o32 = minmax_scale(&mut im32);
        assert_eq!(o64, o32);
        let narrowed: Vec<f32> = v64.iter().map(|&v| v as f32).collect();
        assert_eq!(narrowed, im32.data);
    }

    #[test]
    fn pipeline_order_selects_before_scaling() {
        let im = img(3, 4, 4, |c, y, x| (c * 100 + y * 4 + x) as f32);
        let opts = PreprocessOptions {
            selected_channels: Some(vec![2]),
            center_crop: 2,
        };
        let (out, outcome) = preprocess(&im, &opts).unwrap();
        assert_eq!((out.channels, out.height, out.width), (1, 2, 2));
        // Crop keeps rows/cols 1..3: values 205,206,209,210 → 0, 1/5, 4/5, 1.
        assert_eq!(out.data, vec![0.0, 0.2, 0.8, 1.0]);
        assert_eq!(outcome.min, vec![205.0]);
    }

    #[test]
    fn preprocess_into_is_bit_identical_to_preprocess() {
        // Channel kinds: varied, all zero, constant non-zero, with a NaN, max 0.
        let kinds = |c: usize, y: usize, x: usize| -> f32 {
            match c % 5 {
                0 => ((y * 31 + x * 17) % 97) as f32 * 1.37 + 3.0,
                1 => 0.0,
                2 => 7.0,
                3 if y == 1 && x == 2 => f32::NAN,
                3 => (y + x) as f32,
                _ => -((y * 5 + x) as f32),
            }
        };
        let mut out = ImageChw::default();
        for (c, h, w) in [(5, 9, 7), (3, 4, 4), (1, 1, 1)] {
            // Images without the guarded channels too, so both outcomes occur.
            for mask in [None, Some(vec![0usize, 4])] {
                let im = img(c, h, w, kinds);
                for sel in [None, Some(vec![0usize]), Some(vec![0, 0])] {
                    for crop in [0, 3, 12] {
                        let mut opts = PreprocessOptions {
                            selected_channels: sel.clone().or(mask.clone()),
                            center_crop: crop,
                        };
                        if opts
                            .selected_channels
                            .as_ref()
                            .is_some_and(|s| s.iter().any(|&k| k >= c))
                        {
                            opts.selected_channels = Some(vec![0]);
                        }
                        let (want, outcome) = preprocess(&im, &opts).unwrap();
                        let notes = preprocess_into(&im, &opts, &mut out).unwrap();
                        let case = format!("{c}×{h}×{w} {opts:?}");
                        assert_eq!(
                            notes.first_constant_channel,
                            outcome.constant_channels.first().copied(),
                            "{case}"
                        );
                        assert_eq!(notes.nonfinite_pixels, outcome.nonfinite_pixels, "{case}");
                        assert!(out.data.iter().all(|v| v.is_finite()), "{case}");
                        assert_eq!(
                            (out.channels, out.height, out.width),
                            (want.channels, want.height, want.width),
                            "{case}"
                        );
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&out.data), bits(&want.data), "{case}");
                    }
                }
            }
        }
        let bad = PreprocessOptions {
            selected_channels: Some(vec![9]),
            center_crop: 0,
        };
        assert!(preprocess_into(&img(2, 2, 2, kinds), &bad, &mut out).is_err());
    }
}
