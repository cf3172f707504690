//! A one-page PDF holding a rendered figure, for scDINO's `pdf_format/` copies of its plots
//! (matplotlib writes vector PDFs there; ours embeds the same rendering as the PNG, as a
//! Flate-compressed RGB image placed at the figure's physical size, so the file opens in any
//! viewer and prints at that size). Hand-written because it is five objects.
use flate2::write::ZlibEncoder;
use flate2::Compression;
use std::io::Write;

/// The PDF bytes of one page of `width_pt`×`height_pt` points showing the `width`×`height`
/// RGB8 raster `rgb` scaled to the whole page.
pub fn image_pdf(rgb: &[u8], width: u32, height: u32, width_pt: f64, height_pt: f64) -> Vec<u8> {
    assert_eq!(rgb.len(), (width * height * 3) as usize, "RGB8 buffer size");
    let mut z = ZlibEncoder::new(Vec::new(), Compression::default());
    z.write_all(rgb).expect("writing to memory");
    let pixels = z.finish().expect("writing to memory");
    let content = format!("q {width_pt:.2} 0 0 {height_pt:.2} 0 0 cm /Im0 Do Q\n");
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
             /Resources << /XObject << /Im0 4 0 R >> >> /Contents 5 0 R >>"
        ),
        None,
    );
    object(
        &mut out,
        format!(
            "<< /Type /XObject /Subtype /Image /Width {width} /Height {height} \
             /ColorSpace /DeviceRGB /BitsPerComponent 8 /Filter /FlateDecode /Length {} >>",
            pixels.len()
        ),
        Some(&pixels),
    );
    object(
        &mut out,
        format!("<< /Length {} >>", content.len()),
        Some(content.as_bytes()),
    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Reads the file the way a viewer does: trailer → xref → objects by offset, then
    /// inflates the image stream.
    #[test]
    fn xref_offsets_point_at_their_objects_and_the_image_inflates_back() {
        let (w, h) = (7u32, 3u32);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 256) as u8).collect();
        let pdf = image_pdf(&rgb, w, h, 1008.0, 720.0);
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
        let obj4: usize = rows[3][..10].parse().unwrap();
        let header = String::from_utf8_lossy(&pdf[obj4..obj4 + 200]).into_owned();
        let stream_at = obj4 + header.find("stream\n").unwrap() + "stream\n".len();
        let len: usize = header
            .split("/Length ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let mut back = vec![];
        flate2::read::ZlibDecoder::new(&pdf[stream_at..stream_at + len])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, rgb);
        assert!(text.contains("/MediaBox [0 0 1008.00 720.00]"));
    }
}
