//! The multi-crop augmentation as batched tensor operations on the training device
//! (`augment.augment_on: device`).
//!
//! The loader's workers then only read and min–max scale (fixed-size C×H×W images, one
//! `[B, C, H, W]` tensor per batch); this module turns that batch into the crops. The random
//! parameters of every crop come from [`MultiCropAugment::sample_params`] with the same
//! `(seed, epoch, index)` keys as the CPU path, so both paths draw exactly the same crops,
//! flips, brightness factors, blur σ and solarisation decisions. Per crop `k`:
//!
//! * crop + bicubic resize + flips: one affine grid per sample and bicubic `grid_sample`
//!   (`align_corners = false`, border padding). The affine maps output pixel centres to the
//!   same source coordinates as `F.interpolate(crop, bicubic, align_corners=False)`
//!   (`x = left + (w/S)(o + ½) − ½`), a flip negates the scale. Inside the crop the two are
//!   equal (to ~1e-6); they differ only where a bicubic tap falls outside the crop
//!   rectangle: `interpolate` on the cut-out crop repeats the crop's edge pixel, the grid
//!   reads the real neighbour (clamped at the image border). That touches the outermost
//!   one or two output pixels' worth of source on each side of a crop;
//! * brightness: `clamp(f_c·x, 0, 1)` on the samples whose branch fired;
//! * blur: reflect padding 2 and two depthwise (grouped) convolutions with each sample's
//!   5-tap kernel ([`gaussian_kernel5`], the CPU path's weights), on the samples that blur;
//! * solarisation (global crop 2): `x > 0.5 → 1 − x` on the samples that solarise;
//! * normalisation with the dataset mean/std.
//!
//! Everything runs on the device of the input tensor (CPU in tests and benchmarks here).
use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use super::multicrop_augment::{CropParams, MultiCropAugment, SOLARIZE_THRESHOLD};
use super::ops::gaussian_kernel5;
use super::rng::SampleKey;
use super::AugmentError;

/// `grid_sample` interpolation mode 2 (bicubic) and padding mode 1 (border).
const BICUBIC: i64 = 2;
const BORDER: i64 = 1;

/// Batched multi-crop augmentation (see the module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct DeviceAugment {
    augment: Arc<MultiCropAugment>,
}

impl DeviceAugment {
    pub fn new(augment: Arc<MultiCropAugment>) -> Self {
        Self { augment }
    }

    /// The shared parameter sampler and configuration.
    pub fn sampler(&self) -> &MultiCropAugment {
        &self.augment
    }

    /// The crops `[global1, global2, local1..N]` (each `[B, C, S, S]`, on `images`' device)
    /// of a `[B, C, H, W]` batch of min–max-scaled images; row `b` is augmented with
    /// `keys[b]`.
    pub fn apply(&self, images: &Tensor, keys: &[SampleKey]) -> Result<Vec<Tensor>, AugmentError> {
        let (_, _, h, w) = self.check(images, keys.len())?;
        let params: Vec<Vec<CropParams>> = keys
            .iter()
            .map(|&key| self.augment.plan(h, w, key))
            .collect();
        self.render(images, &params)
    }

    /// The crops for explicit parameters: `params[b][k]` is crop `k` of row `b` (e.g. from
    /// [`MultiCropAugment::plan`]).
    pub fn render(
        &self,
        images: &Tensor,
        params: &[Vec<CropParams>],
    ) -> Result<Vec<Tensor>, AugmentError> {
        let (_, c, h, w) = self.check(images, params.len())?;
        let ncrops = self.augment.num_crops();
        for (b, p) in params.iter().enumerate() {
            if p.len() != ncrops {
                return Err(AugmentError::InvalidArgument(format!(
                    "row {b}: {} crop parameters, expected {ncrops}",
                    p.len()
                )));
            }
            for (k, q) in p.iter().enumerate() {
                let ok = q.rect.fits(h, w)
                    && q.out_size == self.augment.policy(k).size
                    && (q.brightness.is_empty() || q.brightness.len() == c);
                if !ok {
                    return Err(AugmentError::InvalidArgument(format!(
                        "row {b} crop {k}: bad parameters {q:?} for a {h}×{w} image"
                    )));
                }
            }
        }
        let images = images.to_kind(Kind::Float);
        let cfg = self.augment.config();
        let dev = images.device();
        let mean = Tensor::from_slice(&cfg.mean)
            .view([1, c as i64, 1, 1])
            .to_device(dev);
        let std = Tensor::from_slice(&cfg.std)
            .view([1, c as i64, 1, 1])
            .to_device(dev);
        let crops = (0..ncrops)
            .map(|k| {
                let p: Vec<&CropParams> = params.iter().map(|row| &row[k]).collect();
                let x = resample(&images, &p, h, w);
                let x = brightness(x, &p, dev);
                let x = blur(x, &p, dev);
                let x = solarize(x, &p, dev);
                (x - &mean) / &std
            })
            .collect();
        Ok(crops)
    }

    fn check(
        &self,
        images: &Tensor,
        rows: usize,
    ) -> Result<(usize, usize, usize, usize), AugmentError> {
        let size = images.size();
        let [b, c, h, w] = size[..] else {
            return Err(AugmentError::InvalidArgument(format!(
                "expected a [B, C, H, W] batch, got shape {size:?}"
            )));
        };
        let (b, c, h, w) = (b as usize, c as usize, h as usize, w as usize);
        if c != self.augment.channels() {
            return Err(AugmentError::ChannelMismatch {
                what: "image batch (vs. mean/std)".into(),
                expected: self.augment.channels(),
                got: c,
            });
        }
        if b != rows {
            return Err(AugmentError::InvalidArgument(format!(
                "{b} images but {rows} sample keys/parameter rows"
            )));
        }
        if h == 0 || w == 0 {
            return Err(AugmentError::EmptyImage);
        }
        Ok((b, c, h, w))
    }
}

/// Rows whose flag is set, as an index tensor (None if no row is selected).
fn rows_where(p: &[&CropParams], f: impl Fn(&CropParams) -> bool, dev: Device) -> Option<Tensor> {
    let idx: Vec<i64> = p
        .iter()
        .enumerate()
        .filter(|(_, q)| f(q))
        .map(|(b, _)| b as i64)
        .collect();
    (!idx.is_empty()).then(|| Tensor::from_slice(&idx).to_device(dev))
}

/// Crop + bicubic resize + flips of every row, as one `grid_sample`.
fn resample(images: &Tensor, p: &[&CropParams], h: usize, w: usize) -> Tensor {
    let (b, c) = (p.len() as i64, images.size()[1]);
    let s = p[0].out_size as i64;
    let mut theta = Vec::with_capacity(6 * p.len());
    for q in p {
        let r = q.rect;
        // Output normalised u = (2o+1)/S − 1 must land on input normalised
        // g = (2x+1)/W − 1 with x = left + (w_c/S)(o+½) − ½, i.e.
        // g = (w_c/W)·u + (2·left + w_c)/W − 1; a flip maps u to −u.
        let axis = |start: usize, len: usize, full: usize, flip: bool| {
            let scale = len as f64 / full as f64;
            let shift = (2 * start + len) as f64 / full as f64 - 1.0;
            ((if flip { -scale } else { scale }) as f32, shift as f32)
        };
        let (sx, tx) = axis(r.left, r.width, w, q.hflip);
        let (sy, ty) = axis(r.top, r.height, h, q.vflip);
        theta.extend_from_slice(&[sx, 0.0, tx, 0.0, sy, ty]);
    }
    let theta = Tensor::from_slice(&theta)
        .view([b, 2, 3])
        .to_device(images.device());
    let grid = Tensor::affine_grid_generator(&theta, [b, c, s, s], false);
    images.grid_sampler(&grid, BICUBIC, BORDER, false)
}

fn brightness(x: Tensor, p: &[&CropParams], dev: Device) -> Tensor {
    let Some(idx) = rows_where(p, |q| !q.brightness.is_empty(), dev) else {
        return x;
    };
    let c = x.size()[1];
    let f: Vec<f32> = p
        .iter()
        .flat_map(|q| q.brightness.iter().copied())
        .collect();
    let f = Tensor::from_slice(&f).view([-1, c, 1, 1]).to_device(dev);
    let sub = (x.index_select(0, &idx) * f).clamp(0.0, 1.0);
    x.index_copy(0, &idx, &sub)
}

fn blur(x: Tensor, p: &[&CropParams], dev: Device) -> Tensor {
    let Some(idx) = rows_where(p, |q| q.blur_sigma.is_some(), dev) else {
        return x;
    };
    let size = x.size();
    let (c, s) = (size[1], size[2]);
    let mut k: Vec<f32> = Vec::new();
    for q in p {
        if let Some(sigma) = q.blur_sigma {
            let taps = gaussian_kernel5(sigma);
            for _ in 0..c {
                k.extend_from_slice(&taps);
            }
        }
    }
    let n = idx.size()[0];
    let groups = n * c;
    let k = Tensor::from_slice(&k).to_device(dev);
    let kx = k.view([groups, 1, 1, 5]);
    let ky = k.view([groups, 1, 5, 1]);
    let sub = x
        .index_select(0, &idx)
        .reshape([1, groups, s, s])
        .reflection_pad2d([2, 2, 2, 2])
        .conv2d(&kx, None::<Tensor>, [1, 1], [0, 0], [1, 1], groups)
        .conv2d(&ky, None::<Tensor>, [1, 1], [0, 0], [1, 1], groups)
        .reshape([n, c, s, s]);
    x.index_copy(0, &idx, &sub)
}

fn solarize(x: Tensor, p: &[&CropParams], dev: Device) -> Tensor {
    let Some(idx) = rows_where(p, |q| q.solarize, dev) else {
        return x;
    };
    let sub = x.index_select(0, &idx);
    let flipped = sub.gt(SOLARIZE_THRESHOLD as f64);
    let sub = (sub.neg() + 1.0).where_self(&flipped, &sub);
    x.index_copy(0, &idx, &sub)
}
