//! The subset of ZIP that `torch.save` writes: stored (uncompressed) entries, padded local
//! headers, ZIP64 records for large archives.
//!
//! A reader of our own rather than the `zip` crate: torch never compresses, so all we need is
//! the central directory and the offset of each entry's bytes; entries are read on demand (a
//! feature extraction needs the teacher's storages, not the optimizer's), and every entry read
//! is checked against its CRC-32 so a damaged file fails loudly instead of yielding bad weights.
use super::PthError;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

const EOCD_SIG: u32 = 0x0605_4b50;
const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;

/// One central-directory entry.
#[derive(Debug, Clone)]
struct Entry {
    method: u16,
    crc32: u32,
    compressed_size: u64,
    size: u64,
    local_header_offset: u64,
}

/// An open archive: the file and its directory.
pub struct ZipArchive {
    path: PathBuf,
    file: File,
    entries: HashMap<String, Entry>,
    /// Entry names in directory order.
    names: Vec<String>,
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

impl ZipArchive {
    pub fn open(path: &Path) -> Result<Self, PthError> {
        let io = |source| PthError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let bad = |reason: String| PthError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        // The end-of-central-directory record sits in the last 22 + 65535 (comment) bytes.
        let tail_len = len.min(22 + 65_535);
        let mut tail = vec![0u8; tail_len as usize];
        file.seek(SeekFrom::Start(len - tail_len)).map_err(io)?;
        file.read_exact(&mut tail).map_err(io)?;
        let eocd = (0..tail.len().saturating_sub(21))
            .rev()
            .find(|&i| u32_at(&tail, i) == EOCD_SIG)
            .ok_or_else(
                || bad("no ZIP end-of-central-directory record (truncated file?)".into()),
            )?;
        let eocd_abs = len - tail_len + eocd as u64;
        let mut count = u64::from(u16_at(&tail, eocd + 10));
        let mut cd_size = u64::from(u32_at(&tail, eocd + 12));
        let mut cd_offset = u64::from(u32_at(&tail, eocd + 16));
        if count == 0xffff || cd_size == 0xffff_ffff || cd_offset == 0xffff_ffff {
            // ZIP64: a locator just before the EOCD points at the ZIP64 EOCD record.
            if eocd_abs < 20 {
                return Err(bad("ZIP64 archive without a ZIP64 locator".into()));
            }
            let mut loc = [0u8; 20];
            file.seek(SeekFrom::Start(eocd_abs - 20)).map_err(io)?;
            file.read_exact(&mut loc).map_err(io)?;
            if u32_at(&loc, 0) != ZIP64_LOCATOR_SIG {
                return Err(bad("ZIP64 archive without a ZIP64 locator".into()));
            }
            let rec_off = u64_at(&loc, 8);
            let mut rec = [0u8; 56];
            if rec_off.checked_add(56).is_none_or(|end| end > len) {
                return Err(bad(format!(
                    "ZIP64 end record offset {rec_off} is past the end"
                )));
            }
            file.seek(SeekFrom::Start(rec_off)).map_err(io)?;
            file.read_exact(&mut rec).map_err(io)?;
            if u32_at(&rec, 0) != ZIP64_EOCD_SIG {
                return Err(bad(format!("no ZIP64 end record at offset {rec_off}")));
            }
            count = u64_at(&rec, 32);
            cd_size = u64_at(&rec, 40);
            cd_offset = u64_at(&rec, 48);
        }
        if cd_offset.checked_add(cd_size).is_none_or(|end| end > len) {
            return Err(bad(format!(
                "central directory ({cd_size} bytes at offset {cd_offset}) lies past the end of the {len}-byte file (truncated?)"
            )));
        }
        let mut cd = vec![0u8; cd_size as usize];
        file.seek(SeekFrom::Start(cd_offset)).map_err(io)?;
        file.read_exact(&mut cd).map_err(io)?;
        let mut entries = HashMap::new();
        let mut names = Vec::new();
        let mut i = 0usize;
        for n in 0..count {
            if i + 46 > cd.len() || u32_at(&cd, i) != CENTRAL_SIG {
                return Err(bad(format!("central directory entry {n} is damaged")));
            }
            let name_len = u16_at(&cd, i + 28) as usize;
            let extra_len = u16_at(&cd, i + 30) as usize;
            let comment_len = u16_at(&cd, i + 32) as usize;
            let end = i + 46 + name_len + extra_len + comment_len;
            if end > cd.len() {
                return Err(bad(format!("central directory entry {n} is damaged")));
            }
            let name = String::from_utf8_lossy(&cd[i + 46..i + 46 + name_len]).into_owned();
            let mut e = Entry {
                method: u16_at(&cd, i + 10),
                crc32: u32_at(&cd, i + 16),
                compressed_size: u64::from(u32_at(&cd, i + 20)),
                size: u64::from(u32_at(&cd, i + 24)),
                local_header_offset: u64::from(u32_at(&cd, i + 42)),
            };
            zip64_extra(
                &cd[i + 46 + name_len..i + 46 + name_len + extra_len],
                &mut e,
            );
            names.push(name.clone());
            entries.insert(name, e);
            i = end;
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            entries,
            names,
        })
    }

    /// Entry names in the order the archive lists them.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The bytes of entry `name`, CRC-checked.
    pub fn read(&mut self, name: &str) -> Result<Vec<u8>, PthError> {
        let path = self.path.clone();
        let bad = |reason: String| PthError::Corrupt {
            path: path.clone(),
            reason,
        };
        let e = self
            .entries
            .get(name)
            .cloned()
            .ok_or_else(|| bad(format!("the archive has no record {name:?}")))?;
        if e.method != 0 {
            return Err(bad(format!(
                "record {name:?} is compressed (method {}); torch.save writes stored records only",
                e.method
            )));
        }
        let io = |source| PthError::Io {
            path: path.clone(),
            source,
        };
        let mut local = [0u8; 30];
        self.file
            .seek(SeekFrom::Start(e.local_header_offset))
            .map_err(io)?;
        self.file
            .read_exact(&mut local)
            .map_err(|_| bad(format!("record {name:?}: local header is past the end")))?;
        if u32_at(&local, 0) != LOCAL_SIG {
            return Err(bad(format!(
                "record {name:?}: no local header at offset {}",
                e.local_header_offset
            )));
        }
        let data_start = e.local_header_offset
            + 30
            + u64::from(u16_at(&local, 26))
            + u64::from(u16_at(&local, 28));
        let file_len = self.file.metadata().map_err(io)?.len();
        if data_start
            .checked_add(e.compressed_size)
            .is_none_or(|end| end > file_len)
        {
            return Err(bad(format!(
                "record {name:?} ({} bytes at offset {data_start}) runs past the end of the {file_len}-byte file (truncated?)",
                e.compressed_size
            )));
        }
        if e.size != e.compressed_size {
            return Err(bad(format!("record {name:?}: stored sizes disagree")));
        }
        let mut out = vec![0u8; e.size as usize];
        self.file.seek(SeekFrom::Start(data_start)).map_err(io)?;
        self.file.read_exact(&mut out).map_err(io)?;
        let crc = crc32(&out);
        if crc != e.crc32 {
            return Err(bad(format!(
                "record {name:?}: CRC-32 is {crc:08x}, the directory says {:08x} (damaged file)",
                e.crc32
            )));
        }
        Ok(out)
    }
}

/// Applies the ZIP64 extended-information extra field (id 1): the 64-bit values replace, in
/// order, whichever of size, compressed size and offset are saturated in the 32-bit fields.
fn zip64_extra(mut extra: &[u8], e: &mut Entry) {
    while extra.len() >= 4 {
        let id = u16_at(extra, 0);
        let len = u16_at(extra, 2) as usize;
        let body = &extra[4..(4 + len).min(extra.len())];
        if id == 1 {
            let mut j = 0;
            for field in [
                &mut e.size,
                &mut e.compressed_size,
                &mut e.local_header_offset,
            ] {
                if *field == 0xffff_ffff && j + 8 <= body.len() {
                    *field = u64_at(body, j);
                    j += 8;
                }
            }
        }
        extra = &extra[(4 + len).min(extra.len())..];
    }
}

/// CRC-32 (IEEE 802.3, reflected, as ZIP uses), slicing-by-one with a table built once.
pub fn crc32(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (n, slot) in t.iter_mut().enumerate() {
            let mut c = n as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *slot = c;
        }
        t
    });
    let mut c = !0u32;
    for &b in data {
        c = table[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32_check_value() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(super::crc32(b"123456789"), 0xcbf4_3926);
    }
}
