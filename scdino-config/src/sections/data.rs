//! `data:`: the dataset, how its images become tensors, screens, object stores and the cache.
use crate::DatasetLocation;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The image folder and how each image becomes a tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataSection {
    /// `meta.dataset_dir`: an ImageFolder-style tree of multi-channel TIFFs (or the shards
    /// packed from one), a local path or `s3://`, `gs://` or `az://` bucket/prefix.
    #[serde(deserialize_with = "crate::location::dataset_dir")]
    pub dataset_dir: DatasetLocation,
    /// `meta.folder_depth_for_labels`: 0 = the folder holding the image, 1 = the one above, ...
    pub label_folder_depth: usize,
    /// `meta.train_datasetsplit_fraction`: DINO trains on this fraction; analyses use the rest.
    pub train_fraction: f64,
    /// New. How the held-out images are drawn: `stratified` (the default) = scDINO's number
    /// of held-out images, shared among the classes in proportion to their sizes (largest
    /// remainders first, at least one per class where the total allows), each class's images
    /// shuffled with `run.seed`, so every class is scored; `scdino` = scDINO's own split (one
    /// seeded shuffle of all images, classes ignored: a small dataset can leave a class out of
    /// the held-out images, and kNN then scores nothing for it), which `trainer config
    /// import-scdino` writes so an imported run holds out the images scDINO held out.
    pub split: HeldOutSplit,
    /// `meta.images_are_RGB`: scDINO's switch for 8-bit RGB images (PNG/JPEG read as 3
    /// channels). Kept so an imported scDINO config says what it asked for; only `false` is
    /// accepted (multi-channel TIFFs), and `true` is refused naming the key.
    pub images_are_rgb: bool,
    /// `meta.channel_dict`: the name of channel i at position i.
    pub channel_names: Vec<String>,
    /// `meta.selected_channel_combination_per_run`: one model per entry; `"01234"` or `[0, 1]`.
    pub channel_combinations: Vec<ChannelCombination>,
    /// `meta.center_crop`: 0 = off, otherwise the side of a centre crop taken before min–max.
    pub center_crop: usize,
    /// `train_scDINO.fraction_for_mean_std_calc`.
    pub mean_std_fraction: f64,
    /// `train_scDINO.num_workers`: loader threads per process.
    pub num_workers: usize,
    /// New (no scDINO field). What `dataset_dir` holds: `folder` (an ImageFolder tree),
    /// `shards` (a directory written by `trainer data pack`), or `auto` (shards if the
    /// directory has a `shard-index.json`, else a tree). Either way the dataset index, labels
    /// and split are the original tree's.
    pub format: DataFormat,
    /// New. Sample order per epoch: `exact` = scDINO's seeded permutation (random access; any
    /// source); `shard_sequential` = shard order shuffled per epoch, each rank streaming a
    /// contiguous run of shards through a shuffle buffer (packed datasets only); `sites` = a
    /// screen's sites shuffled per epoch, its cells shuffled within windows of
    /// `data.screen.site_cache / 2` sites, so each site is decoded once per epoch instead of
    /// once per cell (`data.screen` only). All give every rank `ceil(N/W)` samples and every
    /// training sample once per epoch.
    pub order: SampleOrder,
    /// New. Shuffle-buffer size (samples per rank) for `order: shard_sequential`; 1 keeps the
    /// shard's stored order.
    pub shuffle_buffer: usize,
    /// How `s3://`, `gs://` and `az://` datasets are reached (ignored for local and FSx paths).
    pub object_store: ObjectStoreSection,
    /// Node-local copy of streamed images, so only the first epoch pays for the network.
    pub cache: CacheSection,
    /// What training does with an image that cannot be decoded (truncated or garbage object).
    pub on_corrupt: OnCorrupt,
    /// New. A separate test folder (ImageFolder tree with the same channels, e.g. the PBMC
    /// layout `Test/` whose labels sit at `label_folder_depth` below `DonorNN/Control/`),
    /// local or `s3://`. When set, `trainer evaluate` uses every image of `dataset_dir` as the
    /// kNN bank and probe training set and this folder as queries; when null it uses the
    /// training split and the held-out split.
    #[serde(deserialize_with = "crate::location::test_dir")]
    pub test_dir: Option<DatasetLocation>,
    /// New. A screen as it is stored (fields of view + a segmentation, or CHAMMI's tiled
    /// crops) instead of one TIFF per cell: `dataset_dir` is then the screen's LoadData
    /// table, OME-Zarr plate or CHAMMI metadata table, `channel_names` the channels read from
    /// it (by name, in this order), and every cell is cut from its site around its centre
    /// (CHAMMI: every image is one whole cell). Null = `dataset_dir` holds per-cell images. The
    /// keys below are documented with the defaults they take when the section is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub screen: Option<ScreenSection>,
}

/// `data.screen`: how cells are found in a screen's fields of view and cut from them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScreenSection {
    /// What `data.dataset_dir` is: `load_data` = CellProfiler's LoadData table (CSV, optionally
    /// `.gz`: one row per site, `FileName_<Ch>`/`PathName_<Ch>` or `URL_<Ch>` per channel);
    /// `ome_zarr` = an OME-Zarr HCS plate (NGFF 0.4 or 0.5); `chammi` = CHAMMI's tiled
    /// crops: a metadata CSV (`enriched_meta.csv`) with one row per cell whose `file_path`
    /// names a PNG or TIFF holding the cell's channels side by side, `channel_width` pixels
    /// each; the whole image is the cell (no segmentation, `box_size` unused).
    pub layout: ScreenLayout,
    /// An object table (CellProfiler's `Nuclei.csv`, one row per cell, path or URL) giving each
    /// cell's centre; null = cells are the objects of each site's label image (`labels`).
    pub objects: Option<String>,
    /// The object table's centre columns `[X, Y]`; null = `Nuclei_Location_Center_X/Y`, or
    /// `Location_Center_X/Y` where the table has those.
    pub center_columns: Option<Vec<String>>,
    /// The label images: a LoadData column name (`ObjectsFileName_<name>`, `FileName_<name>`
    /// or `URL_<name>`), or a plate's `labels/<name>`. Needed without `objects` and for
    /// `mask_objects`.
    pub labels: Option<String>,
    /// Side of the square box cut around each centre, in site pixels (then treated as any
    /// image: `center_crop`, min–max, the crop sizes of training).
    pub box_size: usize,
    /// A cell whose box reaches outside its site: `skip` (left out, counted in the log) or
    /// `pad` (kept, zeros outside the site, as DeepProfiler).
    pub border: ScreenBorder,
    /// Zero every pixel that is not the cell's own object in the label image (DeepProfiler's
    /// `mask_objects`).
    pub mask_objects: bool,
    /// Divide each channel by the illumination function the LoadData table names for it
    /// (`FileName_Illum<Ch>`, a `.npy`), as CellProfiler's CorrectIlluminationApply.
    pub illumination: bool,
    /// The metadata column whose value is a cell's class for kNN, probe and evaluate (e.g.
    /// `Metadata_Treatment`); null = one class.
    pub label_column: Option<String>,
    /// A metadata column whose groups are never split: the held-out images are whole groups
    /// (e.g. `Metadata_Well`: no well has cells on both sides); null = split cells.
    pub split_by: Option<String>,
    /// Decoded sites each process keeps for the cells that follow. With `data.order: sites`
    /// training shuffles cells within windows of half as many sites, so a window's cells should
    /// outnumber the cells the loader holds in flight (2 × num_workers × batch size; the log
    /// warns when they do not).
    pub site_cache: usize,
    /// `chammi`: the folder (path or URL) `file_path` is relative to; null = the table's
    /// folder. CHAMMI's per-dataset tables (`CHAMMI/Allen/enriched_meta.csv`) name images from
    /// the CHAMMI folder (`Allen/…`), as MorphEm joins them with its `root_dir`: set this to it.
    pub image_root: Option<String>,
    /// `chammi`: the column naming each row's dataset (morphem70k's combined table has
    /// `chunk`); null = the first folder of `file_path` (CHAMMI's `Allen/…`, `HPA/…`, `CP/…`).
    pub dataset_column: Option<String>,
    /// `chammi`: only the rows of these datasets are read; null = every row.
    pub datasets: Option<Vec<String>>,
    /// `chammi`: only the rows whose column (a CSV column name) holds one of the values are
    /// read, e.g. `{train_test_split: [Train]}` to train on CHAMMI's training rows; empty =
    /// every row.
    pub rows: BTreeMap<String, Vec<String>>,
    /// `chammi`: each dataset's channel names, in the order its tiles are stored; a dataset
    /// not named here takes CHAMMI's own (`Allen`/`WTC`: nucleus, membrane, protein; `HPA`:
    /// microtubules, protein, nucleus, er; `CP`: nucleus, er, rna, golgi, mito).
    /// `data.channel_names` picks channels by these names: every row read must have them all,
    /// unless `cell_channels: own`.
    pub dataset_channels: BTreeMap<String, Vec<String>>,
    /// `chammi`: which channels each cell brings. `shared` = every row read has every channel
    /// of `data.channel_names` (a row lacking one is refused); `own` = each cell keeps those
    /// of `data.channel_names` its dataset has (at least one), so datasets with different
    /// channels train one `bag` or `tokens` model together: `bag` takes each cell's own
    /// channels as its items, `tokens` trains each step on a batch of cells that share their
    /// channels (CHAMMI's way), sampling the step's channels among them; mean/std counts each
    /// channel over the cells that have it. `fixed` takes every channel and refuses `own`.
    pub cell_channels: CellChannels,
}

impl Default for ScreenSection {
    fn default() -> Self {
        Self {
            layout: ScreenLayout::LoadData,
            objects: None,
            center_columns: None,
            labels: None,
            box_size: 96,
            border: ScreenBorder::Skip,
            mask_objects: false,
            illumination: true,
            label_column: None,
            split_by: None,
            site_cache: 8,
            image_root: None,
            dataset_column: None,
            datasets: None,
            rows: BTreeMap::new(),
            dataset_channels: BTreeMap::new(),
            cell_channels: CellChannels::Shared,
        }
    }
}

/// `data.screen.cell_channels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellChannels {
    Shared,
    Own,
}

/// `data.screen.layout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScreenLayout {
    LoadData,
    OmeZarr,
    Chammi,
}

/// `data.screen.border`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScreenBorder {
    Skip,
    Pad,
}

/// `data.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataFormat {
    Auto,
    Folder,
    Shards,
}

/// `data.split`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeldOutSplit {
    Scdino,
    Stratified,
}

/// `data.order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleOrder {
    Exact,
    ShardSequential,
    Sites,
}

/// Client settings for a dataset in a remote store (`s3://`, `gs://`, `az://` alike).
/// Credentials are deliberately not settable here: they come
/// from each store's environment variables (see docs/data.md, "Data in object stores, on FSx
/// and on node-local NVMe"), so a config file can be shared, logged and stored in checkpoints
/// without leaking a secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObjectStoreSection {
    /// Endpoint of an S3-compatible server (`http://127.0.0.1:9000`); unset = AWS, or the
    /// `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT` variable. For `gs://` the service's base URL
    /// (unset = Google's, or `GOOGLE_BASE_URL`); for `az://` the account's blob endpoint
    /// (`http://127.0.0.1:10000/devstoreaccount1`; unset = `AZURE_STORAGE_ENDPOINT`, else the
    /// account's `https://ACCOUNT.blob.core.windows.net`).
    pub endpoint: Option<String>,
    /// Bucket region (`s3://` only); unset = `AWS_REGION` / `AWS_DEFAULT_REGION`, else
    /// `us-east-1`.
    pub region: Option<String>,
    /// Permit plain-HTTP endpoints (local S3-compatible servers and emulators); the clouds
    /// themselves need HTTPS.
    pub allow_http: bool,
    /// GET requests in flight at once per process: S3 latency, not bandwidth, limits
    /// small-object throughput, so this is what sets images/s.
    pub max_concurrency: usize,
    /// Images fetched ahead of the sampler's order; with `max_concurrency` this bounds the
    /// memory held by the prefetcher (`prefetch` × image size).
    pub prefetch: usize,
    /// Packed shards without `data.cache.dir`, read in `data.order: shard_sequential`: the
    /// largest chunk (bytes of one shard around this rank's next samples) fetched by one
    /// ranged GET instead of a GET per sample.
    pub shard_chunk_bytes: u64,
    /// Chunks held in memory or in flight at most (memory ≤ this × `shard_chunk_bytes`);
    /// 0 reads every sample by its own ranged GET.
    pub shard_chunks_ahead: usize,
    /// Retries of one request on throttling (503 SlowDown, 429), 5xx and connection errors.
    pub max_retries: usize,
    /// First retry delay; doubles per retry up to `retry_max_backoff_ms`.
    pub retry_initial_backoff_ms: u64,
    /// The longest delay between two retries.
    pub retry_max_backoff_ms: u64,
    /// Give up on a request (with all its retries) after this long.
    pub retry_timeout_seconds: u64,
    /// Timeout of one HTTP request.
    pub request_timeout_seconds: u64,
}

impl Default for ObjectStoreSection {
    fn default() -> Self {
        Self {
            endpoint: None,
            region: None,
            allow_http: false,
            max_concurrency: 32,
            prefetch: 512,
            shard_chunk_bytes: 64 << 20,
            shard_chunks_ahead: 4,
            max_retries: 10,
            retry_initial_backoff_ms: 100,
            retry_max_backoff_ms: 15_000,
            retry_timeout_seconds: 180,
            request_timeout_seconds: 30,
        }
    }
}

/// A node-local cache (e.g. NVMe at `/local_scratch`) of the dataset: objects read from
/// `s3://`, images read from a local or shared (FSx) path, shards (cached whole).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheSection {
    /// Cache directory; unset = no cache (every epoch reads the dataset where it is).
    pub dir: Option<PathBuf>,
    /// Size cap in bytes over all processes of the node. When full, new images are not
    /// cached (no eviction: with a fresh random order every epoch, evicting would only
    /// trade one miss for another) and keep streaming.
    pub max_bytes: u64,
}

impl Default for CacheSection {
    fn default() -> Self {
        Self {
            dir: None,
            max_bytes: 100 << 30,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnCorrupt {
    /// Stop with an error naming the object (the default: a bad file is usually a bad copy).
    #[default]
    Fail,
    /// Drop the image from its batch, count it, and report the count in the log.
    Skip,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            dataset_dir: DatasetLocation::Local("/datasetdir".into()),
            label_folder_depth: 0,
            train_fraction: 0.8,
            images_are_rgb: false,
            channel_names: ["aTub", "BF", "DAPI", "Oct4", "PE"]
                .map(String::from)
                .to_vec(),
            channel_combinations: ["01234", "0", "1", "2", "3", "4"]
                .map(|s| ChannelCombination::Digits(s.into()))
                .to_vec(),
            center_crop: 0,
            mean_std_fraction: 0.2,
            num_workers: 8,
            format: DataFormat::Auto,
            order: SampleOrder::Exact,
            shuffle_buffer: 1000,
            split: HeldOutSplit::Stratified,
            object_store: ObjectStoreSection::default(),
            cache: CacheSection::default(),
            on_corrupt: OnCorrupt::Fail,
            test_dir: None,
            screen: None,
        }
    }
}

/// A set of channel indices, written as scDINO's digit string or as a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ChannelCombination {
    Digits(String),
    Indices(Vec<usize>),
}
