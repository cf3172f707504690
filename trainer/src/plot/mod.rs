//! PNG figures for the analyses (UMAP scatter, confusion matrix, training curves, attention
//! heatmaps). Everything renders into an RGB buffer and is written atomically, so a killed job
//! never leaves a half-written PNG that the staleness checks of `trainer pipeline` would trust.
//! The font is vendored (DejaVu Sans) so figures look the same in a bare container.
mod charts;
mod colors;
pub mod pdf;
pub mod pdf_canvas;

pub use charts::{confusion_png, lines_png, scatter_png, scatter_png_and_pdf, Curve, ScatterSpec};
pub use colors::{hls_palette, viridis};

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("drawing {path}: {message}")]
    Draw { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{points} points but {labels} labels")]
    PointsWithoutLabels { points: usize, labels: usize },
    #[error("label {label} but only {classes} classes")]
    UnknownLabel { label: usize, classes: usize },
    #[error("confusion matrix is not {classes}×{classes}")]
    NotSquare { classes: usize },
}

static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// Registers the vendored font once per process under the family name plotters asks for.
fn ensure_font() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        use plotters::style::FontStyle;
        for style in [FontStyle::Normal, FontStyle::Bold] {
            plotters::style::register_font("sans-serif", style, FONT)
                .unwrap_or_else(|_| panic!("vendored DejaVuSans.ttf is not a valid font"));
        }
    });
}

/// Encodes an RGB8 buffer as PNG bytes.
pub fn encode_png(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, String> {
    use image::ImageEncoder;
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(rgb, width, height, image::ExtendedColorType::Rgb8)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Writes an RGB8 buffer as a PNG file, atomically.
pub fn write_png(path: &Path, rgb: &[u8], width: u32, height: u32) -> Result<(), PlotError> {
    let bytes = encode_png(rgb, width, height).map_err(|message| PlotError::Draw {
        path: path.to_path_buf(),
        message,
    })?;
    write_file(path, &bytes)
}

/// Writes a figure file atomically, creating its folder.
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), PlotError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| PlotError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    // The message a failed write has always had: "{path}: writing: {error}".
    scdino_base::fs::write_atomic(path, bytes).map_err(|e| PlotError::Draw {
        path: path.to_path_buf(),
        message: format!("{}: writing: {e}", path.display()),
    })
}

/// Renders with `draw` into a fresh white `width`×`height` canvas and writes the PNG.
fn render_png<F>(path: &Path, width: u32, height: u32, draw: F) -> Result<(), PlotError>
where
    F: FnOnce(
        &plotters::drawing::DrawingArea<
            plotters::backend::BitMapBackend<'_>,
            plotters::coord::Shift,
        >,
    ) -> Result<(), Box<dyn std::error::Error>>,
{
    let buf = render(path, width, height, draw)?;
    write_png(path, &buf, width, height)
}

/// Draws with `draw` on a white vector PDF page for a `width`×`height` pixel figure shown at
/// `dpi` (see [`pdf_canvas`]), and writes it atomically.
pub fn write_vector_pdf<F>(
    path: &Path,
    width: u32,
    height: u32,
    dpi: f64,
    draw: F,
) -> Result<(), PlotError>
where
    F: for<'a> FnOnce(
        &plotters::drawing::DrawingArea<pdf_canvas::PdfCanvas<'a>, plotters::coord::Shift>,
    ) -> Result<(), Box<dyn std::error::Error>>,
{
    use plotters::prelude::*;
    ensure_font();
    let mut page = pdf_canvas::PdfPage::default();
    paint(
        path,
        &pdf_canvas::PdfCanvas::new(&mut page, width, height).into_drawing_area(),
        draw,
    )?;
    let (width_pt, height_pt) = (
        f64::from(width) / dpi * 72.0,
        f64::from(height) / dpi * 72.0,
    );
    let (content, states) = page.finish(width, height, width_pt, height_pt);
    write_file(
        path,
        &pdf::vector_pdf(&content, &states, width_pt, height_pt),
    )
}

/// Renders with `draw` into a fresh white `width`×`height` RGB8 canvas (`path` names the
/// figure in errors).
pub(crate) fn render<F>(path: &Path, width: u32, height: u32, draw: F) -> Result<Vec<u8>, PlotError>
where
    F: FnOnce(
        &plotters::drawing::DrawingArea<
            plotters::backend::BitMapBackend<'_>,
            plotters::coord::Shift,
        >,
    ) -> Result<(), Box<dyn std::error::Error>>,
{
    use plotters::prelude::*;
    ensure_font();
    let mut buf = vec![255u8; (width * height * 3) as usize];
    paint(
        path,
        &BitMapBackend::with_buffer(&mut buf, (width, height)).into_drawing_area(),
        draw,
    )?;
    Ok(buf)
}

/// A white background, then `draw`, then presents `root`; errors name the figure `path`.
fn paint<DB, F>(
    path: &Path,
    root: &plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    draw: F,
) -> Result<(), PlotError>
where
    DB: plotters::backend::DrawingBackend,
    F: FnOnce(
        &plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    ) -> Result<(), Box<dyn std::error::Error>>,
{
    let fail = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    root.fill(&plotters::style::WHITE).map_err(|e| fail(&e))?;
    draw(root).map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}
