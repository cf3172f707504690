//! Resampling learned position embeddings to another patch grid, the way the code that trained
//! them does it: a model keeps its training grid's embeddings and resamples them for each
//! input, and features only equal the source's if the resampling is the source's own.
use tch::Tensor;

/// Whose resampling a model's position embeddings follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PosResample {
    /// DINO's `interpolate_pos_encoding` (scDINO, our own runs): bicubic with the `+0.1`
    /// scale factors, no antialiasing.
    #[default]
    Dino,
    /// timm's `resample_abs_pos_embed` (a timm model with `dynamic_img_size=True`): bicubic to
    /// the target grid with `antialias=True` (PyTorch's `_upsample_bicubic2d_aa`, whose kernel
    /// differs from the plain bicubic one even when upsampling), `align_corners=False`.
    Timm,
}

/// The patch part of the position embeddings (`[1, g·g, D]`, a square grid `g × g`) for an
/// input of `h × w` patches, by `how`. The grid itself comes back unchanged (not recomputed),
/// as both sources return it.
pub fn resample(patch_pos: &Tensor, how: PosResample, h: i64, w: i64) -> Tensor {
    let (_, n, d) = patch_pos
        .size3()
        .expect("position embeddings are [1, N, D]");
    let side = (n as f64).sqrt() as i64;
    assert_eq!(side * side, n, "the trained patch grid is square");
    if h == side && w == side {
        return patch_pos.shallow_clone();
    }
    let grid = patch_pos.reshape([1, side, side, d]).permute([0, 3, 1, 2]);
    let out = match how {
        PosResample::Dino => {
            // DINO computes the scale factors with +0.1 against floor rounding and passes
            // them to the kernel, so they are given exactly.
            let (scale_h, scale_w) = (
                (h as f64 + 0.1) / side as f64,
                (w as f64 + 0.1) / side as f64,
            );
            let out_h = (side as f64 * scale_h) as i64;
            let out_w = (side as f64 * scale_w) as i64;
            grid.upsample_bicubic2d([out_h, out_w], false, scale_h, scale_w)
        }
        PosResample::Timm => grid.internal_upsample_bicubic2d_aa([h, w], false, None, None),
    };
    out.permute([0, 2, 3, 1]).reshape([1, -1, d])
}
