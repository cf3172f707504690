//! Allocation-free decoding of the TIFF files training actually reads: one uncompressed,
//! striped IFD (chunky or planar, 8–64-bit integer or 32/64-bit float samples). The loader
//! decodes every image every epoch, and the `tiff` crate's general decoder allocates its
//! directory, strip tables and output on each call; this path parses the directory in place
//! and writes straight into a reused C×H×W buffer.
//!
//! It only says "yes" when it is sure: anything else (compression, tiles, several pages,
//! predictors, BigTIFF, palette/YCbCr, inconsistent or truncated strips) returns `false`
//! and the caller falls back to [`super::tiff_reader::decode_tiff`], which decodes it or
//! reports the error. The two paths give identical values (tested on every layout tifffile
//! writes).

use super::chw::ImageChw;

const TAG_WIDTH: u16 = 256;
const TAG_HEIGHT: u16 = 257;
const TAG_BITS: u16 = 258;
const TAG_COMPRESSION: u16 = 259;
const TAG_PHOTOMETRIC: u16 = 262;
const TAG_STRIP_OFFSETS: u16 = 273;
const TAG_SAMPLES: u16 = 277;
const TAG_ROWS_PER_STRIP: u16 = 278;
const TAG_STRIP_BYTES: u16 = 279;
const TAG_PLANAR: u16 = 284;
const TAG_PREDICTOR: u16 = 317;
const TAG_TILE_WIDTH: u16 = 322;
const TAG_SAMPLE_FORMAT: u16 = 339;

/// Byte order of the file.
#[derive(Clone, Copy)]
struct Endian {
    big: bool,
}

impl Endian {
    fn u16(self, b: &[u8], at: usize) -> Option<u16> {
        let a: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
        Some(if self.big {
            u16::from_be_bytes(a)
        } else {
            u16::from_le_bytes(a)
        })
    }

    fn u32(self, b: &[u8], at: usize) -> Option<u32> {
        let a: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(if self.big {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        })
    }
}

/// One directory entry: an array of `count` SHORT or LONG values, inline or at an offset.
#[derive(Clone, Copy)]
struct Entry {
    ty: u16,
    count: usize,
    /// Where the values start in the file.
    at: usize,
}

impl Entry {
    fn value(self, b: &[u8], e: Endian, k: usize) -> Option<u64> {
        if k >= self.count {
            return None;
        }
        match self.ty {
            3 => e.u16(b, self.at + 2 * k).map(u64::from),
            4 => e.u32(b, self.at + 4 * k).map(u64::from),
            _ => None,
        }
    }

    /// The single value of a scalar tag, or the common value of a per-sample tag.
    fn uniform(self, b: &[u8], e: Endian) -> Option<u64> {
        let first = self.value(b, e, 0)?;
        (1..self.count)
            .all(|k| self.value(b, e, k) == Some(first))
            .then_some(first)
    }
}

/// The sample type of the image.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SampleKind {
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F32,
    F64,
}

impl SampleKind {
    fn of(bits: u64, format: u64) -> Option<Self> {
        Some(match (format, bits) {
            (1, 8) => Self::U8,
            (1, 16) => Self::U16,
            (1, 32) => Self::U32,
            (1, 64) => Self::U64,
            (2, 8) => Self::I8,
            (2, 16) => Self::I16,
            (2, 32) => Self::I32,
            (2, 64) => Self::I64,
            (3, 32) => Self::F32,
            (3, 64) => Self::F64,
            _ => return None,
        })
    }

    fn bytes(self) -> usize {
        match self {
            Self::U8 | Self::I8 => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
        }
    }
}

/// A stored sample type, read from its bytes in either byte order.
trait Sample {
    const N: usize;
    fn le(b: &[u8]) -> f32;
    fn be(b: &[u8]) -> f32;
}

macro_rules! sample {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            const N: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn le(b: &[u8]) -> f32 {
                <$t>::from_le_bytes(b.try_into().unwrap_or_default()) as f32
            }
            #[inline(always)]
            fn be(b: &[u8]) -> f32 {
                <$t>::from_be_bytes(b.try_into().unwrap_or_default()) as f32
            }
        }
    )*};
}
sample!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

#[inline(always)]
fn get<T: Sample, const BIG: bool>(b: &[u8]) -> f32 {
    if BIG {
        T::be(b)
    } else {
        T::le(b)
    }
}

/// Calls `$f::<T, BIG>(args)` for the sample type and byte order, so each inner loop is
/// compiled for one concrete type (no per-sample dispatch).
macro_rules! dispatch {
    ($kind:expr, $big:expr, $f:ident($($arg:expr),*)) => {
        match ($kind, $big) {
            (SampleKind::U8, false) => $f::<u8, false>($($arg),*),
            (SampleKind::U8, true) => $f::<u8, true>($($arg),*),
            (SampleKind::I8, false) => $f::<i8, false>($($arg),*),
            (SampleKind::I8, true) => $f::<i8, true>($($arg),*),
            (SampleKind::U16, false) => $f::<u16, false>($($arg),*),
            (SampleKind::U16, true) => $f::<u16, true>($($arg),*),
            (SampleKind::I16, false) => $f::<i16, false>($($arg),*),
            (SampleKind::I16, true) => $f::<i16, true>($($arg),*),
            (SampleKind::U32, false) => $f::<u32, false>($($arg),*),
            (SampleKind::U32, true) => $f::<u32, true>($($arg),*),
            (SampleKind::I32, false) => $f::<i32, false>($($arg),*),
            (SampleKind::I32, true) => $f::<i32, true>($($arg),*),
            (SampleKind::U64, false) => $f::<u64, false>($($arg),*),
            (SampleKind::U64, true) => $f::<u64, true>($($arg),*),
            (SampleKind::I64, false) => $f::<i64, false>($($arg),*),
            (SampleKind::I64, true) => $f::<i64, true>($($arg),*),
            (SampleKind::F32, false) => $f::<f32, false>($($arg),*),
            (SampleKind::F32, true) => $f::<f32, true>($($arg),*),
            (SampleKind::F64, false) => $f::<f64, false>($($arg),*),
            (SampleKind::F64, true) => $f::<f64, true>($($arg),*),
        }
    };
}

/// The tags this path reads, in [`Tags`]' slots.
const WANTED: [u16; 13] = [
    TAG_WIDTH,
    TAG_HEIGHT,
    TAG_BITS,
    TAG_COMPRESSION,
    TAG_PHOTOMETRIC,
    TAG_STRIP_OFFSETS,
    TAG_SAMPLES,
    TAG_ROWS_PER_STRIP,
    TAG_STRIP_BYTES,
    TAG_PLANAR,
    TAG_PREDICTOR,
    TAG_TILE_WIDTH,
    TAG_SAMPLE_FORMAT,
];

/// The wanted entries of the first IFD (the `n` entries from `ifd`), each checked to lie
/// inside the file; None where an entry has a type this path does not read.
struct Tags([Option<Entry>; 13]);

impl Tags {
    fn read(b: &[u8], e: Endian, ifd: usize, n: usize) -> Option<Self> {
        let mut tags = [None; 13];
        for k in 0..n {
            let at = ifd + 2 + 12 * k;
            let tag = e.u16(b, at)?;
            let Some(slot) = WANTED.iter().position(|&t| t == tag) else {
                continue;
            };
            let ty = e.u16(b, at + 2)?;
            let count = e.u32(b, at + 4)? as usize;
            let size = match ty {
                3 => 2,
                4 => 4,
                _ => return None,
            };
            let at = if count.checked_mul(size)? <= 4 {
                at + 8
            } else {
                e.u32(b, at + 8)? as usize
            };
            b.get(at..at.checked_add(count * size)?)?;
            tags[slot] = Some(Entry { ty, count, at });
        }
        Some(Self(tags))
    }

    fn get(&self, tag: u16) -> Option<Entry> {
        WANTED
            .iter()
            .position(|&t| t == tag)
            .and_then(|k| self.0[k])
    }
}

/// Decodes `bytes` into `out` (C×H×W, reusing `out.data`'s allocation) if it is a TIFF this
/// path handles; `false` (and `out` unspecified) otherwise.
pub fn decode_uncompressed(bytes: &[u8], out: &mut ImageChw) -> bool {
    decode(bytes, out).is_some()
}

fn decode(b: &[u8], out: &mut ImageChw) -> Option<()> {
    let e = match b.get(0..2)? {
        b"II" => Endian { big: false },
        b"MM" => Endian { big: true },
        _ => return None,
    };
    if e.u16(b, 2)? != 42 {
        return None; // BigTIFF (43) or not a TIFF
    }
    let ifd = e.u32(b, 4)? as usize;
    let n = usize::from(e.u16(b, ifd)?);
    let entries_end = ifd + 2 + 12 * n;
    if e.u32(b, entries_end)? != 0 {
        return None; // several pages
    }
    let tags = Tags::read(b, e, ifd, n)?;
    let get = |tag: u16| tags.get(tag);
    let scalar = |tag: u16, default: u64| match get(tag) {
        Some(entry) => entry.uniform(b, e),
        None => Some(default),
    };
    if get(TAG_TILE_WIDTH).is_some()
        || scalar(TAG_COMPRESSION, 1)? != 1
        || scalar(TAG_PREDICTOR, 1)? != 1
        || !matches!(scalar(TAG_PHOTOMETRIC, 1)?, 1 | 2)
    {
        return None;
    }
    let width = scalar(TAG_WIDTH, 0)? as usize;
    let height = scalar(TAG_HEIGHT, 0)? as usize;
    let spp = scalar(TAG_SAMPLES, 1)? as usize;
    let planar = match scalar(TAG_PLANAR, 1)? {
        1 => false,
        2 => true,
        _ => return None,
    };
    if width == 0 || height == 0 || spp == 0 {
        return None;
    }
    let per_sample = |tag: u16, default: u64| match get(tag) {
        Some(entry) if entry.count == spp || entry.count == 1 => entry.uniform(b, e),
        Some(_) => None,
        None => Some(default),
    };
    let kind = SampleKind::of(per_sample(TAG_BITS, 1)?, per_sample(TAG_SAMPLE_FORMAT, 1)?)?;
    let rows_per_strip = (scalar(TAG_ROWS_PER_STRIP, u64::from(u32::MAX))? as usize).min(height);
    if rows_per_strip == 0 {
        return None;
    }
    let strips_per_plane = height.div_ceil(rows_per_strip);
    let planes = if planar { spp } else { 1 };
    let offsets = get(TAG_STRIP_OFFSETS)?;
    let counts = get(TAG_STRIP_BYTES)?;
    if offsets.count != strips_per_plane * planes || counts.count != offsets.count {
        return None;
    }
    let row_bytes = width
        .checked_mul(if planar { 1 } else { spp })?
        .checked_mul(kind.bytes())?;
    let len = spp.checked_mul(height)?.checked_mul(width)?;
    if len.checked_mul(kind.bytes())? > b.len() {
        return None; // a damaged header must not make us allocate what the file cannot hold
    }
    out.channels = spp;
    out.height = height;
    out.width = width;
    out.data.clear();
    out.data.resize(len, 0.0);
    let plane_len = height * width;
    for s in 0..offsets.count {
        let (plane, strip) = (s / strips_per_plane, s % strips_per_plane);
        let y0 = strip * rows_per_strip;
        let rows = rows_per_strip.min(height - y0);
        let need = rows * row_bytes;
        let start = offsets.value(b, e, s)? as usize;
        if (counts.value(b, e, s)? as usize) < need {
            return None;
        }
        let data = b.get(start..start.checked_add(need)?)?;
        let big = e.big;
        if planar {
            let dst = &mut out.data[plane * plane_len + y0 * width..][..rows * width];
            dispatch!(kind, big, convert(data, dst));
        } else {
            dispatch!(
                kind,
                big,
                scatter_chunky(data, spp, plane_len, y0 * width, &mut out.data)
            );
        }
    }
    Some(())
}

/// Converts consecutive samples `src` into `dst` (one value each).
fn convert<T: Sample, const BIG: bool>(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(T::N)) {
        *d = get::<T, BIG>(s);
    }
}

/// Interleaved pixels (`spp` samples each) starting at pixel `first` → channel planes.
fn scatter_chunky<T: Sample, const BIG: bool>(
    src: &[u8],
    spp: usize,
    plane_len: usize,
    first: usize,
    out: &mut [f32],
) {
    let n = src.len() / (T::N * spp);
    for c in 0..spp {
        let dst = &mut out[c * plane_len + first..][..n];
        let samples = src[c * T::N..].chunks(T::N).step_by(spp);
        for (d, s) in dst.iter_mut().zip(samples) {
            *d = get::<T, BIG>(s);
        }
    }
}
