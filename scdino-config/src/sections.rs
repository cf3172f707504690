//! The YAML schema: one struct per section, every field defaulted to scDINO's
//! `scDINO_full_pipeline.yaml` value (or its argparse default where the yaml is silent).
//!
//! Unknown keys are rejected (`deny_unknown_fields`) because scDINO silently ignored its own
//! misspelled keys (`warump_epochs`, `techer_temp`) and trained with values nobody chose.
//! The doc comment of each field names the scDINO key it replaces.
use crate::DatasetLocation;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The whole file as written by the user, with defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Sections {
    pub run: RunSection,
    pub data: DataSection,
    pub model: ModelSection,
    pub train: TrainSection,
    pub augment: AugmentSection,
    pub downstream: DownstreamSection,
}

/// Where a run lives and how it is seeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunSection {
    /// `meta.name_of_run`: the run folder under `output_dir`.
    pub name: String,
    /// `meta.output_dir`.
    pub output_dir: PathBuf,
    /// `meta.seed`: split, torch and kNN seed (numpy legacy seeding needs 0..2^32-1).
    pub seed: u64,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            name: "name_of_run".into(),
            output_dir: "/outputdir".into(),
            seed: 40,
        }
    }
}

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

/// ViT backbone and DINO head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// `train_scDINO.dino_vit_name`: prefix of the model and analysis folders.
    pub name: String,
    /// `hyperparameters.arch`.
    pub arch: Arch,
    /// `hyperparameters.patch_size`.
    pub patch_size: usize,
    /// argparse `--out_dim`: prototypes of the DINO head.
    pub out_dim: usize,
    /// `hyperparameters.norm_last_layer`: freeze `weight_g` of the head's last layer at 1.
    pub norm_last_layer: bool,
    /// `hyperparameters.use_bn_in_head`.
    pub use_bn_in_head: bool,
    /// `hyperparameters.drop_path_rate`: stochastic depth of the student only.
    pub drop_path_rate: f64,
    /// How the model takes channels (new; scDINO has `fixed` only).
    pub channels: ChannelMode,
    /// DINOv2's register tokens (Darcet et al., ICLR 2024; `num_register_tokens`, 4 in the
    /// released `*_reg` models; 0 = none, scDINO): learned tokens after the CLS token, without
    /// position embedding, that take over the high-norm "artefact" tokens which spoil the
    /// attention maps. Attention maps leave them out.
    pub num_register_tokens: usize,
    /// LayerScale (CaiT; DINOv2's `ls1.gamma`, `ls2.gamma`): each residual branch scaled per
    /// channel by a learned vector starting at this value (DINOv2: 1e-5). Unset: none (scDINO).
    pub layer_scale: Option<f64>,
    /// The position-embedding layout and how it is resampled for other input sizes:
    /// `dino` (scDINO: a class position, DINO's `interpolate_pos_encoding`), `timm` (a class
    /// position, timm's `resample_abs_pos_embed`), `timm_no_class` (timm's `no_embed_class`,
    /// DINOv2's layout: patch positions only, timm's resampling).
    pub pos_embed: PosEmbed,
    /// The resolution whose patch grid the position embeddings are learned for (DINO's and
    /// timm's `img_size`): (img_size / patch_size)² positions, resampled once, with
    /// `model.pos_embed`'s method, to the grid of each input. Unset: 224 px (scDINO). With
    /// `model.init` it is the source's (DINOv2: 518), so the run computes what the source did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub img_size: Option<usize>,
    /// Start training from pretrained weights (once, when a run starts; a resumed run
    /// continues from its own checkpoint).
    pub init: ModelInit,
    /// DiChaViT's diversification losses and channel sampling (`model.channels: tokens` only).
    pub dichavit: crate::DiChaViTSection,
}

/// `model.pos_embed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PosEmbed {
    #[default]
    Dino,
    Timm,
    TimmNoClass,
}

impl PosEmbed {
    /// The YAML spelling.
    pub fn name(&self) -> &'static str {
        match self {
            PosEmbed::Dino => "dino",
            PosEmbed::Timm => "timm",
            PosEmbed::TimmNoClass => "timm_no_class",
        }
    }
}

/// `model.init`: the weights a run starts from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelInit {
    /// A timm folder, a checkpoint of another run, or a `.pth`. Unset: a random init (scDINO).
    pub from: Option<String>,
    /// What `from` is.
    pub format: InitFormat,
    /// How a source with another channel count meets the run's channels.
    pub channels: ChannelAdapt,
    /// `run` only: keep the source's DINO head too (else it starts fresh).
    pub head: bool,
    /// `false`: tensors that do not fit are skipped (and listed) instead of refused.
    pub strict: bool,
}

impl Default for ModelInit {
    fn default() -> Self {
        Self {
            from: None,
            format: InitFormat::Timm,
            channels: ChannelAdapt::Repeat,
            head: false,
            strict: true,
        }
    }
}

/// `model.init.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InitFormat {
    /// `config.json` + `model.safetensors` as timm writes them.
    #[default]
    Timm,
    /// A checkpoint of one of our runs (its teacher backbone).
    Run,
    /// A scDINO/DINO `.pth` (its teacher backbone).
    Pth,
}

/// `model.init.channels`: the patch embedding of a source with S channels for C channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelAdapt {
    /// timm's `adapt_input_conv`: the source kernels repeated cyclically over the C channels,
    /// scaled by S/C (summed for C = 1).
    #[default]
    Repeat,
    /// Every channel gets the mean kernel, scaled by S/C.
    Mean,
}

/// `model.channels`: one model per channel combination, or one for all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelMode {
    /// scDINO: a combination's channels are the ViT's input channels; one model per entry of
    /// `data.channel_combinations`.
    #[default]
    Fixed,
    /// DINO Bag-of-Channels: one single-channel ViT trained on every channel of every image
    /// as its own image; a combination's feature is its channels' CLS tokens, concatenated.
    Bag,
    /// ChannelViT: one shared single-channel patch projection, a learned embedding per
    /// channel, one token per channel and patch; trained with hierarchical channel sampling.
    Tokens,
}

impl ChannelMode {
    pub fn is_fixed(&self) -> bool {
        *self == ChannelMode::Fixed
    }

    /// One model for every combination (`bag`, `tokens`).
    pub fn is_adaptive(&self) -> bool {
        !self.is_fixed()
    }

    /// The YAML spelling.
    pub fn name(&self) -> &'static str {
        match self {
            ChannelMode::Fixed => "fixed",
            ChannelMode::Bag => "bag",
            ChannelMode::Tokens => "tokens",
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            name: "name_of_model".into(),
            arch: Arch::VitSmall,
            patch_size: 16,
            out_dim: 65536,
            norm_last_layer: true,
            use_bn_in_head: false,
            drop_path_rate: 0.1,
            channels: ChannelMode::Fixed,
            num_register_tokens: 0,
            layer_scale: None,
            pos_embed: PosEmbed::Dino,
            img_size: None,
            init: ModelInit::default(),
            dichavit: crate::DiChaViTSection::default(),
        }
    }
}

impl ModelSection {
    /// The position grid's resolution of a model that does not say (scDINO's, DINO's).
    pub const DEFAULT_IMG_SIZE: usize = 224;

    /// `img_size`, 224 when unset. Unset is not written back (`skip_serializing_if`), so the
    /// recorded config of a run at the default grid is byte for byte what it was before the
    /// key existed.
    pub fn img_size_px(&self) -> usize {
        self.img_size.unwrap_or(Self::DEFAULT_IMG_SIZE)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    VitTiny,
    VitSmall,
    VitBase,
    /// ViT-L: width 1024, 24 blocks, 16 heads (DINOv2's ViT-L/14).
    VitLarge,
}

impl Arch {
    /// The YAML spelling.
    pub fn name(&self) -> &'static str {
        match self {
            Arch::VitTiny => "vit_tiny",
            Arch::VitSmall => "vit_small",
            Arch::VitBase => "vit_base",
            Arch::VitLarge => "vit_large",
        }
    }
}

/// Optimisation and schedules (scDINO `train_scDINO` + `hyperparameters`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSection {
    /// `train_scDINO.epochs`.
    pub epochs: usize,
    /// `train_scDINO.saveckp_freq`: keep `checkpointNNNN` every n epochs (also the analysed epochs).
    pub checkpoint_every: usize,
    /// `train_scDINO.num_gpus`: processes per node, which `trainer launch` starts when its
    /// `--nproc` is not given (the launched command's config decides). A Slurm job's ranks
    /// come from the cluster file (`slurm.gpus_per_node`) instead.
    pub num_gpus: usize,
    /// `train_scDINO.batch_size_per_gpu`.
    pub batch_size_per_gpu: usize,
    /// `train_scDINO.dist_url`: `env://` or `tcp://host:port`.
    pub dist_url: String,
    /// `hyperparameters.momentum_teacher`: start of the EMA momentum schedule (ends at 1).
    pub momentum_teacher: f64,
    /// `hyperparameters.warmup_teacher_temp`.
    pub warmup_teacher_temp: f64,
    /// `hyperparameters.teacher_temp` (misspelled `techer_temp` in scDINO's yaml, hence ignored there).
    pub teacher_temp: f64,
    /// `hyperparameters.warmup_teacher_temp_epochs`.
    pub warmup_teacher_temp_epochs: usize,
    /// `hyperparameters.use_fp16` (true = fp16), extended with bf16.
    pub precision: Precision,
    /// `hyperparameters.weight_decay`: start of the (increasing) cosine schedule.
    pub weight_decay: f64,
    /// `hyperparameters.weight_decay_end`.
    pub weight_decay_end: f64,
    /// `hyperparameters.clip_grad`: per-parameter gradient norm limit; 0 disables.
    pub clip_grad: f64,
    /// `hyperparameters.freeze_last_layer`: epochs during which the head's last layer is frozen.
    pub freeze_last_layer: usize,
    /// `hyperparameters.lr`: peak learning rate for a global batch of 256 (scaled linearly).
    pub lr: f64,
    /// `hyperparameters.warmup_epochs` (misspelled `warump_epochs` in scDINO's yaml).
    pub warmup_epochs: usize,
    /// `hyperparameters.min_lr`.
    pub min_lr: f64,
    /// `hyperparameters.optimizer`.
    pub optimizer: Optimizer,
    /// Iterations between progress lines and metric updates (scDINO prints every 10).
    pub log_every: usize,
    /// How long a collective may wait for the other ranks before the run fails (a dead rank
    /// must end the job, not hang it). The AWS port used 120 s; torch's default is 30 min.
    pub dist_timeout_seconds: u64,
    /// `auto` (the local rank's GPU if libtorch sees one, else CPU), `cpu` or `cuda`. scDINO
    /// always trained on `cuda:{local_rank}`.
    pub device: crate::DeviceChoice,
    /// How several ranks share the work. `ddp` (scDINO's DistributedDataParallel): every
    /// rank holds the whole model and gradients are averaged. `fsdp`: parameters, gradients,
    /// AdamW state and teacher are sharded across ranks (1/N each between steps), for models
    /// whose training state does not fit one device. Same results either way.
    pub strategy: Strategy,
    /// DDP: start each ~25 MB gradient bucket's all-reduce during backward, as soon as its
    /// gradients exist, so communication overlaps compute (PyTorch DDP's behaviour). `false`
    /// reduces all buckets after backward (simpler; for comparison and debugging).
    pub ddp_overlap: bool,
    /// FSDP (PyTorch's `reshard_after_forward`): `true` frees each transformer block's
    /// gathered parameters right after its forward and all-gathers them again just before its
    /// backward, so only about one block is gathered at a time (more communication, least
    /// memory). `false` keeps a block gathered from its first forward until its gradients are
    /// accumulated, so the whole student is gathered between forward and backward (fewer
    /// all-gathers, one full student of extra memory).
    pub fsdp_reshard_after_forward: bool,
    /// Capture the whole training step (teacher and student forward, loss, centre update,
    /// backward, clipping, AdamW, teacher EMA) once per crop-shape set as a CUDA graph and
    /// replay it, so a step costs one graph launch instead of thousands of kernel launches.
    /// Off by default until measured on a GPU. Where a step cannot be captured (a CPU device,
    /// several ranks, fp16 loss scaling, iBOT, KoLeo, Sinkhorn-Knopp centring, `model.channels:
    /// bag` or `tokens`) the run trains as without it and says why in one warning line.
    pub cuda_graphs: bool,
    /// How `lr` follows the global batch B (all ranks): `linear` = lr·B/256 (scDINO, Goyal et
    /// al.), `sqrt` = lr·sqrt(B/256) (often better for Adam at large B). Reported at start.
    pub lr_scaling: LrScaling,
    /// What a detected collapse does (checked every `log_every` iterations after the lr and
    /// teacher-temperature warm-ups): `warn` names it with remedies and goes on, `stop` also
    /// writes a checkpoint and ends training with an error, so a cluster job stops burning
    /// GPU hours on a run that learns nothing (see `trainer::train::collapse`).
    pub on_collapse: OnCollapse,
    /// The peak dense TFLOP/s of one rank's device at the training precision (e.g. 989 for an
    /// H100 SXM in bf16, 312 for an A100 in bf16, 19.5 for an A100 in fp32). With it, the
    /// progress lines, Prometheus and TensorBoard report the model FLOPs utilisation (MFU)
    /// next to the achieved FLOP/s. Without it (the default), a GPU the trainer's peak table
    /// knows by name (`trainer::gpu::peak_tflops`) gets its peak from there; anything else
    /// reports only the FLOP/s.
    pub peak_tflops: Option<f64>,
    /// DINOv2's KoLeo regulariser (`dino.koleo_loss_weight`, 0.1 in DINOv2; 0 = off, scDINO):
    /// this weight times the Kozachenko–Leonenko entropy estimate of the student's
    /// L2-normalised backbone CLS tokens, per global crop and per rank, added to the loss. It
    /// spreads the features apart. A row whose nearest neighbour is the same vector (a
    /// duplicated image, or a batch of one) has no defined estimate: it is left out of the
    /// mean instead of giving DINOv2's huge −log(1e-8) term and its exploding gradient.
    pub koleo_weight: f64,
    /// How the teacher's outputs become targets: `ema` (scDINO, DINO: subtract an EMA centre,
    /// then a sharp softmax) or `sinkhorn_knopp` (DINOv2's `sinkhorn_knopp_teacher`, 3
    /// iterations: targets whose prototypes are used equally across the global batch, the
    /// sums all-reduced over the ranks; no centre).
    pub centering: Centering,
    /// DINOv2's iBOT masked-patch objective (Zhou et al., ICLR 2022), off by default.
    pub ibot: IbotSection,
}

/// iBOT (`dinov2/loss/ibot_patch_loss.py`, the `ibot` block of DINOv2's config): the student
/// sees some patches of each global crop replaced by a learned mask token and learns to
/// predict, for those patches, the teacher's distribution of the unmasked crop. It trains the
/// patch tokens (attention maps, dense features) besides the CLS token, and adds a second,
/// per-patch target the teacher cannot satisfy by collapsing the CLS alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IbotSection {
    /// `ibot.loss_weight` (1.0 in DINOv2): the patch loss's weight in the total loss; 0 = off
    /// (scDINO, and no mask token in the model).
    pub weight: f64,
    /// `ibot.mask_sample_probability` (0.5): the share of each rank's global-crop images that
    /// get a mask in a step (rounded down); the others are seen whole.
    pub mask_probability: f64,
    /// `ibot.mask_ratio_min_max` (`[0.1, 0.5]`): the share of a masked image's patches that is
    /// masked, spread evenly over this range across the masked images of a step, in block
    /// rectangles (DINOv2's `MaskingGenerator`).
    pub mask_ratio: [f64; 2],
    /// `ibot.separate_head`: `false` (DINOv2's default) projects the masked patch tokens with
    /// the DINO head; `true` gives them their own head, `ibot_head`, with `out_dim` prototypes.
    pub separate_head: bool,
    /// `ibot.head_n_prototypes`: the separate head's number of prototypes; unset =
    /// `model.out_dim`. Only with `separate_head: true`.
    pub out_dim: Option<usize>,
    /// The teacher temperature of the patch targets; unset = the DINO teacher temperature of
    /// the epoch, as DINOv2 does.
    pub teacher_temp: Option<f64>,
    /// The student temperature of the patch loss (`iBOTPatchLoss.student_temp`).
    pub student_temp: f64,
}

impl IbotSection {
    /// Whether the objective is on (a weight above zero).
    pub fn enabled(&self) -> bool {
        self.weight > 0.0
    }

    /// The prototypes the masked patches are projected to: the separate head's `out_dim`
    /// (default `model_out_dim`), or the DINO head's `model_out_dim`.
    pub fn prototypes(&self, model_out_dim: usize) -> usize {
        match (self.separate_head, self.out_dim) {
            (true, Some(k)) => k,
            _ => model_out_dim,
        }
    }
}

impl Default for IbotSection {
    fn default() -> Self {
        Self {
            weight: 0.0,
            mask_probability: 0.5,
            mask_ratio: [0.1, 0.5],
            separate_head: false,
            out_dim: None,
            teacher_temp: None,
            student_temp: 0.1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Centering {
    Ema,
    SinkhornKnopp,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            epochs: 10,
            checkpoint_every: 2,
            num_gpus: 2,
            batch_size_per_gpu: 30,
            dist_url: "env://".into(),
            momentum_teacher: 0.996,
            warmup_teacher_temp: 0.04,
            teacher_temp: 0.04,
            warmup_teacher_temp_epochs: 0,
            precision: Precision::Fp16,
            weight_decay: 0.04,
            weight_decay_end: 0.4,
            clip_grad: 3.0,
            freeze_last_layer: 1,
            lr: 0.0005,
            warmup_epochs: 5,
            min_lr: 1e-6,
            optimizer: Optimizer::Adamw,
            log_every: 10,
            dist_timeout_seconds: 1800,
            device: crate::DeviceChoice::Auto,
            strategy: Strategy::Ddp,
            ddp_overlap: true,
            fsdp_reshard_after_forward: true,
            cuda_graphs: false,
            lr_scaling: LrScaling::Linear,
            on_collapse: OnCollapse::Warn,
            peak_tflops: None,
            koleo_weight: 0.0,
            centering: Centering::Ema,
            ibot: IbotSection::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    Ddp,
    Fsdp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCollapse {
    Warn,
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrScaling {
    Linear,
    Sqrt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
}

/// `train.optimizer`: the values validation accepts are exactly these variants (serde
/// refuses any other spelling), and the reference page lists them from this declaration, so
/// the two cannot disagree. scDINO's `sgd` and `lars` are not implemented, hence not here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    Adamw,
}

/// Multi-crop augmentation (scDINO `DataAugmentationDINO`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AugmentSection {
    /// `hyperparameters.global_crops_scale` (yaml default; scDINO's argparse default is (0.4, 1)).
    pub global_crops_scale: (f64, f64),
    /// Side of the two global crops (224 in scDINO).
    pub global_crop_size: usize,
    /// `hyperparameters.local_crops_number`.
    pub local_crops_number: usize,
    /// `hyperparameters.local_crops_scale` (yaml default; argparse default is (0.05, 0.4)).
    pub local_crops_scale: (f64, f64),
    /// Side of the local crops (96 in scDINO).
    pub local_crop_size: usize,
    /// Where the crops are made (ours; scDINO always augmented in its DataLoader workers).
    /// `cpu`: the loader's worker threads decode and augment (exact torchvision parity).
    /// `device`: workers only decode and min–max scale, and the crops are batched tensor
    /// operations on the training device, which frees CPU cores for fast GPUs; same random
    /// parameters, bicubic `grid_sample` instead of crop + `interpolate` (differs only at
    /// crop edges). Needs equally sized images (use `data.center_crop` otherwise).
    pub augment_on: AugmentOn,
    /// Horizontal and vertical flips, p 0.5 each (scDINO: always). Off where orientation
    /// carries meaning (digits: a flipped 6 is a 9; oriented tissue).
    pub flips: bool,
    /// Per-channel brightness, p 0.8 (scDINO: always).
    pub brightness: bool,
    /// Gaussian blur, p 1.0/0.1/0.5 on global 1/global 2/locals (scDINO: always).
    pub blur: bool,
    /// Solarisation of global crop 2, p 0.2 (scDINO: always). Off for small, low-contrast
    /// images, where it inverts most of the signal.
    pub solarize: bool,
}

/// `augment.augment_on`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AugmentOn {
    #[default]
    Cpu,
    Device,
}

impl Default for AugmentSection {
    fn default() -> Self {
        Self {
            global_crops_scale: (0.14, 1.0),
            global_crop_size: 224,
            local_crops_number: 8,
            local_crops_scale: (0.05, 0.14),
            local_crop_size: 96,
            augment_on: AugmentOn::Cpu,
            flips: true,
            brightness: true,
            blur: true,
            solarize: true,
        }
    }
}

/// The analyses run after training (scDINO `downstream_analyses`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct DownstreamSection {
    /// New. Also analyse the network as it was before its first step (tag `init`: features,
    /// kNN, evaluation, UMAP and attention maps beside every trained checkpoint's, and in the
    /// report), the baseline every learning claim needs. Training writes
    /// `checkpoint_init.safetensors` when it starts from scratch with this on; a run already
    /// trained without it has no such checkpoint (the initial weights are not kept).
    pub score_untrained: bool,
    pub features: FeaturesSection,
    pub attention: AttentionSection,
    pub knn: KnnSection,
    pub umap: UmapSection,
    pub linear_probe: LinearProbeSection,
    pub metrics: MetricsSection,
    pub profiling: ProfilingSection,
}

/// New (not in scDINO): the profiling field's recipe on a screen as a pipeline stage
/// (`profiling`, after attention): the checkpoint's features of every cell of a screen
/// (`trainer embed`, docs/embedding.md), then `trainer metrics profile` on them (aggregate per
/// well, normalise to the negative controls, select features, replicate and activity mAP;
/// docs/scoring.md), shown in the report. Off by default: it needs a screen whose cells carry
/// a plate, a well, a perturbation and negative controls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProfilingSection {
    /// Run the stage.
    pub enabled: bool,
    /// The screen to embed: a run config file whose `data` section names it (`data.screen`,
    /// as `trainer embed --screen` reads it). Null, with `images` null too: this run's own
    /// `data`, which must then be a screen.
    pub screen: Option<String>,
    /// Per-cell TIFFs to embed instead of a screen (a folder, or an `s3://`, `gs://` or
    /// `az://` prefix, as `trainer embed --images`), their `Metadata_*` from `path_pattern`
    /// and `metadata`.
    pub images: Option<String>,
    /// With `images`: `Metadata_*` columns parsed from each image's path, as `trainer embed
    /// --path-pattern` (e.g. `{Plate}/{Well}/{Site}_{Cell}.tiff`).
    pub path_pattern: Option<String>,
    /// With `images`: a CSV joined to the images' metadata, as `trainer embed --metadata`.
    pub metadata: Option<String>,
    /// The recipe of `trainer metrics profile`: the path of a recipe file, or the recipe
    /// itself as a mapping (the keys of docs/scoring.md, "The recipe file"; checked when
    /// `trainer config check` or the stage reads it); null = the default (JUMP) recipe. A
    /// relative path, and an inline recipe's blocklist, are relative to the directory the
    /// trainer runs in.
    pub recipe: Option<serde_json::Value>,
    /// Which checkpoints are profiled (each one embeds the whole screen).
    pub checkpoints: ProfiledCheckpoints,
}

impl Default for ProfilingSection {
    fn default() -> Self {
        Self {
            enabled: false,
            screen: None,
            images: None,
            path_pattern: None,
            metadata: None,
            recipe: None,
            checkpoints: ProfiledCheckpoints::Last,
        }
    }
}

/// `downstream.profiling.checkpoints`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfiledCheckpoints {
    /// The newest numbered checkpoint only (the trained network's answer).
    Last,
    /// Every checkpoint the pipeline analyses (`init` too, with `score_untrained`).
    All,
}

/// New (not in scDINO): the image-based profiling field's scores of each evaluated
/// checkpoint's profile table (`trainer metrics`, docs/scoring.md), shown in the report and
/// the combinations table. A score whose columns the table lacks (no donor folders, one donor
/// only) is skipped and the report says why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Compute the scores at all.
    pub enabled: bool,
    /// The label column: replicate-retrieval mAP groups its rows, the batch scores keep it.
    pub label: String,
    /// The batch column of the batch scores (batch silhouette, graph connectivity,
    /// leave-one-batch-out F1), also the mAP's `pos_diffby` (replicates across batches).
    pub batch: String,
    /// Draws of the mAP's null distribution (its p-values).
    pub null_size: usize,
    /// Neighbours of graph connectivity's kNN graph, counting the row itself (scanpy's).
    pub n_neighbors: usize,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            enabled: true,
            label: "Metadata_Class".into(),
            batch: "Metadata_Donor".into(),
            null_size: 1000,
            n_neighbors: 15,
        }
    }
}

/// New (DINO's standard evaluation, not in scDINO): multinomial logistic regression on the
/// frozen, L2-normalised CLS features (`trainer evaluate`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinearProbeSection {
    /// L2 strengths λ tried (objective: mean cross-entropy + λ/2·‖W‖², the bias unpenalised;
    /// scikit-learn's `C` is 1/(λ·n)); the best on the validation split is refit on all
    /// training features.
    pub l2: Vec<f64>,
    /// Share of the training features held out to choose λ (seeded by `run.seed`).
    pub validation_fraction: f64,
    /// L-BFGS iterations at most per fit.
    pub max_iterations: usize,
}

impl Default for LinearProbeSection {
    fn default() -> Self {
        Self {
            l2: vec![1e-6, 1e-5, 1e-4, 1e-3, 1e-2],
            validation_fraction: 0.2,
            max_iterations: 500,
        }
    }
}

/// `downstream_analyses.compute_cls_features`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeaturesSection {
    /// Apply the dataset mean/std before the backbone.
    pub normalize: bool,
    /// scDINO `num_gpus` of `compute_cls_features`.
    pub num_gpus: usize,
    /// Images per forward pass of the features stage.
    pub batch_size_per_gpu: usize,
    /// scDINO `num_workers` of `compute_cls_features`.
    pub num_workers: usize,
    /// Which network of the checkpoint to embed with.
    pub checkpoint_key: CheckpointKey,
    /// Resize each image (bilinear) to `resize_length` before the backbone.
    pub resize: bool,
    /// Side the images are resized to when `resize` is on.
    pub resize_length: usize,
    /// scDINO `use_mean_patch_embedding`, for a checkpoint trained on other channels: the
    /// patch-embedding kernel is averaged over the checkpoint's input channels and repeated
    /// once per selected channel. Applies whenever set, even if the counts match (as scDINO).
    pub use_mean_patch_embedding: bool,
    /// scDINO `custom_embedding_map` (its `use_custom_embedding_map` is implied by a non-empty
    /// map): image channel index -> checkpoint input channel, e.g. `{2: 0, 4: 1}` embeds
    /// channel 2 with the checkpoint's channel 0. Every selected channel needs an entry.
    /// Cannot be combined with `use_mean_patch_embedding` (scDINO silently preferred the mean).
    pub custom_embedding_map: BTreeMap<usize, usize>,
    /// A `fixed` model asked for a combination that lacks some of its trained channels:
    /// `refuse` (default), or `zeros`: the missing channels are fed as zeros after
    /// normalisation (each one at its dataset mean), how the all-channel model of scDINO's
    /// way is scored against channel-adaptive models on a subset.
    pub missing_channels: MissingChannels,
    /// `model.channels: bag` only: how a combination's per-channel CLS features become its
    /// one feature, for every analysis (the features files and profiles, kNN, evaluate, the
    /// linear probe, UMAP, the combinations table and the report all use it).
    pub bag_pool: BagPool,
}

/// `downstream.features.bag_pool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BagPool {
    /// DINO Bag-of-Channels: each channel's L2-normalised CLS feature, concatenated in channel
    /// order (k·D for k channels; every channel keeps its own dimensions).
    #[default]
    Concat,
    /// The mean of the channels' L2-normalised CLS features, L2-normalised (D whatever the
    /// combination): features of different channel subsets lie in one space and compare.
    Mean,
}

impl BagPool {
    /// The YAML spelling.
    pub fn name(&self) -> &'static str {
        match self {
            BagPool::Concat => "concat",
            BagPool::Mean => "mean",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingChannels {
    Refuse,
    Zeros,
}

impl FeaturesSection {
    /// Neither of scDINO's patch-embedding adapters is configured: a fixed model is used on
    /// exactly the channels it was trained on.
    pub fn is_unadapted(&self) -> bool {
        !self.use_mean_patch_embedding && self.custom_embedding_map.is_empty()
    }
}

impl Default for FeaturesSection {
    fn default() -> Self {
        Self {
            normalize: true,
            num_gpus: 2,
            batch_size_per_gpu: 24,
            num_workers: 8,
            checkpoint_key: CheckpointKey::Teacher,
            resize: true,
            resize_length: 224,
            use_mean_patch_embedding: false,
            custom_embedding_map: BTreeMap::new(),
            missing_channels: MissingChannels::Refuse,
            bag_pool: BagPool::Concat,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKey {
    Teacher,
    Student,
}

/// `downstream_analyses.attention_visualisation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AttentionSection {
    /// `num_images_per_class`.
    pub images_per_class: usize,
    /// `resize_attention_image`.
    pub resize: bool,
    /// `image_size`: side of the image the attention is computed on.
    pub image_size: usize,
}

impl Default for AttentionSection {
    fn default() -> Self {
        Self {
            images_per_class: 1,
            resize: true,
            image_size: 480,
        }
    }
}

/// `downstream_analyses.kNN.global`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KnnSection {
    /// `n_neighbors`: every k evaluated.
    pub k: Vec<usize>,
    /// `temperature` of the exp(sim/T) vote weights.
    pub temperature: f64,
}

impl Default for KnnSection {
    fn default() -> Self {
        Self {
            k: vec![5, 10, 50, 100, 200, 500],
            temperature: 0.1,
        }
    }
}

/// `downstream_analyses.umap_eval` (scDINO ignored n_neighbors and min_dist; we honour them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UmapSection {
    /// UMAP's `n_neighbors`: the size of the neighbourhood of the fuzzy graph.
    pub n_neighbors: usize,
    /// UMAP's `min_dist`: how tightly embedded points may pack (at most `spread`).
    pub min_dist: f64,
    /// Dimensions of the embedding; must be 2 (it exists to be plotted).
    pub n_components: usize,
    /// The distance between CLS features.
    pub metric: UmapMetric,
    /// UMAP's `spread`: the scale of the embedded points.
    pub spread: f64,
    /// Optimisation epochs of the layout.
    pub epochs: usize,
    /// scDINO's TopOMetry plots; must be false (TopOMetry is a Python library).
    pub topometry_plots: bool,
}

impl Default for UmapSection {
    fn default() -> Self {
        Self {
            n_neighbors: 30,
            min_dist: 0.4,
            n_components: 2,
            metric: UmapMetric::Euclidean,
            spread: 1.1,
            epochs: 100,
            topometry_plots: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UmapMetric {
    Euclidean,
    Cosine,
    Manhattan,
    Correlation,
}
