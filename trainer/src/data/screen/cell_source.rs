//! A screen served as single cells: every consumer (mean/std, training, `data pack`,
//! features, embed) reads it as an [`ImageSource`] like any folder of per-cell TIFFs.
//!
//! Cells are listed site by site, so a pass in index order (mean/std, packing, features,
//! embed) reads each site once: the decoded sites last used are kept (`site_cache` of them),
//! and threads asking for the same site wait for one read instead of reading it again.
//! Chunked layouts (OME-Zarr) are instead read region by region, only the chunks a cell's
//! box touches.
use super::crop::{box_around, inside, Border};
use super::objects::Cell;
use super::{FieldLayout, Labels, ScreenError, CENTER_X, CENTER_Y, OBJECT_NUMBER};
use crate::data::chw::ImageChw;
use crate::data::index::{DatasetIndex, Sample};
use crate::data::{DataError, ImageSource};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// How cells are cut from their sites.
#[derive(Debug, Clone)]
pub struct CropOptions {
    /// Side of the square box around each centre, in site pixels.
    pub box_size: usize,
    pub border: Border,
    /// Zero the pixels of other objects (and background) using the site's label image.
    pub mask_objects: bool,
    /// The metadata column whose value is each cell's class (kNN, probe, evaluate); `None`
    /// puts every cell in one class, `cells`.
    pub label_column: Option<String>,
    /// Decoded sites kept for the cells that follow.
    pub site_cache: usize,
    /// The metadata column whose groups a held-out split keeps whole.
    pub split_by: Option<String>,
}

/// What opening a screen left out, for the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Cells whose box reaches outside their site (`border: skip`).
    pub at_border: usize,
}

struct SiteData {
    pixels: ImageChw,
    labels: Option<Labels>,
}

type Slot = Arc<OnceLock<Option<Arc<SiteData>>>>;

/// The cells of a screen, in site order.
pub struct ScreenSource {
    layout: Arc<dyn FieldLayout>,
    cells: Vec<Cell>,
    /// The table or plate, naming the screen in each cell's path.
    root: PathBuf,
    /// Built on first use: `trainer embed` never asks for it, and a path and a label string
    /// per cell would be most of what a screen of millions of cells holds.
    index: OnceLock<DatasetIndex>,
    opts: CropOptions,
    skipped: Skipped,
    cache: Mutex<VecDeque<(usize, Slot)>>,
    /// Per site, its cells' positions (cells are listed site by site).
    by_site: Vec<Vec<usize>>,
    /// Whole sites decoded since the last [`ImageSource::report`] (training reports once per
    /// epoch): with `data.order: sites` an epoch decodes each site once; in a shuffle over all
    /// cells most cells decode their site again.
    sites_decoded: AtomicU64,
}

impl ScreenSource {
    /// Serves `cells` of `layout`; `root` names the screen (its table or plate) in the index.
    pub fn new(
        layout: Arc<dyn FieldLayout>,
        cells: Vec<Cell>,
        opts: CropOptions,
        root: &Path,
    ) -> Result<Self, ScreenError> {
        if opts.box_size == 0 {
            return Err(ScreenError::table(
                root,
                "the crop box size must be at least 1",
            ));
        }
        let mut kept = Vec::with_capacity(cells.len());
        let mut skipped = Skipped::default();
        let mut shapes: Vec<Option<(usize, usize)>> = vec![None; layout.sites().len()];
        let whole = layout.cells_are_sites();
        for cell in cells {
            let region = box_around(cell.x, cell.y, opts.box_size);
            if opts.border == Border::Skip && !whole {
                let shape = match shapes[cell.site] {
                    Some(s) => s,
                    None => *shapes[cell.site].insert(layout.site_shape(cell.site)?),
                };
                centre_in_site(&*layout, &cell, shape)?;
                if !inside(region, shape.0, shape.1) {
                    skipped.at_border += 1;
                    continue;
                }
            }
            kept.push(cell);
        }
        let mut by_site: Vec<Vec<usize>> = Vec::new();
        for (i, cell) in kept.iter().enumerate() {
            match by_site.last_mut() {
                Some(run) if kept[run[0]].site == cell.site => run.push(i),
                _ => by_site.push(vec![i]),
            }
        }
        check_columns(
            &*layout,
            &by_site,
            &kept,
            opts.label_column.as_deref(),
            opts.split_by.as_deref(),
        )?;
        Ok(Self {
            layout,
            cells: kept,
            root: root.to_path_buf(),
            index: OnceLock::new(),
            opts,
            skipped,
            cache: Mutex::new(VecDeque::new()),
            by_site,
            sites_decoded: AtomicU64::new(0),
        })
    }

    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// The table or plate the cells are cut from, as the config names it.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Cell `i`'s path below [`Self::root`]: `{plate}/{well}/{site}/{object}` (the site's
    /// name for layouts whose sites are cells).
    pub fn cell_path(&self, i: usize) -> String {
        let cell = &self.cells[i];
        let site = &self.layout.sites()[cell.site].name;
        if self.layout.cells_are_sites() {
            site.clone()
        } else {
            format!("{site}/{}", cell.object)
        }
    }

    /// Orders cells `a` and `b` as their [`Self::cell_path`]s sort as text, without
    /// building either.
    pub fn cmp_paths(&self, a: usize, b: usize) -> std::cmp::Ordering {
        let sites = self.layout.sites();
        let whole = self.layout.cells_are_sites();
        let (ca, cb) = (&self.cells[a], &self.cells[b]);
        let (da, db) = (Digits::of(ca.object), Digits::of(cb.object));
        let sep: &[u8] = if whole { &[] } else { b"/" };
        let (ta, tb): (&[u8], &[u8]) = if whole {
            (&[], &[])
        } else {
            (da.as_bytes(), db.as_bytes())
        };
        let pa = sites[ca.site]
            .name
            .bytes()
            .chain(sep.iter().copied())
            .chain(ta.iter().copied());
        let pb = sites[cb.site]
            .name
            .bytes()
            .chain(sep.iter().copied())
            .chain(tb.iter().copied());
        pa.cmp(pb)
    }

    pub fn skipped(&self) -> &Skipped {
        &self.skipped
    }

    pub fn layout(&self) -> &dyn FieldLayout {
        &*self.layout
    }

    /// Whole sites decoded since the last report (each cache miss is one).
    pub fn sites_decoded(&self) -> u64 {
        self.sites_decoded.load(Ordering::Relaxed)
    }

    /// Cell `i`'s metadata: its site's `Metadata_*` columns, then its object number and
    /// centre (none for layouts whose sites are cells).
    pub fn metadata(&self, i: usize) -> Vec<(String, String)> {
        let cell = &self.cells[i];
        let mut m = self.layout.sites()[cell.site].metadata.clone();
        if self.layout.cells_are_sites() {
            return m;
        }
        m.push((OBJECT_NUMBER.into(), cell.object.to_string()));
        m.push((CENTER_X.into(), cell.x.to_string()));
        m.push((CENTER_Y.into(), cell.y.to_string()));
        m
    }

    /// Cell `i`, cut from its site.
    pub fn read_cell(&self, i: usize) -> Result<ImageChw, ScreenError> {
        let cell = self.cells[i];
        if self.layout.cells_are_sites() {
            // Each site is read once per pass anyway: nothing to keep for the next cell.
            return self.layout.read_site(cell.site);
        }
        if self.opts.border == Border::Pad {
            // `skip` checked every centre when the screen opened.
            centre_in_site(&*self.layout, &cell, self.layout.site_shape(cell.site)?)?;
        }
        let region = box_around(cell.x, cell.y, self.opts.box_size);
        if !self.cuts_from_whole_sites() {
            return self.layout.read_region(cell.site, region);
        }
        let site = self.site(cell.site)?;
        let mut crop = super::crop::cut(&site.pixels, region);
        if let Some(labels) = &site.labels {
            let labels_crop = super::crop::cut(labels, region);
            let id = object_label(&cell, labels);
            super::labels::mask(&mut crop, &labels_crop, id);
        }
        Ok(crop)
    }

    /// True when cells are cut from whole decoded sites (kept in the cache), false when each
    /// cell is a site of its own or is read as a region of a chunked layout.
    fn cuts_from_whole_sites(&self) -> bool {
        !self.layout.cells_are_sites() && (!self.layout.reads_regions() || self.opts.mask_objects)
    }

    /// Site `site` decoded, from the cache or read once however many threads ask.
    fn site(&self, site: usize) -> Result<Arc<SiteData>, ScreenError> {
        let slot = {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            match cache.iter().position(|(s, _)| *s == site) {
                Some(at) => {
                    let entry = cache.remove(at).expect("position is in range");
                    let slot = entry.1.clone();
                    cache.push_back(entry);
                    slot
                }
                None => {
                    let slot: Slot = Default::default();
                    cache.push_back((site, slot.clone()));
                    while cache.len() > self.opts.site_cache.max(1) {
                        cache.pop_front();
                    }
                    slot
                }
            }
        };
        let mut error = None;
        let data = slot.get_or_init(|| match self.read_site(site) {
            Ok(d) => Some(Arc::new(d)),
            Err(e) => {
                error = Some(e);
                None
            }
        });
        match (data, error) {
            (Some(d), _) => Ok(d.clone()),
            (None, Some(e)) => {
                self.forget(site);
                Err(e)
            }
            // Another thread's read failed: read it here, to get the error of our own.
            (None, None) => self.read_site(site).map(Arc::new),
        }
    }

    fn forget(&self, site: usize) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|(s, _)| *s != site);
    }

    fn read_site(&self, site: usize) -> Result<SiteData, ScreenError> {
        self.sites_decoded.fetch_add(1, Ordering::Relaxed);
        let pixels = self.layout.read_site(site)?;
        let labels = if self.opts.mask_objects {
            let name = &self.layout.sites()[site].name;
            let labels = self
                .layout
                .read_labels(site)?
                .ok_or_else(|| ScreenError::Site {
                    site: name.clone(),
                    reason: "mask_objects needs a label image for every site".into(),
                })?;
            if (labels.height, labels.width) != (pixels.height, pixels.width) {
                return Err(ScreenError::Site {
                    site: name.clone(),
                    reason: format!(
                        "the label image is {}×{} but the site is {}×{}",
                        labels.height, labels.width, pixels.height, pixels.width
                    ),
                });
            }
            Some(labels)
        } else {
            None
        };
        Ok(SiteData { pixels, labels })
    }
}

/// The label of `cell`'s object in its site's label image: the label at its centre pixel
/// (for cells listed from that image, the centre of mass of a convex object lies on it), or,
/// when that is background, its object number.
fn object_label(cell: &Cell, labels: &Labels) -> u32 {
    let (x, y) = ((cell.x + 0.5).floor(), (cell.y + 0.5).floor());
    let at = (y >= 0.0 && x >= 0.0 && (y as usize) < labels.height && (x as usize) < labels.width)
        .then(|| labels.data[y as usize * labels.width + x as usize]);
    match at {
        Some(l) if l != 0 => l,
        _ => u32::try_from(cell.object).unwrap_or(u32::MAX),
    }
}

/// Refuses a cell whose centre lies outside its site, `shape` (height, width): a box over the
/// border is a cell at the edge, but a centre outside is a table joined to the wrong sites or
/// written in other units, and no box around it holds the cell.
fn centre_in_site(
    layout: &dyn FieldLayout,
    cell: &Cell,
    (height, width): (usize, usize),
) -> Result<(), ScreenError> {
    let inside = |v: f64, n: usize| v >= 0.0 && v < n as f64;
    if inside(cell.x, width) && inside(cell.y, height) {
        return Ok(());
    }
    Err(ScreenError::Site {
        site: layout.sites()[cell.site].name.clone(),
        reason: format!(
            "object {} has its centre (X {}, Y {}) outside the site ({width}×{height} px): \
             is the object table joined to the right sites, and in pixels?",
            cell.object, cell.x, cell.y
        ),
    })
}

/// A whole number's decimal digits, on the stack.
struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    fn of(mut n: u64) -> Self {
        let mut buf = [0u8; 20];
        let mut start = buf.len();
        loop {
            start -= 1;
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Self { buf, start }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// Refuses a `label_column` or `split_by` that a site with cells lacks (or, for the label,
/// leaves empty), naming the site: checked once per site when the screen opens, so that the
/// index built later cannot fail.
fn check_columns(
    layout: &dyn FieldLayout,
    by_site: &[Vec<usize>],
    cells: &[Cell],
    label_column: Option<&str>,
    split_by: Option<&str>,
) -> Result<(), ScreenError> {
    for run in by_site {
        let site = &layout.sites()[cells[run[0]].site];
        if let Some(col) = label_column {
            match site.get(col) {
                Some(v) if !v.trim().is_empty() => {}
                Some(_) => {
                    return Err(ScreenError::Site {
                        site: site.name.clone(),
                        reason: format!("{col} is empty: every cell needs a class"),
                    })
                }
                None => {
                    return Err(ScreenError::Site {
                        site: site.name.clone(),
                        reason: format!(
                            "no metadata column {col} (it has {})",
                            site.metadata
                                .iter()
                                .map(|(k, _)| k.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    })
                }
            }
        }
        if let Some(col) = split_by {
            if site.get(col).is_none() {
                return Err(ScreenError::Site {
                    site: site.name.clone(),
                    reason: format!("no metadata column {col} to split by (data.screen.split_by)"),
                });
            }
        }
    }
    Ok(())
}

/// The `ImageFolder`-like index of the cells: `{table or plate}/{site}/{object}` as each
/// cell's path (so an error or a feature row names the screen and the cell, and the cell's
/// path relative to the screen is `{plate}/{well}/{site}/{object}`), its `label_column` value
/// as its class.
fn index_of(source: &ScreenSource) -> DatasetIndex {
    let sites = source.layout.sites();
    let value = |c: &Cell, col: &str| sites[c.site].get(col).unwrap_or_default().to_string();
    let label_column = source.opts.label_column.as_deref();
    let mut index = DatasetIndex {
        root: source.root.clone(),
        classes: vec![],
        samples: (0..source.cells.len())
            .map(|i| Sample {
                path: source.root.join(source.cell_path(i)),
                class_index: 0,
                label: label_column
                    .map_or_else(|| "cells".to_string(), |col| value(&source.cells[i], col)),
            })
            .collect(),
        skipped_other_images: vec![],
        groups: None,
    };
    index.classes = index.label_names();
    index.groups = source
        .opts
        .split_by
        .as_deref()
        .map(|col| source.cells.iter().map(|c| value(c, col)).collect());
    for s in &mut index.samples {
        s.class_index = index
            .classes
            .iter()
            .position(|c| *c == s.label)
            .unwrap_or(0);
    }
    index
}

impl ImageSource for ScreenSource {
    fn index(&self) -> &DatasetIndex {
        self.index.get_or_init(|| index_of(self))
    }

    /// A screen's cells are cut from sites, not stored as files: there are no bytes to hand
    /// out (`data pack` writes each cell as a TIFF of its own through [`Self::read_cell`]).
    fn read_bytes(&self, i: usize) -> Result<Vec<u8>, DataError> {
        let img = self.read_cell(i)?;
        crate::data::tiff_reader::encode_tiff_f32(&img)
    }

    fn read_into(
        &self,
        i: usize,
        _bytes: &mut Vec<u8>,
        out: &mut ImageChw,
    ) -> Result<(), DataError> {
        *out = self.read_cell(i)?;
        Ok(())
    }

    fn site_layout(&self) -> Option<&[Vec<usize>]> {
        Some(&self.by_site)
    }

    fn cell_channels(&self, i: usize) -> Option<&[usize]> {
        self.layout.site_channels(self.cells[i].site)
    }

    fn report(&self) -> Option<String> {
        self.cuts_from_whole_sites().then(|| {
            format!(
                "{} site reads for {} sites",
                self.sites_decoded.swap(0, Ordering::Relaxed),
                self.by_site.len()
            )
        })
    }

    fn describe(&self) -> String {
        let border = if self.skipped.at_border > 0 {
            format!(", {} at the border left out", self.skipped.at_border)
        } else {
            String::new()
        };
        let boxes = if self.layout.cells_are_sites() {
            "whole images".to_string()
        } else {
            format!("{0}×{0} px boxes", self.opts.box_size)
        };
        format!(
            "{} cells ({boxes}{border}) in {} classes: {}",
            self.cells.len(),
            self.index().classes.len(),
            self.layout.describe()
        )
    }
}
