//! A plotters backend that records vector drawing operators for a PDF page, so the
//! `pdf_format/` copy of a figure is vector like matplotlib's (scDINO's), not a raster: dots,
//! lines and polygons stay sharp at any zoom, and the text is text (Helvetica, one of the 14
//! standard fonts every viewer has, so nothing is embedded).
//!
//! Drawing happens in the figure's pixel coordinates (the same chart code as the PNG); the
//! page maps them to points with one `cm`, flipping y. Layout (text sizes) comes from the
//! vendored font, as for the PNG, so both files place everything alike.
use plotters_backend::{
    text_anchor::{HPos, VPos},
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
    FontTransform,
};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Bézier control-point factor for a quarter circle.
const KAPPA: f64 = 0.552_284_749_8;

/// What a [`PdfCanvas`] drew: the operators of one page.
#[derive(Default)]
pub struct PdfPage {
    /// The page's content stream (operators in pixel coordinates).
    ops: String,
    /// Opacity (in thousandths) → graphics-state name, for the page's resources.
    alphas: BTreeMap<u16, String>,
    /// Painted shapes and texts, for tests.
    pub painted: usize,
}

/// The plotters backend writing into a [`PdfPage`] (borrowed, as `BitMapBackend` borrows
/// its pixel buffer, so the page outlives the drawing area).
pub struct PdfCanvas<'a> {
    width: u32,
    height: u32,
    page: &'a mut PdfPage,
}

#[derive(Debug)]
pub struct NoError;

impl std::fmt::Display for NoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PDF canvas")
    }
}

impl std::error::Error for NoError {}

type Drawn = Result<(), DrawingErrorKind<NoError>>;

impl PdfPage {
    /// The content stream for a page of `width_pt`×`height_pt` points showing the
    /// `width`×`height` pixel drawing, and the page's `/ExtGState` resource entries.
    pub fn finish(
        &self,
        width: u32,
        height: u32,
        width_pt: f64,
        height_pt: f64,
    ) -> (String, String) {
        let sx = width_pt / f64::from(width);
        let sy = height_pt / f64::from(height);
        let content = format!(
            "q {sx:.6} 0 0 {:.6} 0 {height_pt:.4} cm 1 J 1 j\n{}Q\n",
            -sy, self.ops
        );
        let states = self
            .alphas
            .iter()
            .map(|(a, name)| {
                let a = f64::from(*a) / 1000.0;
                format!("/{name} << /Type /ExtGState /ca {a:.3} /CA {a:.3} >>")
            })
            .collect::<Vec<_>>()
            .join(" ");
        (content, states)
    }
}

impl<'a> PdfCanvas<'a> {
    pub fn new(page: &'a mut PdfPage, width: u32, height: u32) -> Self {
        Self {
            width,
            height,
            page,
        }
    }

    /// Sets colour (fill and stroke) and opacity for the next operator.
    fn paint(&mut self, c: BackendColor) {
        let (r, g, b) = c.rgb;
        let alpha = (c.alpha.clamp(0.0, 1.0) * 1000.0).round() as u16;
        let n = self.page.alphas.len();
        let gs = self
            .page
            .alphas
            .entry(alpha)
            .or_insert_with(|| format!("GS{n}"))
            .clone();
        let (r, g, b) = (
            f64::from(r) / 255.0,
            f64::from(g) / 255.0,
            f64::from(b) / 255.0,
        );
        let _ = write!(
            self.page.ops,
            "/{gs} gs {r:.3} {g:.3} {b:.3} rg {r:.3} {g:.3} {b:.3} RG "
        );
        self.page.painted += 1;
    }

    fn polyline(&mut self, points: &[BackendCoord]) {
        for (k, (x, y)) in points.iter().enumerate() {
            let op = if k == 0 { "m" } else { "l" };
            let _ = write!(self.page.ops, "{x} {y} {op} ");
        }
    }

    fn ops(&mut self) -> &mut String {
        &mut self.page.ops
    }
}

/// The WinAnsiEncoding byte of `ch`, if Helvetica can show it there (Latin-1 plus the
/// typographic punctuation of 0x80–0x9F that labels use).
fn win_ansi(ch: char) -> Option<u8> {
    match ch {
        ' '..='~' => Some(ch as u8),
        '\u{a0}'..='\u{ff}' => Some(ch as u32 as u8),
        '€' => Some(0x80),
        '…' => Some(0x85),
        '‘' => Some(0x91),
        '’' => Some(0x92),
        '“' => Some(0x93),
        '”' => Some(0x94),
        '•' => Some(0x95),
        '–' => Some(0x96),
        '—' => Some(0x97),
        _ => None,
    }
}

/// PDF string literal in WinAnsiEncoding: parentheses and backslashes escaped, bytes above
/// ASCII as octal escapes (so the content stream stays ASCII), characters Helvetica's
/// encoding lacks as `?`.
fn pdf_string(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('(');
    for ch in text.chars() {
        match win_ansi(ch) {
            Some(b @ (b'(' | b')' | b'\\')) => {
                s.push('\\');
                s.push(b as char);
            }
            Some(b) if b.is_ascii() => s.push(b as char),
            Some(b) => {
                let _ = write!(s, "\\{b:03o}");
            }
            None => s.push('?'),
        }
    }
    s.push(')');
    s
}

/// The points of a shape worth drawing: not fully transparent, at least `min` points.
fn visible<S: BackendStyle>(
    points: impl IntoIterator<Item = BackendCoord>,
    style: &S,
    min: usize,
) -> Option<Vec<BackendCoord>> {
    if style.color().alpha == 0.0 {
        return None;
    }
    let points: Vec<BackendCoord> = points.into_iter().collect();
    (points.len() >= min).then_some(points)
}

impl DrawingBackend for PdfCanvas<'_> {
    type ErrorType = NoError;

    fn get_size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    fn ensure_prepared(&mut self) -> Drawn {
        Ok(())
    }

    fn present(&mut self) -> Drawn {
        Ok(())
    }

    fn draw_pixel(&mut self, (x, y): BackendCoord, color: BackendColor) -> Drawn {
        if color.alpha > 0.0 {
            self.paint(color);
            let _ = writeln!(self.ops(), "{x} {y} 1 1 re f");
        }
        Ok(())
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Drawn {
        self.draw_path([from, to], style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        (x0, y0): BackendCoord,
        (x1, y1): BackendCoord,
        style: &S,
        fill: bool,
    ) -> Drawn {
        if style.color().alpha == 0.0 {
            return Ok(());
        }
        self.paint(style.color());
        let (w, h) = (x1 - x0, y1 - y0);
        if fill {
            // plotters' rectangles include their last pixel row and column.
            let _ = writeln!(self.ops(), "{x0} {y0} {} {} re f", w + 1, h + 1);
        } else {
            let _ = writeln!(
                self.ops(),
                "{} w {x0}.5 {y0}.5 {w} {h} re S",
                style.stroke_width()
            );
        }
        Ok(())
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Drawn {
        let Some(points) = visible(path, style, 2) else {
            return Ok(());
        };
        self.paint(style.color());
        let _ = write!(self.ops(), "{} w ", style.stroke_width());
        self.polyline(&points);
        self.ops().push_str("S\n");
        Ok(())
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        (cx, cy): BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Drawn {
        if style.color().alpha == 0.0 {
            return Ok(());
        }
        self.paint(style.color());
        let (x, y, r) = (f64::from(cx), f64::from(cy), f64::from(radius));
        let k = r * KAPPA;
        let _ = write!(
            self.ops(),
            "{:.2} {y:.2} m {:.2} {:.2} {:.2} {:.2} {x:.2} {:.2} c \
             {:.2} {:.2} {:.2} {:.2} {:.2} {y:.2} c \
             {:.2} {:.2} {:.2} {:.2} {x:.2} {:.2} c \
             {:.2} {:.2} {:.2} {:.2} {:.2} {y:.2} c ",
            x + r,
            x + r,
            y + k,
            x + k,
            y + r,
            y + r,
            x - k,
            y + r,
            x - r,
            y + k,
            x - r,
            x - r,
            y - k,
            x - k,
            y - r,
            y - r,
            x + k,
            y - r,
            x + r,
            y - k,
            x + r,
        );
        if fill {
            self.ops().push_str("f\n");
        } else {
            let _ = writeln!(self.ops(), "{} w S", style.stroke_width());
        }
        Ok(())
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Drawn {
        let Some(points) = visible(vert, style, 3) else {
            return Ok(());
        };
        self.paint(style.color());
        self.polyline(&points);
        self.ops().push_str("h f\n");
        Ok(())
    }

    fn draw_text<TStyle: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &TStyle,
        pos: BackendCoord,
    ) -> Drawn {
        let color = style.color();
        if color.alpha == 0.0 || text.is_empty() {
            return Ok(());
        }
        let ((x0, y0), (x1, y1)) = style
            .layout_box(text)
            .map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (w, h) = (x1 - x0, y1 - y0);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -w,
            HPos::Center => -w / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -h / 2,
            VPos::Bottom => -h,
        };
        let size = style.size();
        // The box's top edge at pos + (dx, dy); the baseline one ascent (≈ 0.76 em for
        // Helvetica and DejaVu Sans) below it.
        let (left, top) = (f64::from(pos.0 + dx), f64::from(pos.1 + dy));
        let baseline = top + 0.76 * size;
        // The page flips y; the text matrix flips it back so glyphs stand upright.
        let (a, b, c, d) = match style.transform() {
            FontTransform::None => (1.0, 0.0, 0.0, -1.0),
            FontTransform::Rotate90 => (0.0, 1.0, 1.0, 0.0),
            FontTransform::Rotate180 => (-1.0, 0.0, 0.0, 1.0),
            FontTransform::Rotate270 => (0.0, -1.0, -1.0, 0.0),
        };
        self.paint(color);
        let _ = writeln!(
            self.ops(),
            "BT /F1 {size:.2} Tf {a} {b} {c} {d} {left:.2} {baseline:.2} Tm {} Tj ET",
            pdf_string(text)
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::pdf_string;

    #[test]
    fn strings_are_escaped_and_win_ansi_encoded() {
        assert_eq!(pdf_string("CD4 (T) a\\b"), "(CD4 \\(T\\) a\\\\b)");
        // Middle dot, e acute, en dash: octal bytes of WinAnsiEncoding; CJK has no glyph.
        assert_eq!(pdf_string("a · é – 細"), "(a \\267 \\351 \\226 ?)");
    }
}
