//! One-page vector PDFs for scDINO's `pdf_format/` copies of its plots (what matplotlib
//! writes there), drawn through [`super::pdf_canvas::PdfCanvas`]. Hand-written because a page
//! is five objects.
use flate2::write::ZlibEncoder;
use flate2::Compression;
use std::io::Write;

fn deflate(bytes: &[u8]) -> Vec<u8> {
    let mut z = ZlibEncoder::new(Vec::new(), Compression::default());
    z.write_all(bytes).expect("writing to memory");
    z.finish().expect("writing to memory")
}

/// A PDF of one `width_pt`×`height_pt` page with `resources` (the dictionary's inside),
/// drawn by `content` (stored Flate-compressed as object 4), plus `extra` objects numbered
/// from 5.
fn document(
    width_pt: f64,
    height_pt: f64,
    resources: &str,
    content: &[u8],
    extra: &[(String, Option<Vec<u8>>)],
) -> Vec<u8> {
    let mut out: Vec<u8> = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n".to_vec();
    let mut offsets = vec![];
    let mut object = |out: &mut Vec<u8>, head: String, stream: Option<&[u8]>| {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n{head}\n", offsets.len()).as_bytes());
        if let Some(s) = stream {
            out.extend_from_slice(b"stream\n");
            out.extend_from_slice(s);
            out.extend_from_slice(b"\nendstream\n");
        }
        out.extend_from_slice(b"endobj\n");
    };
    object(&mut out, "<< /Type /Catalog /Pages 2 0 R >>".into(), None);
    object(
        &mut out,
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".into(),
        None,
    );
    object(
        &mut out,
        format!(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {width_pt:.2} {height_pt:.2}] \
             /Resources << {resources} >> /Contents 4 0 R >>"
        ),
        None,
    );
    let content = deflate(content);
    object(
        &mut out,
        format!("<< /Length {} /Filter /FlateDecode >>", content.len()),
        Some(&content),
    );
    for (head, stream) in extra {
        object(&mut out, head.clone(), stream.as_deref());
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", offsets.len() + 1).as_bytes(),
    );
    for o in &offsets {
        out.extend_from_slice(format!("{o:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            offsets.len() + 1
        )
        .as_bytes(),
    );
    out
}

/// The PDF bytes of one vector page: `content` operators using font `/F1` (Helvetica) and
/// the graphics states `ext_g_states` (a dictionary's inside).
pub fn vector_pdf(content: &str, ext_g_states: &str, width_pt: f64, height_pt: f64) -> Vec<u8> {
    document(
        width_pt,
        height_pt,
        &format!("/Font << /F1 5 0 R >> /ExtGState << {ext_g_states} >>"),
        content.as_bytes(),
        &[(
            "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
                .into(),
            None,
        )],
    )
}

/// The inflated content stream (object 4) of a PDF written by [`vector_pdf`], for tests.
#[cfg(test)]
pub(crate) fn content_stream(pdf: &[u8]) -> String {
    use std::io::Read;
    let find = |from: usize, what: &[u8]| {
        from + pdf[from..]
            .windows(what.len())
            .position(|w| w == what)
            .expect("object 4 and its stream")
    };
    let at = find(0, b"4 0 obj\n");
    let head = String::from_utf8_lossy(&pdf[at..at + 100]).into_owned();
    let len: usize = head
        .split("/Length ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("/Length");
    let start = find(at, b"stream\n") + "stream\n".len();
    let mut out = String::new();
    flate2::read::ZlibDecoder::new(&pdf[start..start + len])
        .read_to_string(&mut out)
        .expect("a Flate stream");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the file the way a viewer does: trailer → xref → objects by offset, then
    /// inflates the content stream.
    #[test]
    fn xref_offsets_point_at_their_objects_and_the_content_inflates_back() {
        let content = "q 1 0 0 -1 0 720 cm 0 0 1 rg 10 10 5 5 re f Q\n";
        let pdf = vector_pdf(
            content,
            "/GS0 << /Type /ExtGState /ca 1 /CA 1 >>",
            1008.0,
            720.0,
        );
        let text = String::from_utf8_lossy(&pdf);
        assert!(pdf.starts_with(b"%PDF-1.4\n") && text.ends_with("%%EOF\n"));
        let start: usize = text
            .rsplit("startxref\n")
            .next()
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(pdf[start..].starts_with(b"xref\n0 6\n"));
        // Offsets are byte offsets: read the (ASCII) xref and headers from the bytes.
        let xref = std::str::from_utf8(&pdf[start..]).unwrap();
        let rows: Vec<&str> = xref.lines().skip(3).take(5).collect();
        for (k, row) in rows.iter().enumerate() {
            let at: usize = row[..10].parse().unwrap();
            assert!(
                pdf[at..].starts_with(format!("{} 0 obj\n", k + 1).as_bytes()),
                "object {}",
                k + 1
            );
        }
        let back = content_stream(&pdf);
        assert_eq!(back, content);
        assert!(text.contains("/MediaBox [0 0 1008.00 720.00]"));
        assert!(text.contains("/BaseFont /Helvetica"));
        assert!(text.contains("/ExtGState << /GS0"));
    }
}
