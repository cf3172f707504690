//! The few bytes of POSIX ustar that shards need, written by hand.
//!
//! Members are regular files with short ASCII names (`<key>.tiff`, `<key>.json`), so a single
//! 512-byte ustar header per member suffices: no long-name extensions, no PAX records. Every
//! header field that could vary between runs (mtime, owner) is fixed, so packing the same
//! dataset twice gives byte-identical shards, which is what lets `pack` verify a previous
//! run's output by checksum instead of rewriting it.
//!
//! The writer sits on `std::io::Write` only (no seeking), so the same bytes can later be
//! streamed into an object-store multipart upload.
use std::io::{self, Write};

/// Size of a tar header and the unit members are padded to.
pub const BLOCK: u64 = 512;

/// Bytes a member of `len` bytes takes in the archive, header included.
pub fn member_span(len: u64) -> u64 {
    BLOCK + len.div_ceil(BLOCK) * BLOCK
}

/// Bytes of the end-of-archive marker (two zero blocks).
pub const END_SPAN: u64 = 2 * BLOCK;

fn put_octal(field: &mut [u8], value: u64) -> io::Result<()> {
    // `width - 1` octal digits followed by NUL, as GNU tar and Python's tarfile write them.
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    if text.len() > digits {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "value {value} does not fit a {}-byte tar field",
                field.len()
            ),
        ));
    }
    field[..digits].copy_from_slice(text.as_bytes());
    field[digits] = 0;
    Ok(())
}

/// The ustar header of a regular file `name` of `size` bytes.
pub fn header(name: &str, size: u64) -> io::Result<[u8; 512]> {
    if name.is_empty() || name.len() > 100 || !name.is_ascii() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("tar member name {name:?} must be 1-100 ASCII bytes"),
        ));
    }
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    put_octal(&mut h[100..108], 0o644)?; // mode
    put_octal(&mut h[108..116], 0)?; // uid
    put_octal(&mut h[116..124], 0)?; // gid
    put_octal(&mut h[124..136], size)?;
    put_octal(&mut h[136..148], 0)?; // mtime: fixed for reproducible shards
    h[156] = b'0'; // regular file
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h[155] = b' ';
    Ok(h)
}

/// A parsed member header: `None` for the zero block that ends an archive.
pub fn parse_header(h: &[u8; 512]) -> io::Result<Option<(String, u64)>> {
    if h.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let octal = |field: &[u8]| -> io::Result<u64> {
        let text = std::str::from_utf8(field).map_err(|_| bad("non-ASCII number field"))?;
        let text = text.trim_matches(|c| c == '\0' || c == ' ');
        u64::from_str_radix(text, 8).map_err(|_| bad("malformed octal field"))
    };
    let stored = octal(&h[148..156])?;
    let sum: u64 = h
        .iter()
        .enumerate()
        .map(|(i, &b)| u64::from(if (148..156).contains(&i) { b' ' } else { b }))
        .sum();
    if stored != sum {
        return Err(bad("header checksum mismatch"));
    }
    if h[156] != b'0' && h[156] != 0 {
        return Err(bad("member is not a regular file"));
    }
    let end = h[..100].iter().position(|&b| b == 0).unwrap_or(100);
    let name = String::from_utf8(h[..end].to_vec()).map_err(|_| bad("non-UTF-8 name"))?;
    Ok(Some((name, octal(&h[124..136])?)))
}

/// Appends members to a tar stream and remembers where each member's data starts.
pub struct TarWriter<W: Write> {
    inner: W,
    pos: u64,
}

impl<W: Write> TarWriter<W> {
    pub fn new(inner: W) -> Self {
        Self { inner, pos: 0 }
    }

    /// Bytes written so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Writes one member and returns the offset of its data in the archive.
    pub fn append(&mut self, name: &str, data: &[u8]) -> io::Result<u64> {
        let len = data.len() as u64;
        self.inner.write_all(&header(name, len)?)?;
        let offset = self.pos + BLOCK;
        self.inner.write_all(data)?;
        let pad = (len.div_ceil(BLOCK) * BLOCK - len) as usize;
        self.inner.write_all(&[0u8; 512][..pad])?;
        self.pos += member_span(len);
        Ok(offset)
    }

    /// Writes the end-of-archive marker and hands back the stream and the total size.
    pub fn finish(mut self) -> io::Result<(W, u64)> {
        self.inner.write_all(&[0u8; 1024])?;
        self.pos += END_SPAN;
        Ok((self.inner, self.pos))
    }
}

/// Reads a tar stream member by member (used to verify shards and by tests; training reads
/// members by offset instead).
pub fn read_members(mut r: impl io::Read) -> io::Result<Vec<(String, u64, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    loop {
        let mut h = [0u8; 512];
        r.read_exact(&mut h)?;
        pos += BLOCK;
        let Some((name, len)) = parse_header(&h)? else {
            return Ok(out);
        };
        let mut data = vec![0u8; len as usize];
        r.read_exact(&mut data)?;
        let pad = len.div_ceil(BLOCK) * BLOCK - len;
        r.read_exact(&mut [0u8; 512][..pad as usize])?;
        out.push((name, pos, data));
        pos += len.div_ceil(BLOCK) * BLOCK;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_offsets_and_padding() {
        let mut w = TarWriter::new(Vec::new());
        let a = w.append("000001.tiff", &[7u8; 513]).unwrap();
        let b = w.append("000001.json", b"{}").unwrap();
        let e = w.append("empty", &[]).unwrap();
        let (bytes, total) = w.finish().unwrap();
        assert_eq!(total as usize, bytes.len());
        assert_eq!(bytes.len(), 512 + 1024 + 512 + 512 + 512 + 1024);
        assert_eq!(
            (a, b, e),
            (512, 512 + 1024 + 512, 512 + 1024 + 512 + 512 + 512)
        );
        let members = read_members(&bytes[..]).unwrap();
        assert_eq!(members.len(), 3);
        assert_eq!(members[0], ("000001.tiff".into(), a, vec![7u8; 513]));
        assert_eq!(members[1], ("000001.json".into(), b, b"{}".to_vec()));
        assert_eq!(members[2], ("empty".into(), e, vec![]));
    }

    #[test]
    fn corrupt_header_and_bad_names_are_errors() {
        let mut h = header("x.tiff", 3).unwrap();
        assert_eq!(parse_header(&h).unwrap(), Some(("x.tiff".into(), 3)));
        h[0] = b'y';
        assert!(parse_header(&h).is_err());
        assert!(header(&"a".repeat(101), 1).is_err());
        assert!(header("ä", 1).is_err());
        assert!(header("", 1).is_err());
    }
}
