//! Random crop geometry: torchvision's `RandomResizedCrop.get_params`.
//!
//! Copied from torchvision (`transforms.py`, identical in 0.9.1 and 0.28):
//!
//! ```text
//! log_ratio = torch.log(torch.tensor(ratio))            # float32
//! for _ in range(10):
//!     target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
//!     aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
//!     w = int(round(math.sqrt(target_area * aspect_ratio)))
//!     h = int(round(math.sqrt(target_area / aspect_ratio)))
//!     if 0 < w <= width and 0 < h <= height:
//!         i = torch.randint(0, height - h + 1, size=(1,)).item()
//!         j = torch.randint(0, width - w + 1, size=(1,)).item()
//!         return i, j, h, w
//! # fallback: central crop with the aspect ratio clamped to `ratio`
//! ```
//!
//! The two uniforms are float32 draws in torch; we draw them in `f32` the
//! same way (`u·(b − a) + a`) and do the rest in `f64`, with Python's
//! round-half-to-even.

use super::resize::CropRect;
use super::rng::SampleRng;

/// Aspect-ratio range of scDINO's `RandomResizedCrop` (torchvision default).
pub const SCDINO_RATIO: (f64, f64) = (3.0 / 4.0, 4.0 / 3.0);

/// Python's `int(round(x))` for the non-negative finite values used here.
#[inline]
fn py_round(x: f64) -> i64 {
    x.round_ties_even() as i64
}

/// The `(h, w)` of one `get_params` attempt with the given target area (in
/// pixels) and aspect ratio, or `None` if the attempt is rejected.
pub fn crop_size_for_attempt(
    height: usize,
    width: usize,
    target_area: f64,
    aspect_ratio: f64,
) -> Option<(usize, usize)> {
    let w = py_round((target_area * aspect_ratio).sqrt());
    let h = py_round((target_area / aspect_ratio).sqrt());
    (0 < w && w as usize <= width && 0 < h && h as usize <= height)
        .then_some((h as usize, w as usize))
}

/// torchvision's fallback after ten rejected attempts: the largest centred
/// crop whose aspect ratio lies in `ratio`.
pub fn fallback_crop(height: usize, width: usize, ratio: (f64, f64)) -> CropRect {
    let in_ratio = width as f64 / height as f64;
    let (rmin, rmax) = (ratio.0.min(ratio.1), ratio.0.max(ratio.1));
    let (h, w) = if in_ratio < rmin {
        (py_round(width as f64 / rmin) as usize, width)
    } else if in_ratio > rmax {
        (height, py_round(height as f64 * rmax) as usize)
    } else {
        (height, width)
    };
    CropRect::new((height - h) / 2, (width - w) / 2, h, w)
}

/// `RandomResizedCrop.get_params(img, scale, ratio)` for a `height × width`
/// image, drawing from `rng`. Returns torchvision's `(i, j, h, w)` as a
/// [`CropRect`].
pub fn random_resized_crop_params(
    height: usize,
    width: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut SampleRng,
) -> CropRect {
    assert!(height > 0 && width > 0, "empty image");
    let area = (height * width) as f64;
    let log_ratio = ((ratio.0 as f32).ln(), (ratio.1 as f32).ln());
    for _ in 0..10 {
        let s = rng.uniform_range_f32(scale.0 as f32, scale.1 as f32);
        let target_area = area * s as f64;
        let aspect_ratio = rng.uniform_range_f32(log_ratio.0, log_ratio.1).exp() as f64;
        if let Some((h, w)) = crop_size_for_attempt(height, width, target_area, aspect_ratio) {
            let i = rng.int_range(0, (height - h + 1) as i64) as usize;
            let j = rng.int_range(0, (width - w + 1) as i64) as usize;
            return CropRect::new(i, j, h, w);
        }
    }
    fallback_crop(height, width, ratio)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_rounding() {
        // sqrt(6.25) = 2.5 → 2 (half to even), sqrt(12.25) = 3.5 → 4.
        assert_eq!(crop_size_for_attempt(10, 10, 6.25, 1.0), Some((2, 2)));
        assert_eq!(crop_size_for_attempt(10, 10, 12.25, 1.0), Some((4, 4)));
        assert_eq!(crop_size_for_attempt(10, 10, 0.2, 1.0), None);
        assert_eq!(crop_size_for_attempt(10, 10, 121.0, 1.0), None);
    }

    #[test]
    fn fallback_matches_torchvision_logic() {
        assert_eq!(
            fallback_crop(50, 50, SCDINO_RATIO),
            CropRect::new(0, 0, 50, 50)
        );
        // in_ratio 5 > 4/3: h = 10, w = round(13.33) = 13, j = (50 − 13) // 2.
        assert_eq!(
            fallback_crop(10, 50, SCDINO_RATIO),
            CropRect::new(0, 18, 10, 13)
        );
        // in_ratio 0.2 < 3/4: w = 10, h = round(13.33) = 13.
        assert_eq!(
            fallback_crop(50, 10, SCDINO_RATIO),
            CropRect::new(18, 0, 13, 10)
        );
    }
}
