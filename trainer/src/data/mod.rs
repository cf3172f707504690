//! Data foundation of the scDINO trainer.
//!
//! * [`tiff_reader`]: multi-channel TIFF → C×H×W `f32` (chunky, planar and
//!   page-stack layouts), plus the u16 chunky writer used by [`synth`].
//! * [`index`]: torchvision `ImageFolder` enumeration, sample for sample, so
//!   seeded splits select the same files as scDINO.
//! * [`split`]: numpy legacy `RandomState` (MT19937) seeding and shuffle, the
//!   train/held-out split and the mean/std subset.
//! * [`preprocess`]: channel selection, center crop, per-image min–max.
//! * [`mean_std`]: the dataset statistics that normalise every crop (training and analyses).
//! * [`source`]: where image bytes come from (local tree, object store, shards),
//!   behind one trait so every consumer reads any source.
//! * [`shards`]: packed WebDataset-style tar shards with an index (`trainer data pack`),
//!   read back as the same `ImageFolder` dataset.
//! * [`object_store`]: the object-store client (`s3://`, `gs://`, `az://` URLs, settings, blocking API), reusable by
//!   anything that reads or writes the dataset's bucket; [`stream`]: the streaming source
//!   with prefetch; [`cache`]: verified node-local copies; [`preload`]: `trainer data preload`.
//! * [`synth`]: a deterministic synthetic PBMC-like dataset for tests/demos.
//!
//! Errors are [`DataError`]s naming the offending file; nothing here panics on
//! bad input data. `index` uses Unix file-name APIs (the trainer targets
//! Linux).

pub mod cache;
pub mod cell_channels;
pub mod chw;
pub mod csv;
pub mod data_error;
pub mod group_blocks;
pub mod image_source;
pub mod index;
pub mod local_cache;
pub mod mean_std;
pub mod object_store;
pub mod open;
pub mod preload;
pub mod preprocess;
pub mod quality;
pub mod screen;
pub mod shards;
pub mod split;
pub mod stream;
pub mod synth;
pub mod tiff_fast;
pub mod tiff_reader;

pub use data_error::DataError;
pub use image_source::{ImageSource, LocalSource, SharedSource};
pub use index::{build_index, build_index_from_keys, DatasetIndex, Sample};
pub use open::open_source;
pub use preprocess::{MinMaxOutcome, PreprocessOptions, ScaleNotes};
pub use split::{
    configured_split, mean_std_subset, numpy_shuffled_indices, stratified_split,
    train_heldout_split, Split,
};
pub use synth::{generate as generate_synthetic, SynthOptions, SynthSummary};
pub use tiff_reader::{
    decode_tiff_into, read_tiff, write_tiff_u16_chunky, Chw, ImageChw, ImageChwU16,
};
