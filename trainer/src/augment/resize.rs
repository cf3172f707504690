//! Crop + bicubic resize, identical to PyTorch's
//! `F.interpolate(mode="bicubic", align_corners=False)` on float tensors.
//!
//! What PyTorch's CPU kernel (`upsample_bicubic2d`, `HelperInterpCubic`)
//! does, and we copy in `f32`:
//! * `scale = in / out`; source coordinate `real = scale·(i + 0.5) − 0.5`
//!   (half-pixel centres, no clamping at 0 for cubic);
//! * `i0 = min(floor(real), in − 1)`, `t = clamp(real − i0, 0, 1)`;
//! * Keys' cubic convolution with `A = −0.75` on taps `i0−1 … i0+2`, indices
//!   clamped to the border (`[0, in − 1]`) of the **cropped** image;
//! * no antialiasing (torchvision 0.9.1, which scDINO used, never antialiased
//!   tensors; torchvision ≥ 0.17 antialiases when *down*sampling by default —
//!   we deliberately do not), and no clamping of the result: values may leave
//!   [0, 1] through cubic overshoot.
//!
//! PyTorch evaluates `Σ_y w_y · (Σ_x w_x · src[y, x])`, i.e. the width pass
//! inside the height pass. We do the same two passes separably (width pass
//! over the crop's columns, transposed so that it vectorises over rows, into a
//! scratch buffer, then the height pass over whole rows, which vectorises),
//! with the same order of summation.
//!
//! Flips are folded into the weight tables: reversing the output order of a
//! table gives exactly `flip(resize(x))`.

/// Per-output-index taps of one axis: `idx[o]` are four indices into the
/// cropped axis, `w[o]` their weights.
#[derive(Debug, Clone, Default)]
pub struct CubicAxis {
    pub idx: Vec<[u32; 4]>,
    pub w: Vec<[f32; 4]>,
}

const A: f32 = -0.75;

#[inline]
fn cubic1(x: f32) -> f32 {
    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
}

#[inline]
fn cubic2(x: f32) -> f32 {
    ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
}

/// PyTorch's `get_cubic_upsample_coefficients(t)` with A = −0.75.
#[inline]
pub fn cubic_coefficients(t: f32) -> [f32; 4] {
    let x2 = 1.0 - t;
    [cubic2(t + 1.0), cubic1(t), cubic1(x2), cubic2(x2 + 1.0)]
}

impl CubicAxis {
    /// Tables for resizing an axis of `in_size` samples to `out_size`,
    /// reversed (mirror of the output) if `flip`.
    pub fn new(in_size: usize, out_size: usize, flip: bool) -> Self {
        let mut axis = Self::default();
        axis.rebuild(in_size, out_size, flip);
        axis
    }

    /// Recompute the tables in place (reusing the allocations).
    pub fn rebuild(&mut self, in_size: usize, out_size: usize, flip: bool) {
        assert!(in_size > 0 && out_size > 0, "empty axis");
        assert!(in_size <= u32::MAX as usize, "axis too long");
        self.idx.clear();
        self.w.clear();
        // area_pixel_compute_scale<float>: (float)input_size / output_size.
        let scale = in_size as f32 / out_size as f32;
        let last = in_size as i64 - 1;
        for o in 0..out_size {
            let o = if flip { out_size - 1 - o } else { o };
            // area_pixel_compute_source_index(scale, o, align_corners=false, cubic=true)
            let real = scale * (o as f32 + 0.5) - 0.5;
            // guard_index_and_lambda
            let i0 = (real.floor() as i64).min(last);
            let t = (real - i0 as f32).clamp(0.0, 1.0);
            let mut idx = [0u32; 4];
            for (j, slot) in idx.iter_mut().enumerate() {
                *slot = (i0 - 1 + j as i64).clamp(0, last) as u32;
            }
            self.idx.push(idx);
            self.w.push(cubic_coefficients(t));
        }
    }

    pub fn len(&self) -> usize {
        self.idx.len()
    }

    pub fn is_empty(&self) -> bool {
        self.idx.is_empty()
    }
}

/// A rectangle inside an image: rows `top..top+height`, columns
/// `left..left+width` (torchvision's `(i, j, h, w)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CropRect {
    pub top: usize,
    pub left: usize,
    pub height: usize,
    pub width: usize,
}

impl CropRect {
    pub const fn new(top: usize, left: usize, height: usize, width: usize) -> Self {
        Self {
            top,
            left,
            height,
            width,
        }
    }

    /// Non-empty and inside an `height × width` image.
    pub fn fits(&self, height: usize, width: usize) -> bool {
        self.height > 0
            && self.width > 0
            && self
                .top
                .checked_add(self.height)
                .is_some_and(|b| b <= height)
            && self
                .left
                .checked_add(self.width)
                .is_some_and(|r| r <= width)
    }
}

/// Reusable buffers of the resampler (one per worker thread).
#[derive(Debug, Clone, Default)]
pub struct ResizeScratch {
    pub(crate) x: CubicAxis,
    pub(crate) y: CubicAxis,
    pub(crate) rows: Vec<f32>,
    /// The crop of one channel, transposed (column-major, rows padded to [`LANES`]).
    pub(crate) cols: Vec<f32>,
    /// Width-pass output of one channel, transposed likewise.
    pub(crate) colsout: Vec<f32>,
}

/// Vector block of the width pass (16 `f32` = one AVX-512 register, two AVX2 ones).
const LANES: usize = 16;

/// Crop `rect` out of the C×H×W image `src` (`height × width` planes) and
/// resize it bicubically to `out_h × out_w`, optionally mirrored, writing
/// C×out_h×out_w values to `out`.
///
/// Panics if the rectangle does not fit, or on buffer-length mismatches (the
/// checked entry points are [`super::ops::resized_crop`] and
/// [`super::MultiCropAugment`]).
#[allow(clippy::too_many_arguments)]
pub fn resized_crop_into(
    src: &[f32],
    channels: usize,
    height: usize,
    width: usize,
    rect: CropRect,
    out_h: usize,
    out_w: usize,
    hflip: bool,
    vflip: bool,
    out: &mut [f32],
    scratch: &mut ResizeScratch,
) {
    resized_crop_into_with(
        src,
        channels,
        height,
        width,
        rect,
        (out_h, out_w),
        (hflip, vflip),
        out,
        scratch,
        |_, _| {},
    );
}

/// [`resized_crop_into`] calling `post(channel, row)` on every output row right after it
/// is computed, while it is still in L1: the multi-crop pipeline fuses its element-wise
/// steps (brightness, normalisation) into the resize this way instead of making further
/// passes over a crop (1 MB for a 5×224² crop). The row values `post` sees are exactly
/// what [`resized_crop_into`] would have written.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn resized_crop_into_with(
    src: &[f32],
    channels: usize,
    height: usize,
    width: usize,
    rect: CropRect,
    (out_h, out_w): (usize, usize),
    (hflip, vflip): (bool, bool),
    out: &mut [f32],
    scratch: &mut ResizeScratch,
    mut post: impl FnMut(usize, &mut [f32]),
) {
    assert!(
        rect.fits(height, width),
        "crop {rect:?} outside {height}×{width}"
    );
    assert_eq!(src.len(), channels * height * width, "source length");
    assert_eq!(out.len(), channels * out_h * out_w, "output length");
    let ResizeScratch {
        x,
        y,
        rows,
        cols,
        colsout,
    } = scratch;
    x.rebuild(rect.width, out_w, hflip);
    y.rebuild(rect.height, out_h, vflip);

    // Width pass, vectorised over the crop's rows: with the crop transposed (columns
    // contiguous, padded to a multiple of LANES rows), each output column is a weighted sum
    // of four source columns; the result is transposed back into rows of out_w. Each value
    // is the same expression, in the same order, as the row-wise loop
    // `Σ_t row[idx_t]·w_t` (PyTorch's inner loop).
    let hp = rect.height.div_ceil(LANES) * LANES;
    rows.clear();
    rows.resize(channels * rect.height * out_w, 0.0);
    cols.clear();
    cols.resize(rect.width * hp, 0.0);
    colsout.clear();
    colsout.resize(out_w * hp, 0.0);
    let plane = height * width;
    for c in 0..channels {
        let src_plane = &src[c * plane..(c + 1) * plane];
        for r in 0..rect.height {
            let start = (rect.top + r) * width + rect.left;
            for (x, &v) in src_plane[start..start + rect.width].iter().enumerate() {
                cols[x * hp + r] = v;
            }
        }
        for ((dst, idx), w) in colsout.chunks_exact_mut(hp).zip(&x.idx).zip(&x.w) {
            let col = |t: usize| &cols[idx[t] as usize * hp..][..hp];
            let (a, b, cc, e) = (col(0), col(1), col(2), col(3));
            for ((((d, a), b), cc), e) in dst
                .chunks_exact_mut(LANES)
                .zip(a.chunks_exact(LANES))
                .zip(b.chunks_exact(LANES))
                .zip(cc.chunks_exact(LANES))
                .zip(e.chunks_exact(LANES))
            {
                for l in 0..LANES {
                    d[l] = a[l] * w[0] + b[l] * w[1] + cc[l] * w[2] + e[l] * w[3];
                }
            }
        }
        let dst_rows = &mut rows[c * rect.height * out_w..(c + 1) * rect.height * out_w];
        for (r, dst) in dst_rows.chunks_exact_mut(out_w).enumerate() {
            for (o, d) in dst.iter_mut().enumerate() {
                *d = colsout[o * hp + r];
            }
        }
    }

    // Height pass: whole output rows as weighted sums of four width-pass rows.
    for c in 0..channels {
        let rows_c = &rows[c * rect.height * out_w..(c + 1) * rect.height * out_w];
        let out_c = &mut out[c * out_h * out_w..(c + 1) * out_h * out_w];
        for ((dst, idx), w) in out_c.chunks_exact_mut(out_w).zip(&y.idx).zip(&y.w) {
            let r0 = &rows_c[idx[0] as usize * out_w..][..out_w];
            let r1 = &rows_c[idx[1] as usize * out_w..][..out_w];
            let r2 = &rows_c[idx[2] as usize * out_w..][..out_w];
            let r3 = &rows_c[idx[3] as usize * out_w..][..out_w];
            for ((((d, a), b), cc), e) in dst.iter_mut().zip(r0).zip(r1).zip(r2).zip(r3) {
                *d = a * w[0] + b * w[1] + cc * w[2] + e * w[3];
            }
            post(c, dst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_and_identity_resize() {
        for t in [0.0f32, 0.25, 0.5, 0.9] {
            let s: f32 = cubic_coefficients(t).iter().sum();
            assert!((s - 1.0).abs() < 1e-6);
        }
        // Same size: t = 0 everywhere, weights (0, 1, 0, 0): exact copy.
        let src: Vec<f32> = (0..2 * 5 * 7).map(|v| v as f32 * 0.1).collect();
        let mut out = vec![0.0; src.len()];
        let mut s = ResizeScratch::default();
        resized_crop_into(
            &src,
            2,
            5,
            7,
            CropRect::new(0, 0, 5, 7),
            5,
            7,
            false,
            false,
            &mut out,
            &mut s,
        );
        assert_eq!(out, src);
    }
}
