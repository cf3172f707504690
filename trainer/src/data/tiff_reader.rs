//! Multi-channel TIFF reading (to C×H×W `f32`) and writing (u16, chunky).
//!
//! scDINO reads every image with `tifffile.imread`, which for the PBMC files
//! returns (H, W, C). Real microscopy data comes in three layouts, and the
//! `tiff` crate needs different care for each:
//!
//! | Layout in the file | What `tiff` 0.11 reports | How we read it |
//! |---|---|---|
//! | one IFD, `SamplesPerPixel = C`, chunky (interleaved H,W,C) | `Multiband{bits, C}` (or `RGB`...) | `read_image_to_buffer`, transpose HWC → CHW |
//! | one IFD, `PlanarConfiguration = 2` (separate planes) | same colour type, `planes = C` | `read_image_to_buffer` (**not** `read_image`, which returns only plane 0), already CHW |
//! | C pages of one sample each (ImageJ / tifffile stacks) | C × `Gray(bits)` | one channel per page; all pages must have the same size |
//!
//! Sample types u8/u16/u32/u64, i8/i16/i32/i64 and f16/f32/f64 are accepted
//! and converted to `f32` (exact for 8/16-bit integers and f32; 32/64-bit
//! integers above 2^24 and f64 values are rounded). Bit depths that are not
//! byte multiples (1-bit, 12-bit) are rejected, as are palette and YCbCr
//! images, whose stored values are not channel intensities.

use std::fs::File;
use std::io::{BufReader, Cursor, Read, Seek};
use std::path::Path;

use tiff::decoder::{Decoder, DecodingResult};
use tiff::encoder::{colortype, TiffEncoder};
use tiff::tags::ExtraSamples;
use tiff::ColorType;

use super::chw::checked_len;
pub use super::chw::{Chw, ImageChw, ImageChwU16};
use super::data_error::DataError;

/// Read a TIFF file into a C×H×W `f32` image (see the module docs for the
/// supported layouts). Every failure names `path`.
pub fn read_tiff(path: &Path) -> Result<ImageChw, DataError> {
    let file = File::open(path).map_err(|e| DataError::io(path, "opening TIFF", e))?;
    decode_tiff(BufReader::new(file), path)
}

/// Decodes the TIFF `bytes` into `out`, reusing its allocation: uncompressed single-page
/// files (what training reads every epoch) through [`super::tiff_fast`] without allocating,
/// anything else through [`decode_tiff`]. `path` is only used in errors.
pub fn decode_tiff_into(bytes: &[u8], path: &Path, out: &mut ImageChw) -> Result<(), DataError> {
    if super::tiff_fast::decode_uncompressed(bytes, out) {
        return Ok(());
    }
    *out = decode_tiff(Cursor::new(bytes), path)?;
    Ok(())
}

/// Decode a TIFF from any seekable reader; `path` is only used in errors.
/// Useful for in-memory data (tests, object storage).
pub fn decode_tiff<R: Read + Seek>(reader: R, path: &Path) -> Result<ImageChw, DataError> {
    let tiff_err = |source| DataError::Tiff {
        path: path.to_path_buf(),
        source,
    };
    let mut decoder = Decoder::new(reader).map_err(tiff_err)?;
    let mut pages = vec![decode_page(&mut decoder, path)?];
    while decoder.more_images() {
        decoder.next_image().map_err(tiff_err)?;
        pages.push(decode_page(&mut decoder, path)?);
    }
    assemble(pages, path)
}

/// One decoded IFD.
struct Page {
    width: usize,
    height: usize,
    samples: usize,
    /// True if the decoded buffer is plane-major (C,H,W); false if interleaved.
    plane_major: bool,
    values: Vec<f32>,
}

fn decode_page<R: Read + Seek>(decoder: &mut Decoder<R>, path: &Path) -> Result<Page, DataError> {
    let tiff_err = |source| DataError::Tiff {
        path: path.to_path_buf(),
        source,
    };
    let (w, h) = decoder.dimensions().map_err(tiff_err)?;
    let color = decoder.colortype().map_err(tiff_err)?;
    if matches!(color, ColorType::Palette(_) | ColorType::YCbCr(_)) {
        return Err(DataError::unsupported(
            path,
            format!("colour type {color:?} does not store channel intensities"),
        ));
    }
    let bits = color.bit_depth();
    if !matches!(bits, 8 | 16 | 32 | 64) {
        return Err(DataError::unsupported(
            path,
            format!("{bits}-bit samples (only 8/16/32/64-bit are supported)"),
        ));
    }
    let samples = usize::from(color.num_samples());
    let mut buffer = DecodingResult::U8(Vec::new());
    let layout = decoder
        .read_image_to_buffer(&mut buffer)
        .map_err(tiff_err)?;
    let values = to_f32(buffer);
    let (width, height) = (w as usize, h as usize);
    let expected = checked_len(samples, height, width)
        .map_err(|_| DataError::unsupported(path, "image too large"))?;
    if values.len() != expected {
        // read_image_to_buffer silently falls back to the first plane when all
        // planes exceed the decoder limits; never return such a partial image.
        return Err(DataError::unsupported(
            path,
            format!(
                "decoded {} samples, expected {width}×{height}×{samples} = {expected} (planar image over the decoding limits?)",
                values.len()
            ),
        ));
    }
    Ok(Page {
        width,
        height,
        samples,
        plane_major: layout.planes > 1,
        values,
    })
}

fn to_f32(buffer: DecodingResult) -> Vec<f32> {
    fn conv<T: Copy>(v: Vec<T>, f: impl Fn(T) -> f32) -> Vec<f32> {
        v.into_iter().map(f).collect()
    }
    match buffer {
        DecodingResult::U8(v) => conv(v, f32::from),
        DecodingResult::U16(v) => conv(v, f32::from),
        DecodingResult::U32(v) => conv(v, |x| x as f32),
        DecodingResult::U64(v) => conv(v, |x| x as f32),
        DecodingResult::I8(v) => conv(v, f32::from),
        DecodingResult::I16(v) => conv(v, f32::from),
        DecodingResult::I32(v) => conv(v, |x| x as f32),
        DecodingResult::I64(v) => conv(v, |x| x as f32),
        DecodingResult::F16(v) => conv(v, |x| x.to_f32()),
        DecodingResult::F32(v) => v,
        DecodingResult::F64(v) => conv(v, |x| x as f32),
    }
}

/// Turn the decoded pages into one C×H×W image.
fn assemble(mut pages: Vec<Page>, path: &Path) -> Result<ImageChw, DataError> {
    if pages.len() == 1 {
        let page = pages.remove(0);
        let (c, h, w) = (page.samples, page.height, page.width);
        return if page.plane_major || c == 1 {
            Chw::new(c, h, w, page.values)
        } else {
            Chw::from_hwc(c, h, w, &page.values)
        }
        .map_err(|e| DataError::unsupported(path, e.to_string()));
    }
    // Several pages: only a stack of single-sample pages is unambiguous.
    let (h, w) = (pages[0].height, pages[0].width);
    for (i, page) in pages.iter().enumerate() {
        if page.samples != 1 {
            return Err(DataError::unsupported(
                path,
                format!(
                    "{} pages and page {i} has {} samples per pixel; expected one multi-sample page or single-sample pages",
                    pages.len(),
                    page.samples
                ),
            ));
        }
        if (page.height, page.width) != (h, w) {
            return Err(DataError::unsupported(
                path,
                format!(
                    "page {i} is {}×{} but page 0 is {h}×{w}; all channel pages must have the same size",
                    page.height, page.width
                ),
            ));
        }
    }
    let channels = pages.len();
    let mut data = Vec::with_capacity(channels * h * w);
    for page in pages {
        data.extend_from_slice(&page.values);
    }
    Chw::new(channels, h, w, data).map_err(|e| DataError::unsupported(path, e.to_string()))
}

/// Encode a u16 image as one uncompressed IFD with `SamplesPerPixel = C`,
/// chunky (interleaved) samples, `Photometric = MinIsBlack` and C−1
/// `ExtraSamples = Unspecified`. `tifffile.imread` returns this as an
/// (H, W, C) uint16 array, like the real PBMC files (for C = 1: (H, W)).
pub fn encode_tiff_u16_chunky(image: &ImageChwU16) -> Result<Vec<u8>, DataError> {
    let bad = |e: tiff::TiffError| DataError::InvalidArgument(format!("TIFF encoding failed: {e}"));
    let (w, h) = (
        u32::try_from(image.width)
            .map_err(|_| DataError::InvalidArgument("width exceeds u32".into()))?,
        u32::try_from(image.height)
            .map_err(|_| DataError::InvalidArgument("height exceeds u32".into()))?,
    );
    if image.channels == 0
        || image.data.len() != checked_len(image.channels, image.height, image.width)?
    {
        return Err(DataError::InvalidArgument(format!(
            "cannot encode a {}×{}×{} image holding {} values",
            image.channels,
            image.height,
            image.width,
            image.data.len()
        )));
    }
    let hwc = image.to_hwc();
    let mut cursor = Cursor::new(Vec::with_capacity(hwc.len() * 2 + 512));
    {
        let mut encoder = TiffEncoder::new(&mut cursor).map_err(bad)?;
        // The tiff encoder models extra channels as a base colour type plus
        // ExtraSamples; Gray16 + (C-1) extras gives SamplesPerPixel = C.
        let mut img = encoder.new_image::<colortype::Gray16>(w, h).map_err(bad)?;
        if image.channels > 1 {
            img.extra_samples(&vec![ExtraSamples::Unspecified; image.channels - 1])
                .map_err(bad)?;
        }
        img.write_data(&hwc).map_err(bad)?;
    }
    Ok(cursor.into_inner())
}

/// Encode an `f32` image losslessly: as [`encode_tiff_u16_chunky`] when every value is a
/// whole number from 0 to 65535 (a crop of a 16-bit screen), else as one chunky IFD of 32-bit
/// floats (a crop divided by its illumination function). Both decode to the same values.
pub fn encode_tiff_f32(image: &ImageChw) -> Result<Vec<u8>, DataError> {
    if image
        .data
        .iter()
        .all(|v| (0.0..=65535.0).contains(v) && v.fract() == 0.0)
    {
        let u16s = image.data.iter().map(|&v| v as u16).collect();
        return encode_tiff_u16_chunky(&Chw::new(image.channels, image.height, image.width, u16s)?);
    }
    let bad = |e: tiff::TiffError| DataError::InvalidArgument(format!("TIFF encoding failed: {e}"));
    let too_big = || DataError::InvalidArgument("image side exceeds u32".into());
    let (w, h) = (
        u32::try_from(image.width).map_err(|_| too_big())?,
        u32::try_from(image.height).map_err(|_| too_big())?,
    );
    let hwc = image.to_hwc();
    let mut cursor = Cursor::new(Vec::with_capacity(hwc.len() * 4 + 512));
    {
        let mut encoder = TiffEncoder::new(&mut cursor).map_err(bad)?;
        let mut img = encoder
            .new_image::<colortype::Gray32Float>(w, h)
            .map_err(bad)?;
        if image.channels > 1 {
            img.extra_samples(&vec![ExtraSamples::Unspecified; image.channels - 1])
                .map_err(bad)?;
        }
        img.write_data(&hwc).map_err(bad)?;
    }
    Ok(cursor.into_inner())
}

/// Write `image` with [`encode_tiff_u16_chunky`] atomically: the bytes go to a
/// hidden temporary file in the same directory that is then renamed over
/// `path`, so a crash never leaves a truncated `.tiff` that the indexer would
/// pick up.
pub fn write_tiff_u16_chunky(path: &Path, image: &ImageChwU16) -> Result<(), DataError> {
    let bytes = encode_tiff_u16_chunky(image).map_err(|e| e.in_file(path))?;
    scdino_base::fs::write_atomic(path, &bytes).map_err(DataError::writing(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_u16(c: usize, h: usize, w: usize) -> ImageChwU16 {
        let data = (0..c * h * w).map(|i| (i * 997 % 65536) as u16).collect();
        Chw::new(c, h, w, data).unwrap()
    }

    #[test]
    fn hwc_round_trip() {
        let img = sample_u16(5, 3, 4);
        let hwc = img.to_hwc();
        assert_eq!(hwc[0], img.get(0, 0, 0));
        assert_eq!(hwc[1], img.get(1, 0, 0));
        assert_eq!(hwc[5], img.get(0, 0, 1));
        assert_eq!(Chw::from_hwc(5, 3, 4, &hwc).unwrap(), img);
    }

    #[test]
    fn encode_decode_round_trip() {
        for c in [1, 2, 5, 7] {
            let img = sample_u16(c, 6, 9);
            let bytes = encode_tiff_u16_chunky(&img).unwrap();
            let back = decode_tiff(Cursor::new(bytes), Path::new("mem")).unwrap();
            assert_eq!((back.channels, back.height, back.width), (c, 6, 9));
            let expected: Vec<f32> = img.data.iter().map(|&v| f32::from(v)).collect();
            assert_eq!(back.data, expected);
        }
    }

    #[test]
    fn truncated_and_garbage_give_errors_naming_the_path() {
        let bytes = encode_tiff_u16_chunky(&sample_u16(5, 7, 8)).unwrap();
        let path = Path::new("/data/cell.tiff");
        let mut errors = 0;
        for cut in 0..bytes.len() {
            // Cuts inside the trailing IFD padding may still decode; every
            // other cut must be an Err, and nothing may panic.
            if let Err(e) = decode_tiff(Cursor::new(&bytes[..cut]), path) {
                assert!(e.to_string().contains("/data/cell.tiff"), "{e}");
                errors += 1;
            }
        }
        assert!(
            errors > bytes.len() * 9 / 10,
            "only {errors} of {} cuts failed",
            bytes.len()
        );
        let mut state = 12345u64;
        for len in [0usize, 1, 4, 8, 16, 100, 1000] {
            let garbage: Vec<u8> = (0..len)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (state >> 56) as u8
                })
                .collect();
            assert!(decode_tiff(Cursor::new(garbage), path).is_err());
        }
        // Valid header, garbage afterwards.
        for header in [&b"II*\0"[..], &b"MM\0*"[..]] {
            let mut v = header.to_vec();
            v.extend_from_slice(&[0xff; 64]);
            assert!(decode_tiff(Cursor::new(v), path).is_err());
        }
    }

    #[test]
    fn corrupted_bytes_never_panic() {
        let bytes = encode_tiff_u16_chunky(&sample_u16(5, 7, 8)).unwrap();
        let mut state = 99u64;
        for _ in 0..2000 {
            let mut v = bytes.clone();
            for _ in 0..4 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let pos = (state >> 33) as usize % v.len();
                v[pos] = (state >> 17) as u8;
            }
            let _ = decode_tiff(Cursor::new(v), Path::new("x"));
        }
    }

    #[test]
    fn missing_file_is_io_error() {
        let err = read_tiff(Path::new("/nonexistent/dir/a.tiff")).unwrap_err();
        assert!(matches!(err, DataError::Io { .. }));
        assert!(err.to_string().contains("/nonexistent/dir/a.tiff"));
    }

    #[test]
    fn atomic_write_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tiff");
        write_tiff_u16_chunky(&path, &sample_u16(5, 4, 4)).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.tiff")]);
        assert_eq!(read_tiff(&path).unwrap().channels, 5);
    }
}

/// The fast path against the general decoder (here, since the decoder calls the fast path).
#[cfg(test)]
mod fast_path_tests {
    use super::super::tiff_fast::decode_uncompressed;
    use super::{decode_tiff, encode_tiff_u16_chunky, ImageChwU16};
    use crate::data::chw::ImageChw;
    use std::io::Cursor;
    use std::path::Path;

    fn sample_u16(c: usize, h: usize, w: usize, seed: usize) -> ImageChwU16 {
        let data = (0..c * h * w)
            .map(|i| ((i + seed) * 2654435761 % 65536) as u16)
            .collect();
        ImageChwU16::new(c, h, w, data).unwrap()
    }

    #[test]
    fn matches_the_general_decoder_on_our_own_files() {
        let mut out = ImageChw {
            channels: 0,
            height: 0,
            width: 0,
            data: Vec::new(),
        };
        for (c, h, w) in [
            (5, 50, 50),
            (1, 7, 3),
            (3, 64, 17),
            (6, 1, 1),
            (2, 300, 200),
        ] {
            let bytes = encode_tiff_u16_chunky(&sample_u16(c, h, w, h)).unwrap();
            assert!(decode_uncompressed(&bytes, &mut out), "{c}×{h}×{w}");
            let general = decode_tiff(Cursor::new(&bytes), Path::new("x.tiff")).unwrap();
            assert_eq!(out, general, "{c}×{h}×{w}");
        }
    }

    #[test]
    fn declines_what_it_does_not_handle_and_never_panics() {
        let bytes = encode_tiff_u16_chunky(&sample_u16(5, 20, 20, 1)).unwrap();
        let mut out = ImageChw {
            channels: 0,
            height: 0,
            width: 0,
            data: Vec::new(),
        };
        let full = decode_tiff(Cursor::new(&bytes), Path::new("x.tiff")).unwrap();
        for cut in 0..bytes.len() {
            // Truncated anywhere: declined, unless every byte it needs is still there.
            if decode_uncompressed(&bytes[..cut], &mut out) {
                assert_eq!(out, full, "cut at {cut}");
            }
        }
        let mut x = 0x9e37_79b9u32;
        for _ in 0..2000 {
            let mut v = bytes.clone();
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let at = x as usize % v.len();
                v[at] = (x >> 8) as u8;
            }
            let _ = decode_uncompressed(&v, &mut out);
        }
        assert!(!decode_uncompressed(b"not a tiff at all", &mut out));
    }
}
