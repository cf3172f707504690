//! Boxes around cell centres, cut from a site with zeros outside it.
use super::Region;
use crate::data::chw::{Chw, ImageChw};

/// What happens to a cell whose box reaches outside its site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Border {
    /// Left out of the dataset (counted and reported), as CellProfiler-based pipelines do
    /// when they export crops.
    Skip,
    /// Kept, with zeros outside the site, as DeepProfiler's `crop_and_resize` fills them.
    Pad,
}

/// The `box_size`×`box_size` box centred on (`x`, `y`) (CellProfiler's `Location_Center_X/Y`:
/// X is the column, Y the row, 0-based). The centre pixel is the nearest one (halves round
/// up), and the box has `box_size / 2` pixels before it, as `numpy` slicing
/// `[c - b//2 : c - b//2 + b]`: the centre of mass of an object that fills a box (for an even
/// box, `x0 + (b-1)/2`) gives back that box.
pub fn box_around(x: f64, y: f64, box_size: usize) -> Region {
    let half = (box_size / 2) as i64;
    Region {
        y0: (y + 0.5).floor() as i64 - half,
        x0: (x + 0.5).floor() as i64 - half,
        height: box_size,
        width: box_size,
    }
}

/// True if `region` lies wholly inside an image of `height`×`width`.
pub fn inside(region: Region, height: usize, width: usize) -> bool {
    region.y0 >= 0
        && region.x0 >= 0
        && region.y0 as u64 + region.height as u64 <= height as u64
        && region.x0 as u64 + region.width as u64 <= width as u64
}

/// `region` of every channel of `image`, zero where it lies outside the image.
pub fn cut<T: Copy + Default>(image: &Chw<T>, region: Region) -> Chw<T> {
    let (h, w) = (region.height, region.width);
    let mut data = vec![T::default(); image.channels * h * w];
    // The rows and columns of the region that fall inside the image.
    let ys = overlap(region.y0, h, image.height);
    let xs = overlap(region.x0, w, image.width);
    if let (Some((ry, iy, ny)), Some((rx, ix, nx))) = (ys, xs) {
        for c in 0..image.channels {
            let plane = image.channel(c);
            for dy in 0..ny {
                let src = (iy + dy) * image.width + ix;
                let dst = (c * h + ry + dy) * w + rx;
                data[dst..dst + nx].copy_from_slice(&plane[src..src + nx]);
            }
        }
    }
    Chw {
        channels: image.channels,
        height: h,
        width: w,
        data,
    }
}

/// Where a span of `len` starting at `start` meets `0..size`: (offset in the span, offset in
/// the image, length), or `None` when they do not meet.
fn overlap(start: i64, len: usize, size: usize) -> Option<(usize, usize, usize)> {
    let lo = start.max(0);
    let hi = (start + len as i64).min(size as i64);
    (hi > lo).then(|| ((lo - start) as usize, lo as usize, (hi - lo) as usize))
}

/// [`cut`] into an `f32` image, the type the loader reads.
pub fn cut_f32(image: &ImageChw, region: Region) -> ImageChw {
    cut(image, region)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(c: usize, h: usize, w: usize) -> Chw<u32> {
        Chw::new(c, h, w, (0..(c * h * w) as u32).collect()).unwrap()
    }

    #[test]
    fn a_box_inside_is_a_plain_slice() {
        let img = ramp(2, 6, 7);
        // An object filling rows/columns 2..6 has its centre of mass at 3.5.
        let r = box_around(3.5, 3.5, 4);
        assert_eq!((r.y0, r.x0), (2, 2));
        let r = box_around(3.4, 2.2, 3);
        assert_eq!((r.y0, r.x0), (1, 2));
        assert!(inside(r, 6, 7));
        let out = cut(&img, r);
        for c in 0..2 {
            for y in 0..3 {
                for x in 0..3 {
                    assert_eq!(out.get(c, y, x), img.get(c, 1 + y, 2 + x));
                }
            }
        }
    }

    #[test]
    fn a_box_over_the_edge_is_zero_outside() {
        let img = ramp(1, 4, 4);
        let r = box_around(0.0, 3.0, 4);
        assert_eq!((r.y0, r.x0), (1, -2));
        assert!(!inside(r, 4, 4));
        let out = cut(&img, r);
        assert_eq!(out.get(0, 0, 0), 0);
        assert_eq!(out.get(0, 0, 2), img.get(0, 1, 0));
        assert_eq!(out.get(0, 2, 3), img.get(0, 3, 1));
        assert_eq!(out.get(0, 3, 3), 0, "row 4 is past the bottom");
        // A box wholly outside is all zeros, not a panic.
        let far = cut(
            &img,
            Region {
                y0: 10,
                x0: -10,
                height: 2,
                width: 2,
            },
        );
        assert!(far.data.iter().all(|&v| v == 0));
    }
}
