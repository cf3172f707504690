//! OME-Zarr HCS plates (`plate.zarr/<row>/<col>/<field>/<level>`, NGFF 0.4 on Zarr v2 and
//! 0.5 on Zarr v3) as a [`FieldLayout`], on disk or in a bucket, read by `zarrs`.
//!
//! Why a plate is read where it is, not converted: a screen stored as OME-Zarr is already
//! chunked, so a cell's box is a few chunks of its field, and a training run reads only those
//! (`read_region`), not whole fields and not a copy in another format.
//!
//! What is read:
//! - sites: every field of every well, wells in the order of the plate's `wells` list, fields
//!   in the order of each well's `images` list; each named `<plate>/<well>/<field>` with
//!   [`PLATE`] (the plate's `name`, else the store's name without `.zarr`), [`WELL`] (the
//!   well path's row and column names joined: `B/3` → `B3`, as the plate spells them, with no
//!   zero padding added) and [`SITE`] (the field's path, e.g. `0`);
//! - pixels: the first dataset of the field's first `multiscales` entry (the full
//!   resolution), axes found by name (`tczyx`, `czyx`, `cyx`, `yx`, ...). Only `t = 0` and
//!   `z = 0` are read for now (time series and stacks are not flattened into cells; a field
//!   with more is logged once); an image without a `c` axis has one channel;
//! - channels: by `omero.channels[].label`, in the order the config names them; any integer
//!   or float data type, read as `f32` (integers above 2^24 lose their low bits);
//! - labels (when a label name is given): the first dataset of `labels/<name>` of the field,
//!   any integer type whose values fit in `u32`, of the image's height and width.
//!
//! Remote plates (`s3://`, `gs://`, `az://`) go through the loader's own object-store client
//! ([`Remote`]: the same environment, credentials, endpoint and retry settings as every other
//! dataset), served to `zarrs`' blocking reads by [`super::zarr_ranges`] (one GET per byte range) through
//! `AsyncToSyncStorageAdapter` on that client's runtime. Reads are blocking: call them from
//! plain threads (loader workers), never from inside an async runtime.
//!
//! The plate and well groups are read by [`OmeZarrPlate::open`]; each field's metadata and
//! array are opened on first use and kept (a 384-well plate of 9 fields would otherwise cost
//! thousands of requests before the first cell), except the first field, opened at once so
//! that a missing channel or an unsupported data type fails at open.
use super::{FieldLayout, Labels, Region, ScreenError, Site, PLATE, SITE, WELL};
use crate::config::{DatasetLocation, ObjectStoreSection, StoreUrl};
use crate::data::chw::{Chw, ImageChw};
use crate::data::object_store::Remote;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use zarrs::array::data_type as dt;
use zarrs::array::{
    Array, ArrayShardedReadableExt, ArrayShardedReadableExtCache, CodecOptions, DataType,
};
use zarrs::group::{Group, GroupCreateError};
use zarrs::storage::storage_adapter::async_to_sync::{
    AsyncToSyncBlockOn, AsyncToSyncStorageAdapter,
};
use zarrs::storage::{ReadableStorage, ReadableStorageTraits};

/// Which NGFF version a group is written in, which decides where its attributes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ngff {
    /// 0.4 (and older) on Zarr v2: the NGFF keys at the top of `.zattrs`.
    V04,
    /// 0.5 on Zarr v3: the NGFF keys under `attributes.ome` of `zarr.json`.
    V05,
}

impl Ngff {
    fn metadata_file(self) -> &'static str {
        match self {
            Ngff::V04 => ".zattrs",
            Ngff::V05 => "zarr.json",
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Ngff::V04 => "0.4 (Zarr v2)",
            Ngff::V05 => "0.5 (Zarr v3)",
        }
    }
}

/// An OME-Zarr plate, its selected channels and (optionally) the label image read with each
/// field.
pub struct OmeZarrPlate {
    store: Store,
    plate_name: String,
    ngff: Ngff,
    channels: Vec<String>,
    labels: Option<String>,
    wells: usize,
    sites: Vec<Site>,
    /// Each site's field group path in the store (`B/3/0`).
    field_paths: Vec<String>,
    fields: Vec<OnceLock<Field>>,
    /// Set once a field with more than one time point or z plane was logged.
    warned_tz: AtomicBool,
}

/// The storage and the name errors give it.
struct Store {
    storage: ReadableStorage,
    /// The location as the user wrote it (path or URL).
    source: String,
}

/// What is known about one field once opened: its full-resolution array and how to cut the
/// selected channels out of it.
struct Field {
    array: Array<dyn ReadableStorageTraits>,
    /// Keeps shard indexes between reads, so a sharded field's index is fetched once.
    shards: ArrayShardedReadableExtCache,
    axes: Axes,
    kind: Kind,
    /// The selected channels' indices on the `c` axis, in the config's order.
    select: Vec<u64>,
    height: u64,
    width: u64,
}

/// Where the named axes are in an array's dimensions.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Axes {
    ndim: usize,
    c: Option<usize>,
    y: usize,
    x: usize,
}

/// The pixel types read (every Zarr integer and float type of 8 to 64 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
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

/// Runs `$body` with `$t` the Rust type of `$kind`.
macro_rules! with_type {
    ($kind:expr, $t:ident => $body:expr) => {
        match $kind {
            Kind::U8 => {
                type $t = u8;
                $body
            }
            Kind::U16 => {
                type $t = u16;
                $body
            }
            Kind::U32 => {
                type $t = u32;
                $body
            }
            Kind::U64 => {
                type $t = u64;
                $body
            }
            Kind::I8 => {
                type $t = i8;
                $body
            }
            Kind::I16 => {
                type $t = i16;
                $body
            }
            Kind::I32 => {
                type $t = i32;
                $body
            }
            Kind::I64 => {
                type $t = i64;
                $body
            }
            Kind::F32 => {
                type $t = f32;
                $body
            }
            Kind::F64 => {
                type $t = f64;
                $body
            }
        }
    };
}

impl Kind {
    fn of(d: &DataType) -> Option<Kind> {
        Some(if d.is::<dt::UInt8DataType>() {
            Kind::U8
        } else if d.is::<dt::UInt16DataType>() {
            Kind::U16
        } else if d.is::<dt::UInt32DataType>() {
            Kind::U32
        } else if d.is::<dt::UInt64DataType>() {
            Kind::U64
        } else if d.is::<dt::Int8DataType>() {
            Kind::I8
        } else if d.is::<dt::Int16DataType>() {
            Kind::I16
        } else if d.is::<dt::Int32DataType>() {
            Kind::I32
        } else if d.is::<dt::Int64DataType>() {
            Kind::I64
        } else if d.is::<dt::Float32DataType>() {
            Kind::F32
        } else if d.is::<dt::Float64DataType>() {
            Kind::F64
        } else {
            return None;
        })
    }

    fn is_integer(self) -> bool {
        !matches!(self, Kind::F32 | Kind::F64)
    }
}

/// `{"path": ...}` entries of `plate.wells`, `well.images` and `multiscales[].datasets`.
#[derive(Debug, Deserialize)]
struct PathRef {
    path: String,
}

#[derive(Debug, Deserialize)]
struct PlateAttrs {
    wells: Vec<PathRef>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WellAttrs {
    images: Vec<PathRef>,
}

#[derive(Debug, Deserialize)]
struct Multiscale {
    #[serde(default)]
    axes: Option<Vec<AxisSpec>>,
    datasets: Vec<PathRef>,
}

/// An axis: an object with a `name` (0.4, 0.5) or a bare name (0.3).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum AxisSpec {
    Named { name: String },
    Bare(String),
}

impl AxisSpec {
    fn name(&self) -> &str {
        match self {
            AxisSpec::Named { name } | AxisSpec::Bare(name) => name,
        }
    }
}

#[derive(Debug, Deserialize)]
struct Omero {
    channels: Vec<OmeroChannel>,
}

#[derive(Debug, Deserialize)]
struct OmeroChannel {
    #[serde(default)]
    label: Option<String>,
}

/// Runs `block_on` on the object-store client's own runtime, for the sync adapter.
struct OnRemote(Arc<Remote>);

impl AsyncToSyncBlockOn for OnRemote {
    fn block_on<F: core::future::Future>(&self, future: F) -> F::Output {
        self.0.block_on(future)
    }
}

/// The NGFF attributes of a group and the version they are written in.
struct Attrs {
    ngff: Ngff,
    /// The NGFF keys (`plate`, `well`, `multiscales`, `omero`, `labels`).
    map: serde_json::Map<String, serde_json::Value>,
    /// The metadata file, for errors (`B/3/.zattrs`, `B/3/zarr.json`).
    key: String,
}

impl Attrs {
    /// The attribute `name` parsed as `T`; an absent or malformed one is an error naming the
    /// file and the attribute.
    fn get<T: DeserializeOwned>(&self, store: &Store, name: &str) -> Result<T, ScreenError> {
        let value = self.map.get(name).ok_or_else(|| {
            store.error(
                &self.key,
                format!("no {name:?} attribute (NGFF {})", self.ngff.as_str()),
            )
        })?;
        T::deserialize(value)
            .map_err(|e| store.error(&self.key, format!("attribute {name:?}: {e}")))
    }
}

impl Store {
    fn error(&self, key: &str, reason: impl Into<String>) -> ScreenError {
        ScreenError::store(&self.source, key, reason)
    }

    fn local(path: &std::path::Path) -> Result<Store, ScreenError> {
        let source = path.display().to_string();
        if !path.is_dir() {
            return Err(ScreenError::store(&source, "/", "no such directory"));
        }
        let fs = zarrs::filesystem::FilesystemStore::new(path)
            .map_err(|e| ScreenError::store(&source, "/", e.to_string()))?;
        Ok(Store {
            storage: Arc::new(fs),
            source,
        })
    }

    /// The plate below `url`'s prefix, through the loader's client (credentials checked here).
    fn remote(url: &StoreUrl, s3: &ObjectStoreSection) -> Result<Store, ScreenError> {
        let remote = Arc::new(Remote::open(url, s3)?);
        let rooted = ::object_store::prefix::PrefixStore::new(
            remote.store().clone(),
            url.prefix().to_string(),
        );
        let aos = Arc::new(super::zarr_ranges::RangedObjectStore(rooted));
        let storage = AsyncToSyncStorageAdapter::new(aos, OnRemote(remote));
        Ok(Store {
            storage: Arc::new(storage),
            source: url.root(),
        })
    }

    /// The group at `path` (relative to the plate, `""` for the plate itself) and its NGFF
    /// attributes; `what` says what the group is, for a missing one.
    fn attrs(&self, path: &str, what: &str) -> Result<Attrs, ScreenError> {
        let node = format!("/{path}");
        let group = Group::open(self.storage.clone(), &node).map_err(|e| match e {
            GroupCreateError::MissingMetadata => self.error(
                &node,
                format!("{what} is missing (no zarr.json or .zgroup/.zattrs here)"),
            ),
            e => self.error(&node, e.to_string()),
        })?;
        let attrs = group.attributes();
        let (ngff, map) = match attrs.get("ome") {
            Some(serde_json::Value::Object(ome)) => (Ngff::V05, ome.clone()),
            Some(_) => return Err(self.error(&join(path, "zarr.json"), "\"ome\" is not an object")),
            None => (Ngff::V04, attrs.clone()),
        };
        Ok(Attrs {
            ngff,
            key: join(path, ngff.metadata_file()),
            map,
        })
    }
}

/// `a/b`, or `b` when `a` is empty.
fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_string()
    } else {
        format!("{a}/{b}")
    }
}

/// The name of the store without `.zarr`: `/data/P1.zarr` → `P1`, `s3://b/x/P1.zarr` → `P1`.
fn store_stem(location: &DatasetLocation) -> String {
    let last = match location {
        DatasetLocation::Local(p) => p
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.display().to_string()),
        DatasetLocation::Remote(u) => u
            .prefix()
            .rsplit('/')
            .next()
            .filter(|s| !s.is_empty())
            .unwrap_or(u.bucket())
            .to_string(),
    };
    last.strip_suffix(".zarr").unwrap_or(&last).to_string()
}

/// The well's name from its path, its row and column names joined (`B/3` → `B3`).
fn well_name(path: &str) -> Option<String> {
    let mut parts = path.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(r), Some(c), None) if !r.is_empty() && !c.is_empty() => Some(format!("{r}{c}")),
        _ => None,
    }
}

impl OmeZarrPlate {
    /// Opens the plate at `location` (a local `plate.zarr` directory, or an `s3://`, `gs://`
    /// or `az://` URL of one, reached with `s3`'s settings), selecting `channels` by their
    /// `omero` labels and, if `labels` names one, the label image `labels/<name>` of each
    /// field. Reads the plate and every well group, and the first field.
    pub fn open(
        location: &DatasetLocation,
        s3: &ObjectStoreSection,
        channels: &[String],
        labels: Option<&str>,
    ) -> Result<OmeZarrPlate, ScreenError> {
        let store = match location {
            DatasetLocation::Local(p) => Store::local(p)?,
            DatasetLocation::Remote(u) => Store::remote(u, s3)?,
        };
        let plate_attrs = store.attrs("", "the plate group")?;
        let plate: PlateAttrs = plate_attrs.get(&store, "plate")?;
        let plate_name = plate
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| store_stem(location));
        let wells = read_wells(&store, &plate, &plate_attrs.key)?;
        let mut sites = Vec::new();
        let mut field_paths = Vec::new();
        for (well_path, well, images) in &wells {
            for image in images {
                sites.push(Site {
                    name: format!("{plate_name}/{well}/{}", image.path),
                    metadata: vec![
                        (PLATE.to_string(), plate_name.clone()),
                        (WELL.to_string(), well.clone()),
                        (SITE.to_string(), image.path.clone()),
                    ],
                });
                field_paths.push(format!("{well_path}/{}", image.path));
            }
        }
        if sites.is_empty() {
            return Err(store.error(&plate_attrs.key, "the plate has no fields"));
        }
        let this = OmeZarrPlate {
            fields: sites.iter().map(|_| OnceLock::new()).collect(),
            store,
            plate_name,
            ngff: plate_attrs.ngff,
            channels: channels.to_vec(),
            labels: labels.map(str::to_string),
            wells: wells.len(),
            sites,
            field_paths,
            warned_tz: AtomicBool::new(false),
        };
        this.field(0)?;
        tracing::info!("{}", this.describe());
        Ok(this)
    }

    /// The plate's name ([`PLATE`] of every site).
    pub fn plate_name(&self) -> &str {
        &self.plate_name
    }

    /// The NGFF version of the plate group.
    pub fn ngff(&self) -> Ngff {
        self.ngff
    }

    /// The field of `site`, opened on first use.
    fn field(&self, site: usize) -> Result<&Field, ScreenError> {
        let cell = self.fields.get(site).ok_or_else(|| ScreenError::Site {
            site: site.to_string(),
            reason: format!("no such site (the plate has {})", self.sites.len()),
        })?;
        if let Some(f) = cell.get() {
            return Ok(f);
        }
        let opened = self.open_field(&self.field_paths[site])?;
        Ok(cell.get_or_init(|| opened))
    }

    fn open_field(&self, path: &str) -> Result<Field, ScreenError> {
        let store = &self.store;
        let attrs = store.attrs(path, "the field group")?;
        let (array, axes, array_key) = open_level0(store, &attrs, path)?;
        let kind = Kind::of(array.data_type()).ok_or_else(|| {
            store.error(
                &array_key,
                format!(
                    "data type {} is not an integer or float type (the pixels are read as f32)",
                    array.data_type()
                ),
            )
        })?;
        let shape = array.shape().to_vec();
        let n_channels = axes.c.map_or(1, |c| shape[c]);
        let labels = channel_labels(store, &attrs)?;
        if labels.len() as u64 != n_channels {
            return Err(store.error(
                &attrs.key,
                format!(
                    "omero.channels lists {} channels but {array_key} has {n_channels}",
                    labels.len()
                ),
            ));
        }
        let select = self
            .channels
            .iter()
            .map(|want| {
                labels
                    .iter()
                    .position(|l| l == want)
                    .map(|i| i as u64)
                    .ok_or_else(|| ScreenError::MissingChannel {
                        source_name: format!(
                            "{} plate {} field {path}",
                            store.source, self.plate_name
                        ),
                        channel: want.clone(),
                        available: labels.clone(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.warn_tz(&axes, &shape, &array_key);
        Ok(Field {
            shards: ArrayShardedReadableExtCache::new(&array),
            height: shape[axes.y],
            width: shape[axes.x],
            array,
            axes,
            kind,
            select,
        })
    }

    /// Logs once per plate that only `t = 0`, `z = 0` are read of a field that has more.
    fn warn_tz(&self, axes: &Axes, shape: &[u64], key: &str) {
        let more =
            (0..axes.ndim).any(|i| Some(i) != axes.c && i != axes.y && i != axes.x && shape[i] > 1);
        if more && !self.warned_tz.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "{}: {key} has shape {shape:?}: only the first time point and z plane are read",
                self.store.source
            );
        }
    }

    /// Reads `region` of `field`'s selected channels, zero outside the field: only the
    /// chunks the clamped region touches are fetched and decoded.
    fn read(&self, site: usize, region: Region) -> Result<ImageChw, ScreenError> {
        let f = self.field(site)?;
        let (h, w) = (region.height, region.width);
        let nc = f.select.len();
        let mut out = vec![0f32; nc * h * w];
        let ys = clamp(region.y0, h, f.height);
        let xs = clamp(region.x0, w, f.width);
        if let (Some(ys), Some(xs)) = (ys, xs) {
            let (c_lo, c_hi) = match (f.select.iter().min(), f.select.iter().max()) {
                (Some(&lo), Some(&hi)) => (lo, hi + 1),
                _ => (0, 1),
            };
            let subset = subset_of(&f.axes, c_lo..c_hi, ys.clone(), xs.clone());
            let values = read_f32(f, &subset)
                .map_err(|e| self.store.error(&self.field_paths[site], e.to_string()))?;
            let strides = strides(&subset);
            let (ny, nx) = ((ys.end - ys.start) as usize, (xs.end - xs.start) as usize);
            let (oy, ox) = (
                (ys.start as i64 - region.y0) as usize,
                (xs.start as i64 - region.x0) as usize,
            );
            for (k, &c) in f.select.iter().enumerate() {
                let base = f.axes.c.map_or(0, |ci| (c - c_lo) as usize * strides[ci]);
                for dy in 0..ny {
                    let src = base + dy * strides[f.axes.y];
                    let dst = (k * h + oy + dy) * w + ox;
                    for dx in 0..nx {
                        out[dst + dx] = values[src + dx * strides[f.axes.x]];
                    }
                }
            }
        }
        Ok(Chw::new(nc, h, w, out)?)
    }

    /// The label image of `site`'s field, checked against the field's size.
    // `with_type!` casts every pixel type, f64 to f64 among them.
    #[allow(clippy::unnecessary_cast)]
    fn labels_of(&self, site: usize, name: &str) -> Result<Labels, ScreenError> {
        let f = self.field(site)?;
        let store = &self.store;
        let path = format!("{}/labels/{name}", self.field_paths[site]);
        let attrs = store.attrs(&path, "the label image")?;
        let (array, axes, key) = open_level0(store, &attrs, &path)?;
        let shape = array.shape().to_vec();
        let (h, w) = (shape[axes.y], shape[axes.x]);
        if (h, w) != (f.height, f.width) {
            return Err(store.error(
                &key,
                format!(
                    "the label image is {h}×{w} but the image of site {} is {}×{}",
                    self.sites[site].name, f.height, f.width
                ),
            ));
        }
        let kind = Kind::of(array.data_type())
            .filter(|k| k.is_integer())
            .ok_or_else(|| {
                store.error(
                    &key,
                    format!(
                        "data type {} is not an integer type (labels are object numbers)",
                        array.data_type()
                    ),
                )
            })?;
        // Every other axis (c of a `cyx` label image, t, z) at 0.
        let axes = Axes { c: None, ..axes };
        let subset = subset_of(&axes, 0..1, 0..h, 0..w);
        let values: Vec<f64> = with_type!(kind, T => {
            let v: Vec<T> = array
                .retrieve_array_subset(&subset)
                .map_err(|e| store.error(&key, e.to_string()))?;
            v.into_iter().map(|x| x as f64).collect()
        });
        let data = values
            .into_iter()
            .map(|v| {
                (0.0..=u32::MAX as f64)
                    .contains(&v)
                    .then_some(v as u32)
                    .ok_or_else(|| {
                        store.error(&key, format!("label value {v} is not an object number"))
                    })
            })
            .collect::<Result<Vec<u32>, _>>()?;
        Ok(Chw::new(1, h as usize, w as usize, data)?)
    }
}

/// Reads the plate's well groups (in parallel: remote plates have hundreds) and returns, per
/// well in plate order, its path, its name and its fields.
#[allow(clippy::type_complexity)]
fn read_wells(
    store: &Store,
    plate: &PlateAttrs,
    plate_key: &str,
) -> Result<Vec<(String, String, Vec<PathRef>)>, ScreenError> {
    let names = plate
        .wells
        .iter()
        .enumerate()
        .map(|(i, w)| {
            well_name(&w.path).ok_or_else(|| {
                store.error(
                    plate_key,
                    format!("plate.wells[{i}].path {:?} is not <row>/<column>", w.path),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let per = plate.wells.len().div_ceil(8).max(1);
    let images: Vec<Result<Vec<PathRef>, ScreenError>> = std::thread::scope(|s| {
        let handles: Vec<_> = plate
            .wells
            .chunks(per)
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|w| {
                            let attrs =
                                store.attrs(&w.path, "a well listed in the plate's wells")?;
                            let well: WellAttrs = attrs.get(store, "well")?;
                            Ok(well.images)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|_| vec![Err(store.error(plate_key, "a well reader panicked"))])
            })
            .collect()
    });
    plate
        .wells
        .iter()
        .zip(names)
        .zip(images)
        .map(|((w, name), images)| Ok((w.path.clone(), name, images?)))
        .collect()
}

/// The first dataset (full resolution) of the group's first `multiscales` entry, with its
/// axes found by name, and its path for errors.
fn open_level0(
    store: &Store,
    attrs: &Attrs,
    group: &str,
) -> Result<(Array<dyn ReadableStorageTraits>, Axes, String), ScreenError> {
    let multiscales: Vec<Multiscale> = attrs.get(store, "multiscales")?;
    let ms = multiscales
        .first()
        .ok_or_else(|| store.error(&attrs.key, "\"multiscales\" is empty"))?;
    let level = ms
        .datasets
        .first()
        .ok_or_else(|| store.error(&attrs.key, "multiscales[0].datasets is empty"))?;
    let key = join(group, &level.path);
    let array = Array::open(store.storage.clone(), &format!("/{key}"))
        .map_err(|e| store.error(&key, format!("cannot open the full-resolution array: {e}")))?;
    let ndim = array.dimensionality();
    let names: Vec<String> = match &ms.axes {
        Some(axes) => axes.iter().map(|a| a.name().to_ascii_lowercase()).collect(),
        // NGFF 0.1/0.2 had no axes: always 5D tczyx.
        None if ndim == 5 => ["t", "c", "z", "y", "x"].map(String::from).to_vec(),
        None => {
            return Err(store.error(
                &attrs.key,
                format!("multiscales[0] has no axes and {key} is {ndim}-dimensional"),
            ))
        }
    };
    let axes = axes_of(&names, ndim)
        .map_err(|reason| store.error(&attrs.key, format!("multiscales[0].axes: {reason}")))?;
    Ok((array, axes, key))
}

/// Finds `c`, `y` and `x` among the axis names of an array of `ndim` dimensions.
fn axes_of(names: &[String], ndim: usize) -> Result<Axes, String> {
    if names.len() != ndim {
        return Err(format!(
            "{} axes ({}) for an array of {ndim} dimensions",
            names.len(),
            names.join(",")
        ));
    }
    let find = |n: &str| names.iter().position(|a| a == n);
    let (Some(y), Some(x)) = (find("y"), find("x")) else {
        return Err(format!("no y and x axes among {}", names.join(",")));
    };
    Ok(Axes {
        ndim,
        c: find("c"),
        y,
        x,
    })
}

/// The `omero.channels` labels of an image group.
fn channel_labels(store: &Store, attrs: &Attrs) -> Result<Vec<String>, ScreenError> {
    let omero: Omero = attrs.get(store, "omero").map_err(|e| {
        store.error(
            &attrs.key,
            format!("{e}: channels are chosen by their omero.channels labels"),
        )
    })?;
    omero
        .channels
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            c.label
                .ok_or_else(|| store.error(&attrs.key, format!("omero.channels[{i}] has no label")))
        })
        .collect()
}

/// The rows (columns) of `0..size` that a span of `len` from `start` covers.
fn clamp(start: i64, len: usize, size: u64) -> Option<Range<u64>> {
    let lo = start.max(0);
    let hi = start.saturating_add(len as i64).min(size as i64);
    (hi > lo).then_some(lo as u64..hi as u64)
}

/// The array subset: `c` on the channel axis, `y` and `x` on theirs, 0 on every other.
fn subset_of(axes: &Axes, c: Range<u64>, y: Range<u64>, x: Range<u64>) -> Vec<Range<u64>> {
    (0..axes.ndim)
        .map(|i| {
            if Some(i) == axes.c {
                c.clone()
            } else if i == axes.y {
                y.clone()
            } else if i == axes.x {
                x.clone()
            } else {
                0..1
            }
        })
        .collect()
}

/// C-order strides of a subset's values.
fn strides(subset: &[Range<u64>]) -> Vec<usize> {
    let mut s = vec![1usize; subset.len()];
    for i in (0..subset.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * (subset[i + 1].end - subset[i + 1].start) as usize;
    }
    s
}

/// The subset's values as `f32`, whatever the field's type.
// `with_type!` casts every pixel type, f32 to f32 among them.
#[allow(clippy::unnecessary_cast)]
fn read_f32(f: &Field, subset: &[Range<u64>]) -> Result<Vec<f32>, zarrs::array::ArrayError> {
    let options = CodecOptions::default();
    with_type!(f.kind, T => {
        let v: Vec<T> = f
            .array
            .retrieve_array_subset_sharded_opt(&f.shards, &subset.to_vec(), &options)?;
        Ok(v.into_iter().map(|x| x as f32).collect())
    })
}

impl FieldLayout for OmeZarrPlate {
    fn sites(&self) -> &[Site] {
        &self.sites
    }

    fn channels(&self) -> &[String] {
        &self.channels
    }

    fn read_site(&self, site: usize) -> Result<ImageChw, ScreenError> {
        let f = self.field(site)?;
        let region = Region {
            y0: 0,
            x0: 0,
            height: f.height as usize,
            width: f.width as usize,
        };
        self.read(site, region)
    }

    fn read_region(&self, site: usize, region: Region) -> Result<ImageChw, ScreenError> {
        self.read(site, region)
    }

    /// From the array's metadata: no pixel is read.
    fn site_shape(&self, site: usize) -> Result<(usize, usize), ScreenError> {
        let f = self.field(site)?;
        Ok((f.height as usize, f.width as usize))
    }

    /// Chunked: a cell's box is read from the chunks it touches.
    fn reads_regions(&self) -> bool {
        true
    }

    fn read_labels(&self, site: usize) -> Result<Option<Labels>, ScreenError> {
        match &self.labels {
            Some(name) => self.labels_of(site, name).map(Some),
            None => Ok(None),
        }
    }

    fn describe(&self) -> String {
        format!(
            "OME-Zarr plate {} (NGFF {}) at {}: {} wells, {} fields, channels [{}], labels {}",
            self.plate_name,
            self.ngff.as_str(),
            self.store.source,
            self.wells,
            self.sites.len(),
            self.channels.join(", "),
            self.labels.as_deref().unwrap_or("none (from elsewhere)")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &str) -> Vec<String> {
        s.chars().map(|c| c.to_string()).collect()
    }

    #[test]
    fn axes_are_found_by_name() {
        let a = axes_of(&names("tczyx"), 5).unwrap();
        assert_eq!((a.c, a.y, a.x), (Some(1), 3, 4));
        let a = axes_of(&names("yx"), 2).unwrap();
        assert_eq!((a.c, a.y, a.x), (None, 0, 1));
        assert!(axes_of(&names("czyx"), 5).is_err(), "4 names for 5 dims");
        assert!(axes_of(&names("tcz"), 3).is_err(), "no y, x");
    }

    #[test]
    fn wells_are_named_by_row_and_column() {
        assert_eq!(well_name("B/3").as_deref(), Some("B3"));
        assert_eq!(well_name("A/01").as_deref(), Some("A01"));
        assert_eq!(well_name("A"), None);
        assert_eq!(well_name("A/1/2"), None);
        assert_eq!(well_name("/1"), None);
    }

    #[test]
    fn regions_are_clamped_to_the_field() {
        assert_eq!(clamp(-5, 16, 40), Some(0..11));
        assert_eq!(clamp(30, 16, 40), Some(30..40));
        assert_eq!(clamp(100, 4, 40), None);
        assert_eq!(clamp(-20, 8, 40), None);
        assert_eq!(clamp(i64::MAX - 1, 8, 40), None);
    }

    #[test]
    fn the_store_name_drops_zarr() {
        let l: DatasetLocation = "/data/P1.zarr".parse().unwrap();
        assert_eq!(store_stem(&l), "P1");
        let r: DatasetLocation = "s3://bkt/screens/P2.zarr".parse().unwrap();
        assert_eq!(store_stem(&r), "P2");
        let b: DatasetLocation = "s3://bkt".parse().unwrap();
        assert_eq!(store_stem(&b), "bkt");
    }
}
