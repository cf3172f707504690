//! NumPy `.npy` arrays of floats: the illumination functions CellProfiler's
//! CorrectIlluminationCalculate saves (`<Plate>_Illum<Channel>.npy`, 2-D float64).
use super::ScreenError;

/// A 2-D array read from a `.npy` file, as `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct Npy2 {
    pub height: usize,
    pub width: usize,
    pub data: Vec<f32>,
}

/// Parses a version 1–3 `.npy` holding a 2-D little-endian `f4` or `f8` array in C or
/// Fortran order; anything else is refused naming `name`.
pub fn parse(bytes: &[u8], name: &str) -> Result<Npy2, ScreenError> {
    let bad = |why: String| ScreenError::table(name, format!("not a 2-D float .npy array: {why}"));
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("no .npy magic".into()));
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(bad(format!("format version {v}"))),
    };
    let header = bytes
        .get(start..start + header_len)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| bad("truncated header".into()))?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}'"))? + key.len() + 2;
        let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
        Some(rest)
    };
    let descr = field("descr")
        .and_then(|r| r.strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| bad("no descr".into()))?;
    let fortran = field("fortran_order").is_some_and(|r| r.starts_with("True"));
    let shape: Vec<usize> = field("shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| bad("no shape".into()))?
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| bad(format!("shape entry {s:?}"))))
        .collect::<Result<_, _>>()?;
    let [height, width] = shape[..] else {
        return Err(bad(format!("shape {shape:?} is not 2-D")));
    };
    let body = &bytes[start + header_len..];
    let n = height * width;
    let values: Vec<f32> = match descr {
        "<f8" if body.len() == n * 8 => body
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default()) as f32)
            .collect(),
        "<f4" if body.len() == n * 4 => body
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap_or_default()))
            .collect(),
        "<f8" | "<f4" => {
            return Err(bad(format!(
                "{} data bytes for shape {shape:?}",
                body.len()
            )))
        }
        other => {
            return Err(bad(format!(
                "dtype {other:?} (float32 or float64 expected)"
            )))
        }
    };
    let data = if fortran {
        let mut c = vec![0.0; n];
        for x in 0..width {
            for y in 0..height {
                c[y * width + x] = values[x * height + y];
            }
        }
        c
    } else {
        values
    };
    Ok(Npy2 {
        height,
        width,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(descr: &str, fortran: bool, shape: &str, body: &[u8]) -> Vec<u8> {
        let mut header = format!(
            "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
            if fortran { "True" } else { "False" }
        );
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header.as_bytes());
        out.extend(body);
        out
    }

    #[test]
    fn reads_c_and_fortran_float_arrays() {
        let body: Vec<u8> = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let c = parse(&npy("<f8", false, "(2, 3)", &body), "i.npy").unwrap();
        assert_eq!((c.height, c.width), (2, 3));
        assert_eq!(c.data, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let f = parse(&npy("<f8", true, "(2, 3)", &body), "i.npy").unwrap();
        assert_eq!(f.data, [1.0, 3.0, 5.0, 2.0, 4.0, 6.0]);
        let e = parse(&npy("<i4", false, "(2, 3)", &body[..24]), "i.npy").unwrap_err();
        assert!(
            e.to_string().contains("i.npy") && e.to_string().contains("<i4"),
            "{e}"
        );
        let e = parse(&npy("<f8", false, "(6,)", &body), "i.npy").unwrap_err();
        assert!(e.to_string().contains("not 2-D"), "{e}");
        assert!(parse(b"junk", "i.npy").is_err());
    }
}
