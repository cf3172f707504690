//! CHAMMI's tiled crops (Chen et al., NeurIPS 2023): one image per cell, its channels side by
//! side, listed in a metadata CSV (`enriched_meta.csv`: `file_path`, `channel_width`,
//! `Label`, `train_test_split`, ...).
//!
//! Each row is a site holding exactly one cell, the whole image
//! ([`FieldLayout::cells_are_sites`]). An image of `h` rows and `C·w` columns (`w` =
//! `channel_width`) is folded as CHAMMI's loaders do, `np.reshape(img, (h, w, -1),
//! order="F")`: in Fortran order pixel `(y, x)` of the 2-D image is element `y + h·x`, and
//! output `(y, x', c)` is element `y + h·x' + h·w·c`, so channel `c` is columns
//! `c·w .. (c+1)·w` — the tiles left to right, each row unchanged. Only 2-D (grayscale)
//! images are folded: for a 3-D RGB image the same reshape would interleave colour planes
//! and tiles, which no CHAMMI file needs, so it is refused.
//!
//! CHAMMI mixes datasets with different channels (WTC-11/`Allen`: 3, HPA: 4, CP: 5). Each
//! row's channels are named by its dataset (`data.screen.dataset_channels`, CHAMMI's own
//! names by default) and `data.channel_names` picks channels by those names, so every cell
//! read has the same channels in the same order: a table whose datasets share the named
//! channels (nucleus and protein in `Allen` and `HPA`) is read whole; a row lacking one is
//! refused at opening, naming the row, its dataset and the channels it has.
//!
//! A row's own problems (a missing file, a width that is not a whole number of tiles, an
//! empty `channel_width`, a PNG that is not 8- or 16-bit grayscale) are found when its cell
//! is read and fail that cell only, naming the file and the table row, so `trainer embed`
//! records it in its errors table and goes on.
use super::files::{Base, Files};
use super::{FieldLayout, ScreenError, Site};
use crate::data::chw::ImageChw;
use crate::data::csv::Csv;
use std::collections::{BTreeMap, HashMap};
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

/// CHAMMI's datasets and their channels, in the order their tiles are stored
/// (chaudatascience/channel_adaptive_models `configs/dataset/morphem70k_v2_12channels.yaml`).
pub const CHAMMI_CHANNELS: [(&str, &[&str]); 4] = [
    ("Allen", &["nucleus", "membrane", "protein"]),
    ("WTC", &["nucleus", "membrane", "protein"]),
    ("HPA", &["microtubules", "protein", "nucleus", "er"]),
    ("CP", &["nucleus", "er", "rna", "golgi", "mito"]),
];

/// The metadata column naming each cell's dataset (what `trainer metrics chammi` reads).
pub const DATASET: &str = "Metadata_Dataset";

/// What to read from a CHAMMI table (`data.screen`'s `chammi` keys).
#[derive(Debug, Clone, Default)]
pub struct ChammiOptions {
    /// Channel names, in the order the model sees them.
    pub channels: Vec<String>,
    /// The folder `file_path` is relative to; `None` = the table's.
    pub image_root: Option<String>,
    /// The column naming a row's dataset; `None` = the first folder of `file_path`.
    pub dataset_column: Option<String>,
    /// Only these datasets' rows.
    pub datasets: Option<Vec<String>>,
    /// Only rows whose column holds one of the values.
    pub rows: BTreeMap<String, Vec<String>>,
    /// Channel names per dataset, over [`CHAMMI_CHANNELS`].
    pub dataset_channels: BTreeMap<String, Vec<String>>,
    /// Each cell keeps those of `channels` its dataset has (`data.screen.cell_channels:
    /// own`), instead of every row having to have them all.
    pub own_channels: bool,
}

/// One row read: where its image is and how to fold it.
#[derive(Debug, Clone)]
struct Row {
    /// Data row of the table, from 1.
    row: usize,
    /// The image's address; `Err` = why the row names none.
    image: Result<String, String>,
    /// `channel_width`; `Err` = why it is not a positive whole number.
    width: Result<usize, String>,
    dataset: String,
    /// The dataset's channel count (tiles per image).
    tiles: usize,
    /// The tile of each channel read, in `channels` order (shared by a dataset's rows).
    pick: Arc<[usize]>,
    /// The positions in `channels` of the channels read (all of them unless
    /// [`ChammiOptions::own_channels`]; shared by a dataset's rows).
    present: Arc<[usize]>,
}

/// A CHAMMI metadata table opened: one site (one cell) per row read.
pub struct Chammi {
    address: String,
    channels: Vec<String>,
    own_channels: bool,
    sites: Vec<Site>,
    rows: Vec<Row>,
    reader: Arc<Files>,
}

/// A decoded 2-D image: `height` rows of `width` values.
struct Plane {
    height: usize,
    width: usize,
    data: Vec<f32>,
}

impl Chammi {
    /// Reads the table at `address` (a path or store URL, CSV, optionally `.gz`).
    pub fn open(
        address: &str,
        opts: &ChammiOptions,
        reader: Arc<Files>,
    ) -> Result<Self, ScreenError> {
        let text = reader.read_text(address)?;
        let csv = Csv::parse(&text, Path::new(address))
            .map_err(|e| ScreenError::table(address, e.to_string()))?;
        let col = |name: &str, why: &str| {
            csv.header.iter().position(|h| h == name).ok_or_else(|| {
                ScreenError::table(
                    address,
                    format!(
                        "no column {name:?} ({why}); the header is: {}",
                        csv.header.join(", ")
                    ),
                )
            })
        };
        let file_col = col("file_path", "each cell's image")?;
        let width_col = col("channel_width", "the width of one channel's tile")?;
        let dataset_col = match &opts.dataset_column {
            Some(c) => Some(col(c, "data.screen.dataset_column")?),
            None => None,
        };
        let filters = opts
            .rows
            .iter()
            .map(|(c, values)| Ok((col(c, "data.screen.rows")?, values)))
            .collect::<Result<Vec<_>, ScreenError>>()?;
        let base = match &opts.image_root {
            Some(root) if super::files::is_url(root) => {
                Base::Url(root.trim_end_matches('/').to_string())
            }
            Some(root) => Base::Dir(root.into()),
            None => Base::of(address),
        };
        let mut out = Self {
            address: address.to_string(),
            channels: opts.channels.clone(),
            own_channels: opts.own_channels,
            sites: vec![],
            rows: vec![],
            reader,
        };
        let columns = metadata_columns(&csv.header);
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut per_dataset: HashMap<String, Result<Picked, String>> = HashMap::new();
        for (i, (_, fields)) in csv.rows.iter().enumerate() {
            let row = i + 1;
            let file = fields[file_col].trim();
            let dataset = match dataset_col {
                Some(c) => fields[c].trim().to_string(),
                None => first_folder(file).ok_or_else(|| {
                    ScreenError::row(
                        address,
                        row,
                        format!(
                            "file_path {file:?} has no folder to name its dataset \
                             (set data.screen.dataset_column)"
                        ),
                    )
                })?,
            };
            let wanted = opts.datasets.as_ref().is_none_or(|d| d.contains(&dataset))
                && filters.iter().all(|(c, v)| v.contains(&fields[*c]));
            if !wanted {
                continue;
            }
            let (tiles, pick, present) = per_dataset
                .entry(dataset.clone())
                .or_insert_with(|| pick_dataset(opts, &dataset))
                .clone()
                .map_err(|reason| ScreenError::row(address, row, reason))?;
            if !file.is_empty() {
                if let Some(first) = seen.insert(file.to_string(), row) {
                    return Err(ScreenError::row(
                        address,
                        row,
                        format!("file_path {file:?} is listed twice (rows {first} and {row})"),
                    ));
                }
            }
            out.sites
                .push(site_of(&columns, fields, file, &dataset, row));
            out.rows.push(Row {
                row,
                image: if file.is_empty() {
                    Err("its file_path is empty".into())
                } else {
                    Ok(base.resolve(file))
                },
                width: parse_width(&fields[width_col]),
                dataset,
                tiles,
                pick,
                present,
            });
        }
        if out.rows.is_empty() {
            return Err(ScreenError::table(
                address,
                "no rows to read (the table is empty, or data.screen.datasets/rows keep none)",
            ));
        }
        Ok(out)
    }

    /// An error of row `r`'s cell, naming its file (when it has one) and its table row.
    fn row_error(&self, r: &Row, reason: impl std::fmt::Display) -> ScreenError {
        let reason = match &r.image {
            Ok(file) => format!("{file}: {reason}"),
            Err(_) => reason.to_string(),
        };
        ScreenError::row(&self.address, r.row, reason)
    }

    /// Row `r`'s image, decoded and checked against its dataset's tiles.
    fn read_plane(&self, r: &Row) -> Result<(Plane, usize), ScreenError> {
        let image = r.image.as_ref().map_err(|e| self.row_error(r, e))?;
        let width = *r.width.as_ref().map_err(|e| self.row_error(r, e))?;
        let bytes = self
            .reader
            .read(image)
            .map_err(|e| ScreenError::row(&self.address, r.row, e.to_string()))?;
        let plane = decode(&bytes, image).map_err(|e| self.row_error(r, e))?;
        if plane.width % width != 0 {
            return Err(self.row_error(
                r,
                format!(
                    "is {} px wide, not a whole number of {width}-px tiles (channel_width)",
                    plane.width
                ),
            ));
        }
        if plane.width / width != r.tiles {
            return Err(self.row_error(
                r,
                format!(
                    "holds {} tiles of {width} px but dataset {} has {} channels",
                    plane.width / width,
                    r.dataset,
                    r.tiles
                ),
            ));
        }
        Ok((plane, width))
    }
}

/// Row `row`'s site: named by its `file_path`, its columns as metadata, its dataset first.
fn site_of(
    columns: &[(usize, String)],
    fields: &[String],
    file: &str,
    dataset: &str,
    row: usize,
) -> Site {
    let mut metadata = vec![];
    if !columns.iter().any(|(_, name)| name == DATASET) {
        metadata.push((DATASET.to_string(), dataset.to_string()));
    }
    metadata.extend(
        columns
            .iter()
            .map(|(c, name)| (name.clone(), fields[*c].clone())),
    );
    let name = if file.is_empty() {
        format!("row{row}")
    } else {
        file.to_string()
    };
    Site { name, metadata }
}

/// The first folder of a relative `file_path` (`Allen/…` → `Allen`).
fn first_folder(file: &str) -> Option<String> {
    let file = file.trim_start_matches("./");
    file.split_once('/')
        .map(|(d, _)| d.to_string())
        .filter(|d| !d.is_empty())
}

/// Every named column as metadata, as `Metadata_<column>` (a column already so named kept).
fn metadata_columns(header: &[String]) -> Vec<(usize, String)> {
    header
        .iter()
        .enumerate()
        .filter(|(_, h)| !h.is_empty())
        .map(|(i, h)| {
            let name = if h.starts_with("Metadata_") {
                h.clone()
            } else {
                format!("Metadata_{h}")
            };
            (i, name)
        })
        .collect()
}

fn dataset_channels(opts: &ChammiOptions, dataset: &str) -> Option<Vec<String>> {
    if let Some(names) = opts.dataset_channels.get(dataset) {
        return Some(names.clone());
    }
    CHAMMI_CHANNELS
        .iter()
        .find(|(d, _)| *d == dataset)
        .map(|(_, names)| names.iter().map(|n| n.to_string()).collect())
}

fn no_names(dataset: &str) -> String {
    format!(
        "dataset {dataset:?} has no channel names (CHAMMI's are {}): add \
         data.screen.dataset_channels.{dataset}",
        CHAMMI_CHANNELS.map(|(d, _)| d).join(", ")
    )
}

/// A dataset's tile count, the tile of each channel read and that channel's position in
/// `data.channel_names` (the last two shared by the dataset's rows).
type Picked = (usize, Arc<[usize]>, Arc<[usize]>);

/// What dataset `dataset`'s rows read ([`Picked`]), or why the dataset cannot give it.
fn pick_dataset(opts: &ChammiOptions, dataset: &str) -> Result<Picked, String> {
    let names = dataset_channels(opts, dataset).ok_or_else(|| no_names(dataset))?;
    let (pick, present) = if opts.own_channels {
        pick_own(&opts.channels, &names, dataset)?
    } else {
        let pick = pick(&opts.channels, &names, dataset)?;
        (pick, (0..opts.channels.len()).collect())
    };
    Ok((names.len(), pick.into(), present.into()))
}

/// The tile of each wanted channel among `names`, or why the dataset cannot give them.
fn pick(wanted: &[String], names: &[String], dataset: &str) -> Result<Vec<usize>, String> {
    wanted
        .iter()
        .map(|w| {
            names.iter().position(|n| n == w).ok_or_else(|| {
                format!(
                    "dataset {dataset} has channels [{}], not {w:?} (data.channel_names); \
                     every row read must have every named channel: name channels its \
                     datasets share, keep one dataset (data.screen.datasets), or train each \
                     cell on its own channels (data.screen.cell_channels: own, with \
                     model.channels bag or tokens)",
                    names.join(", ")
                )
            })
        })
        .collect()
}

/// `cell_channels: own`: the tiles of those wanted channels the dataset has, and their
/// positions among `wanted` (ascending), or why it has none.
fn pick_own(
    wanted: &[String],
    names: &[String],
    dataset: &str,
) -> Result<(Vec<usize>, Vec<usize>), String> {
    let (present, pick): (Vec<usize>, Vec<usize>) = wanted
        .iter()
        .enumerate()
        .filter_map(|(k, w)| names.iter().position(|n| n == w).map(|t| (k, t)))
        .unzip();
    if pick.is_empty() {
        return Err(format!(
            "dataset {dataset} has channels [{}], none of data.channel_names [{}]: name one of \
             them, or leave the dataset out (data.screen.datasets)",
            names.join(", "),
            wanted.join(", ")
        ));
    }
    Ok((pick, present))
}

fn parse_width(field: &str) -> Result<usize, String> {
    let f = field.trim();
    if f.is_empty() {
        return Err("its channel_width is empty".into());
    }
    // pandas writes an integer column holding a missing value as floats (`160.0`).
    let value = f
        .parse::<usize>()
        .ok()
        .or_else(|| {
            f.parse::<f64>()
                .ok()
                .filter(|v| v.fract() == 0.0 && *v >= 1.0 && *v < 1e9)
                .map(|v| v as usize)
        })
        .filter(|&v| v > 0);
    value.ok_or_else(|| format!("its channel_width {f:?} is not a positive whole number"))
}

/// A PNG (8- or 16-bit grayscale) or a single-channel TIFF, by its first bytes.
fn decode(bytes: &[u8], address: &str) -> Result<Plane, String> {
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
    let tiff = [b"II*\0", b"MM\0*", b"II+\0", b"MM\0+"];
    if bytes.starts_with(PNG) {
        return decode_png(bytes);
    }
    if tiff.iter().any(|m| bytes.starts_with(*m)) {
        let img = crate::data::tiff_reader::decode_tiff(Cursor::new(bytes), Path::new(address))
            .map_err(|e| e.to_string())?;
        if img.channels != 1 {
            return Err(format!(
                "is a TIFF of {} samples per pixel; CHAMMI's crops are 2-D (one gray value \
                 per pixel, the channels side by side)",
                img.channels
            ));
        }
        return Ok(Plane {
            height: img.height,
            width: img.width,
            data: img.data,
        });
    }
    Err("is neither a PNG nor a TIFF".into())
}

/// The stored bit depth and colour type of a PNG, from its header (IHDR, always the first
/// chunk: bytes 24 and 25). The decoder expands 1-, 2- and 4-bit images to 8 bits and reports
/// those, so the header is where another bit depth shows.
fn png_header(bytes: &[u8]) -> Option<(u8, u8)> {
    (bytes.len() > 25 && &bytes[12..16] == b"IHDR").then(|| (bytes[24], bytes[25]))
}

fn decode_png(bytes: &[u8]) -> Result<Plane, String> {
    use image::{ColorType, ImageDecoder};
    let (depth, color) = png_header(bytes).ok_or("is a PNG without a header (IHDR)")?;
    let sixteen = match (depth, color) {
        (8, 0) => false,
        (16, 0) => true,
        _ => {
            let kind = match color {
                0 => "grayscale",
                2 => "RGB",
                3 => "palette",
                4 => "grayscale + alpha",
                6 => "RGBA",
                _ => "unknown colour type",
            };
            return Err(format!(
                "is a PNG of {depth}-bit {kind}; CHAMMI's crops are 8- or 16-bit grayscale"
            ));
        }
    };
    let decoder =
        image::codecs::png::PngDecoder::new(Cursor::new(bytes)).map_err(|e| format!("PNG: {e}"))?;
    let (width, height) = decoder.dimensions();
    let (width, height) = (width as usize, height as usize);
    // A transparency chunk turns grayscale into grayscale + alpha on decoding.
    let plain = if sixteen {
        ColorType::L16
    } else {
        ColorType::L8
    };
    if decoder.color_type() != plain {
        return Err(format!(
            "is a grayscale PNG that decodes as {:?} (a transparency chunk?); CHAMMI's crops \
             are plain 8- or 16-bit grayscale",
            decoder.color_type()
        ));
    }
    let mut buf = vec![0u8; decoder.total_bytes() as usize];
    decoder
        .read_image(&mut buf)
        .map_err(|e| format!("PNG: {e}"))?;
    // The decoder hands 16-bit samples over in native byte order.
    let data = if sixteen {
        buf.chunks_exact(2)
            .map(|b| f32::from(u16::from_ne_bytes([b[0], b[1]])))
            .collect()
    } else {
        buf.iter().map(|&v| f32::from(v)).collect()
    };
    Ok(Plane {
        height,
        width,
        data,
    })
}

/// Tiles `pick` of `plane` (each `w` wide) as C×H×w.
fn fold(plane: &Plane, w: usize, pick: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(pick.len() * plane.height * w);
    for &c in pick {
        for y in 0..plane.height {
            let start = y * plane.width + c * w;
            out.extend_from_slice(&plane.data[start..start + w]);
        }
    }
    out
}

impl FieldLayout for Chammi {
    fn sites(&self) -> &[Site] {
        &self.sites
    }

    fn channels(&self) -> &[String] {
        &self.channels
    }

    fn read_site(&self, site: usize) -> Result<ImageChw, ScreenError> {
        let r = &self.rows[site];
        let (plane, w) = self.read_plane(r)?;
        let data = fold(&plane, w, &r.pick);
        ImageChw::new(r.pick.len(), plane.height, w, data).map_err(ScreenError::from)
    }

    fn site_channels(&self, site: usize) -> Option<&[usize]> {
        self.own_channels.then(|| &*self.rows[site].present)
    }

    fn cells_are_sites(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &self.rows {
            *per.entry(r.dataset.as_str()).or_default() += 1;
        }
        let per: Vec<String> = per.iter().map(|(d, n)| format!("{d}: {n}")).collect();
        format!(
            "CHAMMI table {} ({}), channels {}{}",
            self.address,
            per.join(", "),
            self.channels.join(", "),
            if self.own_channels {
                " (each cell its own)"
            } else {
                ""
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_takes_tiles_left_to_right() {
        // 2 rows, 3 tiles of 2 px: value = 10·tile + 100·row + column in tile.
        let data = (0..2)
            .flat_map(|y| (0..6).map(move |x| (100 * y + 10 * (x / 2) + x % 2) as f32))
            .collect();
        let plane = Plane {
            height: 2,
            width: 6,
            data,
        };
        assert_eq!(
            fold(&plane, 2, &[2, 0]),
            [20.0, 21.0, 120.0, 121.0, 0.0, 1.0, 100.0, 101.0]
        );
    }

    #[test]
    fn widths_and_datasets_are_read_or_refused() {
        assert_eq!(parse_width("160"), Ok(160));
        assert_eq!(parse_width("160.0"), Ok(160));
        assert!(parse_width("").unwrap_err().contains("empty"));
        assert!(parse_width("0").is_err() && parse_width("7.5").is_err());
        assert_eq!(first_folder("CP/plate/a.png").as_deref(), Some("CP"));
        assert_eq!(first_folder("a.png"), None);
    }
}
