//! The synthetic screen of [`super::synth`] as OME-Zarr HCS plates (`trainer synth --layout
//! ome-zarr`), so that the plate reader can be tested and benchmarked on cells whose pixels
//! are known: every cell cut from a plate can be compared with the per-cell TIFF it came from.
//!
//! Written with `zarrs` (NGFF 0.5 on Zarr v3, the version `zarrs` writes natively), one plate
//! per `--plates`, beside the per-cell set under `cells/`:
//!
//! * `P<n>.zarr`: rows and columns named as CellProfiler names wells (`A`, `01`: well `A01`),
//!   one well per class (row = plate, column = class), its sites as fields `0`, `1`, ...;
//!   each field a `c, y, x` uint16 array (`chunk`-pixel square chunks, zstd) with its
//!   channels named in `omero`, and a label image `labels/nuclei` (`y, x` uint16, each cell's
//!   whole box holding its object number, so its centre of mass is the box centre);
//! * `P<n>_Nuclei.csv`: the plate's object table (`ObjectNumber`, `Metadata_Plate/Well/Site`,
//!   `Nuclei_Location_Center_X/Y`), one per plate because a table must name sites of the
//!   plate it is joined to;
//! * `cells.csv`: which per-cell TIFF each object is, for tests.
//!
//! A `P<n>.zarr` already under `out` is replaced (a plate written over an older one would
//! keep the older one's extra wells and fields).
use super::synth::{
    paste_sites, row_name, write_text, PastedSite, ScreenSynthOptions, CELLS_CSV_HEADER,
};
use super::ScreenError;
use crate::data::DataError;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zarrs::array::codec::bytes_to_bytes::zstd::ZstdCodec;
use zarrs::array::{data_type, ArrayBuilder};
use zarrs::filesystem::FilesystemStore;
use zarrs::group::GroupBuilder;

/// The label image every field carries (`data.screen.labels: nuclei`).
pub const LABELS: &str = "nuclei";

/// What [`generate_ome_zarr`] wrote.
#[derive(Debug, Clone)]
pub struct OmeZarrSynthSummary {
    /// `OUT/P1.zarr`, `OUT/P2.zarr`, ...
    pub plates: Vec<PathBuf>,
    /// The object table of each plate, in the same order.
    pub objects: Vec<PathBuf>,
    pub cells_csv: PathBuf,
    pub channel_names: Vec<String>,
    pub sites: usize,
    pub cells: usize,
    /// Side of each cell's box: the `box_size` that cuts the cells back out.
    pub cell_size: usize,
}

/// Writes the per-cell set under `out/cells` and the screen made of its training images as
/// one OME-Zarr plate per plate under `out` (see the module doc), fields chunked in
/// `chunk`-pixel squares.
pub fn generate_ome_zarr(
    opts: &ScreenSynthOptions,
    chunk: usize,
) -> Result<OmeZarrSynthSummary, DataError> {
    if chunk == 0 {
        return Err(DataError::InvalidArgument(
            "the chunk side of a synthetic plate must be at least one pixel".into(),
        ));
    }
    let out = opts.cells.out.clone();
    std::fs::create_dir_all(&out).map_err(|e| DataError::io(&out, "creating", e))?;
    let mut plates: BTreeMap<String, PlateWriter> = BTreeMap::new();
    let mut cells_csv = String::from(CELLS_CSV_HEADER);
    let mut sites = 0usize;
    let pasted = paste_sites(opts, |site| {
        let plate = match plates.get_mut(site.plate) {
            Some(p) => p,
            None => {
                let p = PlateWriter::create(&out.join(format!("{}.zarr", site.plate)), chunk)?;
                plates.entry(site.plate.to_string()).or_insert(p)
            }
        };
        plate.write_field(site)?;
        for cell in &site.cells {
            writeln!(
                cells_csv,
                "{},{},{},{},{}",
                site.plate,
                site.well(),
                site.index,
                cell.object,
                cell.path.display()
            )
            .ok();
        }
        sites += 1;
        Ok(())
    })?;
    let mut summary = OmeZarrSynthSummary {
        plates: Vec::new(),
        objects: Vec::new(),
        cells_csv: write_text(&out.join("cells.csv"), &cells_csv)?,
        channel_names: pasted.channel_names,
        sites,
        cells: pasted.cells,
        cell_size: pasted.cell_size,
    };
    for (name, plate) in plates {
        summary.objects.push(write_text(
            &out.join(format!("{name}_Nuclei.csv")),
            &plate.objects,
        )?);
        summary.plates.push(plate.finish(&name)?);
    }
    Ok(summary)
}

/// One plate being written: its store, the fields of each well so far and its object table.
struct PlateWriter {
    path: PathBuf,
    store: Arc<FilesystemStore>,
    chunk: usize,
    /// (row, column) → field paths, in the order written.
    wells: BTreeMap<(usize, usize), Vec<String>>,
    objects: String,
}

/// NGFF 0.5 puts every NGFF key under `ome`, with the version beside them.
fn ome(keys: Value) -> serde_json::Map<String, Value> {
    let mut ome = json!({ "version": "0.5" });
    if let (Some(o), Value::Object(k)) = (ome.as_object_mut(), keys) {
        o.extend(k);
    }
    let mut attrs = serde_json::Map::new();
    attrs.insert("ome".into(), ome);
    attrs
}

impl PlateWriter {
    fn create(path: &Path, chunk: usize) -> Result<Self, DataError> {
        if path.exists() {
            std::fs::remove_dir_all(path).map_err(|e| DataError::io(path, "replacing", e))?;
        }
        std::fs::create_dir_all(path).map_err(|e| DataError::io(path, "creating", e))?;
        let store = FilesystemStore::new(path).map_err(|e| error(path, "/", e))?;
        Ok(Self {
            path: path.to_path_buf(),
            store: Arc::new(store),
            chunk,
            wells: BTreeMap::new(),
            objects: String::from(
                "ObjectNumber,Metadata_Plate,Metadata_Well,Metadata_Site,Nuclei_Location_Center_X,Nuclei_Location_Center_Y\n",
            ),
        })
    }

    /// A group at `key` with NGFF attributes `keys` (none when `Value::Null`).
    fn group(&self, key: &str, keys: Value) -> Result<(), DataError> {
        let mut b = GroupBuilder::new();
        if !keys.is_null() {
            b.attributes(ome(keys));
        }
        let g = b
            .build(self.store.clone(), key)
            .map_err(|e| error(&self.path, key, e))?;
        g.store_metadata().map_err(|e| error(&self.path, key, e))
    }

    /// A uint16 array at `key` of `shape` (`dims` named), chunked `chunk` in y and x, holding
    /// `data` (C order).
    fn array(
        &self,
        key: &str,
        shape: &[u64],
        dims: &[&str],
        data: &[u16],
    ) -> Result<(), DataError> {
        let c = self.chunk as u64;
        let chunks: Vec<u64> = shape
            .iter()
            .zip(dims)
            .map(|(&n, d)| if *d == "c" { 1 } else { c.min(n).max(1) })
            .collect();
        let array = ArrayBuilder::new(shape.to_vec(), chunks, data_type::uint16(), 0u16)
            .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, false))])
            .dimension_names(Some(dims.iter().copied()))
            .build(self.store.clone(), key)
            .map_err(|e| error(&self.path, key, e))?;
        array
            .store_metadata()
            .map_err(|e| error(&self.path, key, e))?;
        array
            .store_array_subset(&array.subset_all(), data)
            .map_err(|e| error(&self.path, key, e))
    }

    /// Writes `site` as the next field of its well: the image, its label image and its rows
    /// of the object table.
    fn write_field(&mut self, site: &PastedSite<'_>) -> Result<(), DataError> {
        let (row, col) = (row_name(site.row), format!("{:02}", site.col));
        let field = site.index.to_string();
        let key = format!("/{row}/{col}/{field}");
        let side = site.side as u64;
        let scale = |n: usize| json!([{ "type": "scale", "scale": vec![1.0; n] }]);
        let space = |name: &str| json!({ "name": name, "type": "space", "unit": "micrometer" });
        self.group(
            &key,
            json!({
                "multiscales": [{
                    "name": format!("{}/{row}{col}/{field}", site.plate),
                    "axes": [{ "name": "c", "type": "channel" }, space("y"), space("x")],
                    "datasets": [{ "path": "0", "coordinateTransformations": scale(3) }],
                }],
                "omero": {
                    "channels": site.channels.iter().map(|c| json!({
                        "label": c,
                        "color": "FFFFFF",
                        "active": true,
                        "window": { "min": 0, "max": 65535, "start": 0, "end": 65535 },
                    })).collect::<Vec<_>>(),
                    "rdefs": { "model": "greyscale" },
                },
            }),
        )?;
        let pixels: Vec<u16> = site.planes.concat();
        self.array(
            &format!("{key}/0"),
            &[site.planes.len() as u64, side, side],
            &["c", "y", "x"],
            &pixels,
        )?;
        self.group(&format!("{key}/labels"), json!({ "labels": [LABELS] }))?;
        let labels = format!("{key}/labels/{LABELS}");
        self.group(
            &labels,
            json!({
                "image-label": { "source": { "image": "../../" } },
                "multiscales": [{
                    "name": LABELS,
                    "axes": [space("y"), space("x")],
                    "datasets": [{ "path": "0", "coordinateTransformations": scale(2) }],
                }],
            }),
        )?;
        self.array(
            &format!("{labels}/0"),
            &[side, side],
            &["y", "x"],
            &site.labels,
        )?;
        for cell in &site.cells {
            writeln!(
                self.objects,
                "{},{},{},{},{},{}",
                cell.object,
                site.plate,
                site.well(),
                field,
                cell.x,
                cell.y
            )
            .ok();
        }
        self.wells
            .entry((site.row, site.col))
            .or_default()
            .push(field);
        Ok(())
    }

    /// Writes the well, row and plate groups now that every field is known; returns the
    /// plate's path.
    fn finish(self, name: &str) -> Result<PathBuf, DataError> {
        let rows = self.wells.keys().map(|&(r, _)| r).max().unwrap_or(1);
        let cols = self.wells.keys().map(|&(_, c)| c).max().unwrap_or(1);
        for r in 1..=rows {
            if self.wells.keys().any(|&(row, _)| row == r) {
                self.group(&format!("/{}", row_name(r)), Value::Null)?;
            }
        }
        let mut wells = Vec::new();
        for (&(r, c), fields) in &self.wells {
            let path = format!("{}/{c:02}", row_name(r));
            let images: Vec<Value> = fields.iter().map(|f| json!({ "path": f })).collect();
            self.group(&format!("/{path}"), json!({ "well": { "images": images } }))?;
            wells.push(json!({ "path": path, "rowIndex": r - 1, "columnIndex": c - 1 }));
        }
        let field_count = self.wells.values().map(Vec::len).max().unwrap_or(0);
        self.group(
            "/",
            json!({
                "plate": {
                    "version": "0.5",
                    "name": name,
                    "rows": (1..=rows).map(|r| json!({ "name": row_name(r).to_string() })).collect::<Vec<_>>(),
                    "columns": (1..=cols).map(|c| json!({ "name": format!("{c:02}") })).collect::<Vec<_>>(),
                    "wells": wells,
                    "field_count": field_count,
                },
            }),
        )?;
        Ok(self.path)
    }
}

/// A `zarrs` failure writing `key` of the plate at `path`, naming both.
fn error(path: &Path, key: &str, e: impl std::fmt::Display) -> DataError {
    ScreenError::store(path.display().to_string(), key, e.to_string()).into()
}
