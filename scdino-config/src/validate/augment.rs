//! `augment:` — crop scales and sizes (a crop holds at least one patch of the model).
use crate::{AugmentSection, Invalid, ModelSection, Validator};

impl AugmentSection {
    pub(crate) fn validate(&self, v: &Validator, model: &ModelSection) -> Result<(), Invalid> {
        crop_scale(v, self.global_crops_scale, "augment.global_crops_scale")?;
        crop_scale(v, self.local_crops_scale, "augment.local_crops_scale")?;
        for (size, key) in [
            (self.global_crop_size, "augment.global_crop_size"),
            (self.local_crop_size, "augment.local_crop_size"),
        ] {
            v.check(
                size >= model.patch_size,
                key,
                &format!(
                    "is {size} px, smaller than one {} px patch",
                    model.patch_size
                ),
            )?;
        }
        Ok(())
    }
}

/// Both ends of a crop scale are fractions of the image area, smaller first.
fn crop_scale(v: &Validator, (lo, hi): (f64, f64), key: &str) -> Result<(), Invalid> {
    v.check(
        lo > 0.0 && hi <= 1.0,
        key,
        &format!("[{lo}, {hi}]: both ends are fractions of the image area and must lie in (0, 1]"),
    )?;
    v.check(
        lo <= hi,
        key,
        &format!("[{lo}, {hi}]: the smaller scale must come first"),
    )
}
