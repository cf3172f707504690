//! Colour maps: seaborn's `hls` palette for classes (scDINO's UMAP plot) and viridis for
//! heatmaps (matplotlib's default, which scDINO's attention PNGs use).
use plotters::style::RGBColor;

/// seaborn `color_palette("hls", n)`: hues evenly spaced from 0.01, lightness 0.6,
/// saturation 0.65.
pub fn hls_palette(n: usize) -> Vec<RGBColor> {
    (0..n)
        .map(|i| {
            let h = (0.01 + i as f64 / n.max(1) as f64).fract();
            let (r, g, b) = hls_to_rgb(h, 0.6, 0.65);
            RGBColor(
                (r * 255.0).round() as u8,
                (g * 255.0).round() as u8,
                (b * 255.0).round() as u8,
            )
        })
        .collect()
}

/// Python's `colorsys.hls_to_rgb`.
fn hls_to_rgb(h: f64, l: f64, s: f64) -> (f64, f64, f64) {
    if s == 0.0 {
        return (l, l, l);
    }
    let m2 = if l <= 0.5 {
        l * (1.0 + s)
    } else {
        l + s - l * s
    };
    let m1 = 2.0 * l - m2;
    let v = |hue: f64| {
        let hue = hue.rem_euclid(1.0);
        if hue < 1.0 / 6.0 {
            m1 + (m2 - m1) * hue * 6.0
        } else if hue < 0.5 {
            m2
        } else if hue < 2.0 / 3.0 {
            m1 + (m2 - m1) * (2.0 / 3.0 - hue) * 6.0
        } else {
            m1
        }
    };
    (v(h + 1.0 / 3.0), v(h), v(h - 1.0 / 3.0))
}

/// Viridis at `t` ∈ [0, 1] (clamped; NaN maps to 0).
pub fn viridis(t: f32) -> [u8; 3] {
    use plotters::style::colors::colormaps::ViridisRGB;
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    let c = ViridisRGB::get_color(t);
    [c.0, c.1, c.2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hls_matches_colorsys() {
        // colorsys.hls_to_rgb(0.01, 0.6, 0.65) = (0.86, 0.3712, 0.34) (values from CPython).
        let (r, g, b) = hls_to_rgb(0.01, 0.6, 0.65);
        assert!((r - 0.86).abs() < 1e-9 && (g - 0.3712).abs() < 1e-9 && (b - 0.34).abs() < 1e-9);
        assert_eq!(hls_palette(3).len(), 3);
    }

    #[test]
    fn viridis_matches_matplotlib_within_three_levels() {
        // matplotlib: viridis(0) = #440154, viridis(0.5) = #21918c, viridis(1) = #fde725.
        // plotters interpolates a coarser control-point table: up to 2 levels off mid-range.
        for (t, want) in [
            (0.0, [0x44, 0x01, 0x54]),
            (0.5, [0x21, 0x91, 0x8c]),
            (1.0, [0xfd, 0xe7, 0x25]),
        ] {
            let got = viridis(t);
            for c in 0..3 {
                assert!(
                    (got[c] as i32 - want[c]).abs() <= 3,
                    "viridis({t}) = {got:?}, matplotlib {want:?}"
                );
            }
        }
    }
}
