//! The figures of `trainer metrics profile`: a scatter with axes (mAP against −log10 p, mAP
//! per plate), drawn with the crate's plot module (its vendored font, white canvas and atomic
//! PNG writing), because a screen's answer is read off the axes, which the UMAP-style
//! [`crate::plot::scatter_png`] leaves out.
use std::path::Path;

use plotters::prelude::*;

use crate::plot::{hls_palette, PlotError};

/// One point: `x`, `y` and its class (an index into the chart's class names).
pub type Point = (f64, f64, usize);

/// What to draw.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub points: &'a [Point],
    pub classes: &'a [String],
    /// Categorical x axis: the name of each integer x (plates); `None` = numeric.
    pub x_names: Option<&'a [String]>,
    /// A dashed horizontal reference line (the p-value threshold), if any.
    pub y_line: Option<f64>,
}

const WIDTH: u32 = 900;
const HEIGHT: u32 = 600;

/// Draws `chart` as a PNG at `path`, atomically.
pub fn scatter(path: &Path, chart: &Chart) -> Result<(), PlotError> {
    if let Some(&(_, _, bad)) = chart.points.iter().find(|p| p.2 >= chart.classes.len()) {
        return Err(PlotError::UnknownLabel {
            label: bad,
            classes: chart.classes.len(),
        });
    }
    let finite: Vec<Point> = chart
        .points
        .iter()
        .copied()
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    let span = |vals: &mut dyn Iterator<Item = f64>| {
        let (lo, hi) = vals.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
        if lo > hi {
            (0.0, 1.0)
        } else if hi - lo < 1e-9 {
            (lo - 0.5, hi + 0.5)
        } else {
            let pad = (hi - lo) * 0.06;
            (lo - pad, hi + pad)
        }
    };
    let (x0, x1) = match chart.x_names {
        Some(names) => (-0.5, names.len().max(1) as f64 - 0.5),
        None => span(&mut finite.iter().map(|p| p.0)),
    };
    let (y0, y1) = span(
        &mut finite
            .iter()
            .map(|p| p.1)
            .chain(chart.y_line.into_iter().chain([0.0])),
    );
    let palette = hls_palette(chart.classes.len().max(1));
    let buf = crate::plot::render(path, WIDTH, HEIGHT, |root| {
        let mut c = ChartBuilder::on(root)
            .caption(chart.title, ("sans-serif", 28))
            .margin(16)
            .x_label_area_size(60)
            .y_label_area_size(80)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        let names = chart.x_names;
        let x_fmt = move |v: &f64| match names {
            Some(n) if (v - v.round()).abs() < 1e-6 && v.round() >= 0.0 => {
                n.get(v.round() as usize).cloned().unwrap_or_default()
            }
            Some(_) => String::new(),
            None => format!("{v:.2}"),
        };
        c.configure_mesh()
            .x_desc(chart.x_label)
            .y_desc(chart.y_label)
            .x_labels(names.map_or(8, |n| n.len() + 1))
            .y_labels(6)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&|v| format!("{v:.2}"))
            .label_style(("sans-serif", 18))
            .axis_desc_style(("sans-serif", 20))
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.15))
            .draw()?;
        if let Some(y) = chart.y_line {
            c.draw_series(DashedLineSeries::new(
                [(x0, y), (x1, y)],
                8,
                6,
                BLACK.mix(0.5).stroke_width(1),
            ))?;
        }
        for (class, colour) in palette.iter().enumerate().take(chart.classes.len()) {
            let colour = *colour;
            c.draw_series(
                finite
                    .iter()
                    .filter(|p| p.2 == class)
                    .map(|p| Circle::new((p.0, p.1), 5, colour.mix(0.85).filled())),
            )?
            .label(chart.classes[class].clone())
            .legend(move |(x, y)| Circle::new((x + 6, y), 5, colour.filled()));
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 16))
            .draw()?;
        Ok(())
    })?;
    crate::plot::write_png(path, &buf, WIDTH, HEIGHT)
}
