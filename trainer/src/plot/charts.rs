//! The three chart kinds the analyses draw.
use super::{colors, render, render_png, write_png, PlotError};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

/// A class-coloured 2-D scatter (scDINO's `plot_in_2D.py`: hls palette, small opaque dots,
/// no ticks, legend "Classes" at the lower left).
pub struct ScatterSpec<'a> {
    pub points: &'a [[f32; 2]],
    /// Index into `class_names` per point.
    pub labels: &'a [usize],
    pub class_names: &'a [String],
    pub title: &'a str,
    pub subtitle: &'a str,
    pub width: u32,
    pub height: u32,
}

pub fn scatter_png(path: &Path, spec: &ScatterSpec) -> Result<(), PlotError> {
    let rgb = scatter_rgb(path, spec)?;
    write_png(path, &rgb, spec.width, spec.height)
}

/// [`scatter_png`] plus the same chart as a vector PDF page at `dpi` (scDINO's
/// `pdf_format/` copy; the pixel size at `dpi` gives the page size).
pub fn scatter_png_and_pdf(
    png: &Path,
    pdf: &Path,
    dpi: f64,
    spec: &ScatterSpec,
) -> Result<(), PlotError> {
    scatter_png(png, spec)?;
    check_scatter(spec)?;
    super::write_vector_pdf(pdf, spec.width, spec.height, dpi, |root| {
        draw_scatter(root, spec)
    })
}

fn scatter_rgb(path: &Path, spec: &ScatterSpec) -> Result<Vec<u8>, PlotError> {
    check_scatter(spec)?;
    render(path, spec.width, spec.height, |root| {
        draw_scatter(root, spec)
    })
}

fn check_scatter(spec: &ScatterSpec) -> Result<(), PlotError> {
    if spec.points.len() != spec.labels.len() {
        return Err(PlotError::PointsWithoutLabels {
            points: spec.points.len(),
            labels: spec.labels.len(),
        });
    }
    if let Some(&bad) = spec.labels.iter().find(|&&l| l >= spec.class_names.len()) {
        return Err(PlotError::UnknownLabel {
            label: bad,
            classes: spec.class_names.len(),
        });
    }
    Ok(())
}

/// The scatter on any plotters backend (the PNG's bitmap, the PDF's vector page).
fn draw_scatter<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ScatterSpec,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let (mut x0, mut x1, mut y0, mut y1) = (f32::MAX, f32::MIN, f32::MAX, f32::MIN);
    for p in spec.points {
        x0 = x0.min(p[0]);
        x1 = x1.max(p[0]);
        y0 = y0.min(p[1]);
        y1 = y1.max(p[1]);
    }
    if spec.points.is_empty() {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad = |a: f32, b: f32| ((b - a).max(1e-6)) * 0.03;
    let (px, py) = (pad(x0, x1), pad(y0, y1));
    let palette = colors::hls_palette(spec.class_names.len());
    {
        let (title_area, body) = root.split_vertically(70);
        title_area.draw(&Text::new(
            spec.title.to_string(),
            (20, 8),
            ("sans-serif", 26).into_font(),
        ))?;
        title_area.draw(&Text::new(
            spec.subtitle.to_string(),
            (20, 42),
            ("sans-serif", 16).into_font().color(&RGBColor(90, 90, 90)),
        ))?;
        let mut chart = ChartBuilder::on(&body)
            .margin(15)
            .build_cartesian_2d((x0 - px)..(x1 + px), (y0 - py)..(y1 + py))?;
        let radius = if spec.points.len() > 5000 { 2 } else { 3 };
        for (class, colour) in palette.iter().enumerate() {
            chart
                .draw_series(
                    spec.points
                        .iter()
                        .zip(spec.labels)
                        .filter(|(_, &l)| l == class)
                        .map(|(p, _)| Circle::new((p[0], p[1]), radius, colour.mix(0.9).filled())),
                )?
                .label(spec.class_names[class].clone())
                .legend(move |(x, y)| Circle::new((x + 6, y), 5, colour.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 16))
            .draw()?;
        Ok(())
    }
}

/// One named curve of a line chart.
pub struct Curve {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart (training curves); the y axis is logarithmic when `log_y`, every value is
/// positive and they span more than two decades.
pub fn lines_png(
    path: &Path,
    title: &str,
    x_label: &str,
    series: &[Curve],
    log_y: bool,
) -> Result<(), PlotError> {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let finite = |v: &&(f64, f64)| v.0.is_finite() && v.1.is_finite();
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all().filter(finite) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 == x0 {
        x1 = x0 + 1.0;
    }
    if y1 == y0 {
        y1 = y0 + y0.abs().max(1.0) * 0.1;
    }
    let palette = colors::hls_palette(series.len().max(1));
    // The report shows these 900 px wide charts at about 600 px: the fonts are sized for that
    // (checked in a browser screenshot: about 13 px on screen), the grid is one light line per labelled tick (plotters'
    // default adds ten faint lines between ticks, which buried the curve), and the y axis is
    // named after a single curve.
    let y_label = match series {
        [one] => one.name.as_str(),
        _ => "",
    };
    let integral_x = all().all(|p| p.0.fract() == 0.0);
    render_png(path, 900, 420, |root| {
        // A log axis only labels powers of ten: over less than two decades it would show one
        // label or none, so such a range is drawn linear.
        let log = log_y && y0 > 0.0 && y1 / y0 > 100.0;
        let mut builder = ChartBuilder::on(root);
        builder
            .caption(title, ("sans-serif", 34))
            .margin(14)
            .x_label_area_size(70)
            .y_label_area_size(120);
        macro_rules! draw {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc(x_label)
                    .y_desc(y_label)
                    .x_labels(if integral_x {
                        ((x1 - x0) as usize + 1).min(10)
                    } else {
                        8
                    })
                    .y_labels(6)
                    .x_label_formatter(&|v| tick_label(*v))
                    .y_label_formatter(&|v| tick_label(*v))
                    .label_style(("sans-serif", 28))
                    .axis_desc_style(("sans-serif", 28))
                    .light_line_style(TRANSPARENT)
                    .bold_line_style(BLACK.mix(0.15))
                    .draw()?;
                for (s, colour) in series.iter().zip(&palette) {
                    let colour = *colour;
                    chart
                        .draw_series(LineSeries::new(
                            s.points.iter().copied().filter(|p| finite(&p)),
                            colour.stroke_width(2),
                        ))?
                        .label(s.name.clone())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                        });
                }
                if series.len() > 1 {
                    chart
                        .configure_series_labels()
                        .background_style(WHITE.mix(0.85))
                        .border_style(BLACK.mix(0.3))
                        .label_font(("sans-serif", 14))
                        .draw()?;
                }
            }};
        }
        if log {
            draw!(builder.build_cartesian_2d(x0..x1, (y0 * 0.9..y1 * 1.1).log_scale())?);
        } else {
            let pad = (y1 - y0) * 0.05;
            draw!(builder.build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))?);
        }
        Ok(())
    })
}

/// A tick label short enough for the axis: integers as integers, ordinary magnitudes with at
/// most four significant digits, the rest in scientific notation (learning rates).
fn tick_label(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".into()
    } else if v.fract() == 0.0 && a < 1e6 {
        format!("{v:.0}")
    } else if (1e-2..1e4).contains(&a) {
        let decimals = (3 - a.log10().floor() as i32).clamp(0, 5) as usize;
        let s = format!("{v:.decimals$}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.1e}")
    }
}

/// Confusion-matrix heatmap: rows are true classes, columns predictions; each cell is
/// coloured by its row-normalised rate and labelled with its count.
pub fn confusion_png(
    path: &Path,
    matrix: &[Vec<u64>],
    class_names: &[String],
) -> Result<(), PlotError> {
    let n = class_names.len();
    if matrix.len() != n || matrix.iter().any(|r| r.len() != n) {
        return Err(PlotError::NotSquare { classes: n });
    }
    let size = (200 + 70 * n as u32).clamp(480, 1600);
    render_png(path, size, size, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption("Confusion matrix (rows: true class)", ("sans-serif", 30))
            .margin(12)
            .x_label_area_size(80)
            .y_label_area_size(110)
            .build_cartesian_2d(0f64..n as f64, n as f64..0f64)?;
        // No axis ticks: the class names are drawn at the cell centres below (plotters puts
        // integer ticks on the cell edges).
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(0)
            .y_labels(0)
            .x_desc("predicted")
            .y_desc("true class")
            .axis_desc_style(("sans-serif", 26))
            .draw()?;
        let centred = |size: u32, colour: &RGBColor| {
            ("sans-serif", size)
                .into_font()
                .color(colour)
                .pos(Pos::new(HPos::Center, VPos::Center))
        };
        for (i, row) in matrix.iter().enumerate() {
            let total: u64 = row.iter().sum();
            for (j, &count) in row.iter().enumerate() {
                let rate = if total > 0 {
                    count as f32 / total as f32
                } else {
                    0.0
                };
                let [r, g, b] = colors::viridis(rate);
                let (x, y) = (j as f64, i as f64);
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x, y), (x + 1.0, y + 1.0)],
                    RGBColor(r, g, b).filled(),
                )))?;
                let text_colour = if rate > 0.6 { BLACK } else { WHITE };
                chart.draw_series(std::iter::once(Text::new(
                    count.to_string(),
                    (x + 0.5, y + 0.5),
                    centred(24, &text_colour),
                )))?;
            }
        }
        for (k, name) in class_names.iter().enumerate() {
            let centre = k as f64 + 0.5;
            let (x, bottom) = chart.backend_coord(&(centre, n as f64));
            root.draw(&Text::new(
                name.clone(),
                (x, bottom + 8),
                TextStyle::from(("sans-serif", 22).into_font())
                    .pos(Pos::new(HPos::Center, VPos::Top)),
            ))?;
            let (left, y) = chart.backend_coord(&(0.0, centre));
            root.draw(&Text::new(
                name.clone(),
                (left - 8, y),
                TextStyle::from(("sans-serif", 22).into_font())
                    .pos(Pos::new(HPos::Right, VPos::Center)),
            ))?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::pdf::content_stream;

    /// The PDF copy is vector: one filled circle per point and per legend entry, the title,
    /// subtitle and class names as text, the dots at the PNG's opacity, no image.
    #[test]
    fn inconsistent_inputs_are_refused_with_what_is_wrong() {
        let names = vec!["a".to_string(), "b".to_string()];
        let spec = |points: &'static [[f32; 2]], labels: &'static [usize]| ScatterSpec {
            points,
            labels,
            class_names: &names,
            title: "",
            subtitle: "",
            width: 100,
            height: 100,
        };
        let err = check_scatter(&spec(&[[0.0, 0.0]], &[0, 1])).unwrap_err();
        assert_eq!(err.to_string(), "1 points but 2 labels");
        let err = check_scatter(&spec(&[[0.0, 0.0]], &[2])).unwrap_err();
        assert_eq!(err.to_string(), "label 2 but only 2 classes");
        let dir = tempfile::tempdir().unwrap();
        let err = confusion_png(&dir.path().join("c.png"), &[vec![1, 0]], &names).unwrap_err();
        assert!(matches!(err, PlotError::NotSquare { classes: 2 }), "{err}");
        assert!(!dir.path().join("c.png").exists());
    }

    #[test]
    fn tick_labels_stay_short() {
        assert_eq!(tick_label(3.0), "3");
        assert_eq!(tick_label(0.0), "0");
        assert_eq!(tick_label(7.4649), "7.465");
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(2.964e-5), "3.0e-5");
        assert_eq!(tick_label(-1.5), "-1.5");
    }

    #[test]
    fn scatter_pdf_is_vector_with_every_point_and_label() {
        let dir = tempfile::tempdir().unwrap();
        let points: Vec<[f32; 2]> = (0..57)
            .map(|i| [(i as f32 * 0.7).sin() * 3.0, (i as f32 * 1.3).cos() * 2.0])
            .collect();
        let labels: Vec<usize> = (0..57).map(|i| i % 3).collect();
        let class_names = vec!["B".to_string(), "CD4 (T)".to_string(), "DC".to_string()];
        let spec = ScatterSpec {
            points: &points,
            labels: &labels,
            class_names: &class_names,
            title: "UMAP of epoch2",
            subtitle: "57 held-out images",
            width: 1400,
            height: 1000,
        };
        let (png, pdf) = (dir.path().join("u.png"), dir.path().join("pdf/u.pdf"));
        scatter_png_and_pdf(&png, &pdf, 100.0, &spec).unwrap();
        assert!(png.is_file());
        let bytes = std::fs::read(&pdf).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.contains("/MediaBox [0 0 1008.00 720.00]"),
            "14 x 10 in"
        );
        assert!(!text.contains("/Image"), "no raster");
        let ops = content_stream(&bytes);
        // A circle is four Bézier segments, then a fill.
        assert_eq!(ops.matches(" c ").count(), 4 * (57 + 3), "{ops}");
        for s in [
            "(UMAP of epoch2) Tj",
            "(57 held-out images) Tj",
            "(B) Tj",
            "(CD4 \\(T\\)) Tj",
            "(DC) Tj",
        ] {
            assert!(ops.contains(s), "{s} missing");
        }
        assert!(text.contains("/ca 0.900"), "dots at 0.9 opacity");
    }
}
