//! Label images (0 = background, one value per object): where their objects are, and which
//! pixels of a crop belong to the object it is centred on.
use super::{Labels, ScreenError};
use crate::data::chw::{Chw, ImageChw};

/// A decoded single-channel label image as integers; a value that is not a whole number
/// from 0 to 2^24 (exact in the decoder's `f32`) is refused naming `name`.
pub fn from_plane(plane: &ImageChw, name: &str) -> Result<Labels, ScreenError> {
    if plane.channels != 1 {
        return Err(ScreenError::table(
            name,
            format!("a label image has one channel, this one {}", plane.channels),
        ));
    }
    let mut data = Vec::with_capacity(plane.data.len());
    for (i, &v) in plane.data.iter().enumerate() {
        if !(v >= 0.0 && v.fract() == 0.0 && v <= 16_777_216.0) {
            return Err(ScreenError::table(
                name,
                format!(
                    "pixel (row {}, column {}) is {v}: labels are whole numbers ≥ 0",
                    i / plane.width,
                    i % plane.width
                ),
            ));
        }
        data.push(v as u32);
    }
    Ok(Chw {
        channels: 1,
        height: plane.height,
        width: plane.width,
        data,
    })
}

/// One object of a label image: its label and the mean (column, row) of its pixels, which is
/// CellProfiler's `Location_Center_X/Y` (`scipy.ndimage.center_of_mass`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Centroid {
    pub label: u32,
    pub x: f64,
    pub y: f64,
}

/// Every object of `labels`, by label.
pub fn centroids(labels: &Labels) -> Vec<Centroid> {
    // (count, Σx, Σy) per label, in a map sized by the labels present.
    let mut sums: std::collections::BTreeMap<u32, (u64, u64, u64)> = Default::default();
    for (i, &l) in labels.data.iter().enumerate() {
        if l != 0 {
            let e = sums.entry(l).or_default();
            e.0 += 1;
            e.1 += (i % labels.width) as u64;
            e.2 += (i / labels.width) as u64;
        }
    }
    sums.into_iter()
        .map(|(label, (n, sx, sy))| Centroid {
            label,
            x: sx as f64 / n as f64,
            y: sy as f64 / n as f64,
        })
        .collect()
}

/// Zeroes every pixel of `crop` that is not object `label` in `labels_crop` (the same region
/// of the label image): DeepProfiler's `mask_objects`.
pub fn mask(crop: &mut ImageChw, labels_crop: &Labels, label: u32) {
    let n = crop.plane_len();
    for c in 0..crop.channels {
        let plane = &mut crop.data[c * n..(c + 1) * n];
        for (v, &l) in plane.iter_mut().zip(&labels_crop.data) {
            if l != label {
                *v = 0.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn centroids_are_centres_of_mass_and_masks_keep_one_object() {
        #[rustfmt::skip]
        let labels = Chw::new(1, 3, 4, vec![
            0, 1, 1, 0,
            0, 1, 0, 2,
            0, 0, 0, 2,
        ]).unwrap();
        let c = centroids(&labels);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].label, c[0].x, c[0].y), (1, 4.0 / 3.0, 1.0 / 3.0));
        assert_eq!((c[1].label, c[1].x, c[1].y), (2, 3.0, 1.5));
        let mut crop = ImageChw::new(1, 3, 4, vec![1.0; 12]).unwrap();
        mask(&mut crop, &labels, 2);
        assert_eq!(crop.data.iter().sum::<f32>(), 2.0);
        let plane = ImageChw::new(1, 1, 2, vec![1.0, 2.5]).unwrap();
        let e = from_plane(&plane, "l.tiff").unwrap_err().to_string();
        assert!(e.contains("l.tiff") && e.contains("2.5"), "{e}");
    }
}
