//! CellProfiler's LoadData table: one row per site, one image file per channel.
//!
//! A channel `DNA` is read from `URL_DNA` (a full path or URL, as the Cell Painting Gallery
//! writes it) or from `PathName_DNA` + `FileName_DNA` (CellProfiler's form), also spelled
//! with CellProfiler's `Orig` prefix (`FileName_OrigDNA`). A relative path is below the
//! table's folder. Where the table names an illumination function for the channel
//! (`FileName_IllumDNA`/`PathName_IllumDNA` or `URL_IllumDNA`, a 2-D `.npy`), the channel is
//! divided by it, as CorrectIlluminationApply's `Divide` does. A label image per site (for
//! cells placed by segmentation masks) is named like a channel (`ObjectsFileName_Nuclei`,
//! `FileName_Nuclei` or `URL_Nuclei`).
use super::files::{Base, Files};
use super::npy::{self, Npy2};
use super::{FieldLayout, Labels, ScreenError, Site, PLATE, SITE, WELL};
use crate::data::chw::ImageChw;
use crate::data::csv::Csv;
use std::collections::HashMap;
use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

/// What to read from a LoadData table.
#[derive(Debug, Clone, Default)]
pub struct LoadDataOptions {
    /// Channel names, in the order the model sees them.
    pub channels: Vec<String>,
    /// The name of a label-image column, e.g. `Nuclei`.
    pub labels: Option<String>,
    /// Divide by the illumination functions the table names (ignored where it names none).
    pub illumination: bool,
}

/// A LoadData table opened: its sites and, per site, the file of every selected channel.
pub struct LoadData {
    address: String,
    sites: Vec<Site>,
    image_numbers: Vec<u64>,
    channels: Vec<String>,
    /// `[site][channel]` → address of the channel's file.
    files: Vec<Vec<String>>,
    /// `[site][channel]` → address of its illumination function, where there is one.
    illum: Vec<Vec<Option<String>>>,
    labels: Option<Vec<String>>,
    reader: Arc<Files>,
    illum_cache: Mutex<HashMap<String, Arc<Npy2>>>,
    shape: OnceLock<(usize, usize)>,
}

/// Where a table keeps one kind of file: full addresses, or folder + file name columns.
enum FileColumns {
    Url(usize),
    Split { file: usize, path: Option<usize> },
}

impl FileColumns {
    /// The columns naming `name`'s file under any of the spellings `prefixes` (e.g. `URL_`,
    /// `FileName_` with `PathName_`).
    fn find(csv: &Csv, name: &str, objects: bool) -> Option<Self> {
        let col = |c: String| csv.header.iter().position(|h| *h == c);
        let mut forms = vec![("URL_", "FileName_", "PathName_")];
        if objects {
            forms.insert(0, ("ObjectsURL_", "ObjectsFileName_", "ObjectsPathName_"));
        }
        forms.into_iter().find_map(|(url, file, path)| {
            if let Some(i) = col(format!("{url}{name}")) {
                return Some(Self::Url(i));
            }
            col(format!("{file}{name}")).map(|f| Self::Split {
                file: f,
                path: col(format!("{path}{name}")),
            })
        })
    }

    /// The address in `fields`, resolved against the table; `None` for an empty cell.
    fn address(&self, fields: &[String], base: &Base) -> Option<String> {
        let joined = match self {
            Self::Url(i) => fields[*i].trim().to_string(),
            Self::Split { file, path } => {
                let file = fields[*file].trim();
                if file.is_empty() {
                    return None;
                }
                match path.map(|p| fields[p].trim().trim_end_matches('/')) {
                    Some(dir) if !dir.is_empty() => format!("{dir}/{file}"),
                    _ => file.to_string(),
                }
            }
        };
        (!joined.is_empty()).then(|| base.resolve(&joined))
    }
}

impl LoadData {
    /// Reads the table at `address` (a path or store URL; CSV, optionally `.gz`, or Parquet).
    pub fn open(
        address: &str,
        opts: &LoadDataOptions,
        reader: Arc<Files>,
    ) -> Result<Self, ScreenError> {
        let csv = super::table::read_table(&reader, address)?;
        if csv.rows.is_empty() {
            return Err(ScreenError::table(
                address,
                "the table has no rows (no sites)",
            ));
        }
        let base = Base::of(address);
        let channel_cols = opts
            .channels
            .iter()
            .map(|ch| {
                FileColumns::find(&csv, ch, false)
                    .or_else(|| FileColumns::find(&csv, &format!("Orig{ch}"), false))
                    .ok_or_else(|| ScreenError::MissingChannel {
                        source_name: address.to_string(),
                        channel: ch.clone(),
                        available: channel_names(&csv),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let illum_cols: Vec<Option<FileColumns>> = opts
            .channels
            .iter()
            .map(|ch| {
                opts.illumination
                    .then(|| FileColumns::find(&csv, &format!("Illum{ch}"), false))
                    .flatten()
            })
            .collect();
        let label_cols = match &opts.labels {
            Some(name) => Some(FileColumns::find(&csv, name, true).ok_or_else(|| {
                ScreenError::table(
                    address,
                    format!(
                        "no label-image column for {name:?} (ObjectsFileName_{name}, FileName_{name} or URL_{name})"
                    ),
                )
            })?),
            None => None,
        };
        let meta_cols = metadata_columns(&csv.header);
        let number_col = csv.header.iter().position(|h| h == "ImageNumber");
        let mut out = Self {
            address: address.to_string(),
            sites: vec![],
            image_numbers: vec![],
            channels: opts.channels.clone(),
            files: vec![],
            illum: vec![],
            labels: label_cols.as_ref().map(|_| vec![]),
            reader,
            illum_cache: Mutex::new(HashMap::new()),
            shape: OnceLock::new(),
        };
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (row, (_, fields)) in csv.rows.iter().enumerate() {
            let row = row + 1;
            let metadata: Vec<(String, String)> = meta_cols
                .iter()
                .map(|&i| (csv.header[i].clone(), fields[i].clone()))
                .collect();
            let site = site_from(metadata, row);
            if let Some(first) = seen.insert(site.name.clone(), row) {
                return Err(ScreenError::row(
                    address,
                    row,
                    format!("site {} is listed again (first in row {first})", site.name),
                ));
            }
            let mut files = vec![];
            for (ch, col) in opts.channels.iter().zip(&channel_cols) {
                files.push(col.address(fields, &base).ok_or_else(|| {
                    ScreenError::row(address, row, format!("no file for channel {ch:?}"))
                })?);
            }
            out.illum.push(
                illum_cols
                    .iter()
                    .map(|c| c.as_ref().and_then(|c| c.address(fields, &base)))
                    .collect(),
            );
            if let (Some(col), Some(labels)) = (&label_cols, &mut out.labels) {
                labels.push(col.address(fields, &base).ok_or_else(|| {
                    ScreenError::row(address, row, "no label image for this site")
                })?);
            }
            let number = match number_col {
                Some(i) => super::table::whole_number(&fields[i]).ok_or_else(|| {
                    ScreenError::row(
                        address,
                        row,
                        format!("ImageNumber {:?} is not a whole number", fields[i]),
                    )
                })?,
                None => row as u64,
            };
            out.image_numbers.push(number);
            out.files.push(files);
            out.sites.push(site);
        }
        Ok(out)
    }

    /// CellProfiler's `ImageNumber` of every site: the table's column, or the 1-based row.
    pub fn image_numbers(&self) -> &[u64] {
        &self.image_numbers
    }

    /// One channel file decoded to a single H×W plane.
    fn read_plane(&self, address: &str) -> Result<ImageChw, ScreenError> {
        let bytes = self.reader.read(address)?;
        let img = crate::data::tiff_reader::decode_tiff(Cursor::new(bytes), Path::new(address))?;
        if img.channels != 1 {
            return Err(ScreenError::table(
                address,
                format!(
                    "has {} channels; a LoadData table names one single-channel file per channel",
                    img.channels
                ),
            ));
        }
        Ok(img)
    }

    fn illumination(&self, address: &str) -> Result<Arc<Npy2>, ScreenError> {
        let mut cache = self.illum_cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = cache.get(address) {
            return Ok(f.clone());
        }
        let f = npy::parse(&self.reader.read(address)?, address)?;
        let bad = f
            .data
            .iter()
            .filter(|v| !(**v > 0.0 && v.is_finite()))
            .count();
        if bad > 0 {
            return Err(ScreenError::table(
                address,
                format!("{bad} values of the illumination function are not positive and finite"),
            ));
        }
        let f = Arc::new(f);
        cache.insert(address.to_string(), f.clone());
        Ok(f)
    }
}

/// `Metadata_*` columns, Plate, Well and Site first.
fn metadata_columns(header: &[String]) -> Vec<usize> {
    let mut cols: Vec<usize> = [PLATE, WELL, SITE]
        .iter()
        .filter_map(|k| header.iter().position(|h| h == k))
        .collect();
    let rest: Vec<usize> = header
        .iter()
        .enumerate()
        .filter(|(i, h)| h.starts_with("Metadata_") && !cols.contains(i))
        .map(|(i, _)| i)
        .collect();
    cols.extend(rest);
    cols
}

/// A site named by its plate/well/site metadata, or by its row when it has none.
pub fn site_from(metadata: Vec<(String, String)>, row: usize) -> Site {
    let keys: Vec<&str> = [PLATE, WELL, SITE]
        .iter()
        .filter_map(|k| {
            metadata
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        })
        .collect();
    let name = if keys.is_empty() {
        format!("row{row}")
    } else {
        keys.join("/")
    };
    Site { name, metadata }
}

/// The channel names a table offers, for the message when one is missing.
fn channel_names(csv: &Csv) -> Vec<String> {
    csv.header
        .iter()
        .filter_map(|h| {
            h.strip_prefix("URL_")
                .or_else(|| h.strip_prefix("FileName_"))
        })
        .filter(|n| !n.starts_with("Illum"))
        .map(|n| n.strip_prefix("Orig").unwrap_or(n).to_string())
        .collect()
}

impl FieldLayout for LoadData {
    fn sites(&self) -> &[Site] {
        &self.sites
    }

    fn channels(&self) -> &[String] {
        &self.channels
    }

    fn read_site(&self, site: usize) -> Result<ImageChw, ScreenError> {
        let mut planes = Vec::with_capacity(self.channels.len());
        for (c, address) in self.files[site].iter().enumerate() {
            let mut plane = self.read_plane(address)?;
            if let Some(illum) = &self.illum[site][c] {
                let f = self.illumination(illum)?;
                if (f.height, f.width) != (plane.height, plane.width) {
                    return Err(ScreenError::Site {
                        site: self.sites[site].name.clone(),
                        reason: format!(
                            "illumination function {illum} is {}×{} but {address} is {}×{}",
                            f.height, f.width, plane.height, plane.width
                        ),
                    });
                }
                plane
                    .data
                    .iter_mut()
                    .zip(&f.data)
                    .for_each(|(v, d)| *v /= d);
            }
            planes.push((address, plane));
        }
        let (first, (h, w)) = (planes[0].0, (planes[0].1.height, planes[0].1.width));
        let mut data = Vec::with_capacity(planes.len() * h * w);
        for (address, plane) in &planes {
            if (plane.height, plane.width) != (h, w) {
                return Err(ScreenError::Site {
                    site: self.sites[site].name.clone(),
                    reason: format!(
                        "{address} is {}×{} but {first} is {h}×{w}",
                        plane.height, plane.width
                    ),
                });
            }
            data.extend_from_slice(&plane.data);
        }
        let known = *self.shape.get_or_init(|| (h, w));
        if known != (h, w) {
            return Err(ScreenError::Site {
                site: self.sites[site].name.clone(),
                reason: format!(
                    "is {h}×{w} but the table's first site read was {}×{}: every site of a \
                     LoadData table must have one size",
                    known.0, known.1
                ),
            });
        }
        Ok(ImageChw::new(planes.len(), h, w, data)?)
    }

    /// Every site of a screen has one size (a microscope's field of view): the first plane
    /// read gives it, and [`Self::read_site`] refuses a site of another.
    fn site_shape(&self, site: usize) -> Result<(usize, usize), ScreenError> {
        if let Some(shape) = self.shape.get() {
            return Ok(*shape);
        }
        let plane = self.read_plane(&self.files[site][0])?;
        Ok(*self.shape.get_or_init(|| (plane.height, plane.width)))
    }

    fn read_labels(&self, site: usize) -> Result<Option<Labels>, ScreenError> {
        let Some(labels) = &self.labels else {
            return Ok(None);
        };
        let plane = self.read_plane(&labels[site])?;
        Ok(Some(super::labels::from_plane(&plane, &labels[site])?))
    }

    fn describe(&self) -> String {
        format!(
            "{} sites × {} channels ({}) from the LoadData table {}",
            self.sites.len(),
            self.channels.len(),
            self.channels.join(", "),
            self.address
        )
    }
}
