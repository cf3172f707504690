//! Packed shards: the dataset as a few large WebDataset-style tar files plus an index.
//!
//! Why: a hundred thousand 25 kB TIFFs are slow to list and to fetch one by one from an
//! object store or a cold parallel file system; a handful of large files stream at full
//! bandwidth. Why an index next to the tars: labels and the scDINO split are defined by
//! `ImageFolder` positions of the *original* tree, which a tar's member order cannot carry
//! (shards are shuffled at pack time so that a sequential read mixes classes). The index maps
//! every original position to its shard, byte offset and length, so a [`ShardSource`] serves
//! exactly the `DatasetIndex` of the unpacked tree and can still read any sample by `pread`.
//!
//! Layout of a packed directory:
//! * `shard-000000.tar`, `shard-000001.tar`, ...: ustar archives; sample `k` (its key is its
//!   zero-padded `ImageFolder` position) is the members `<k>.tiff` (the original file's bytes)
//!   and `<k>.json` (`{"path", "label", "class_index", "position"}`), so WebDataset or
//!   Python's `tarfile` read them without our index;
//! * [`INDEX_FILE`]: see [`ShardIndexFile`];
//! * [`JOURNAL_FILE`] only while `pack` runs: the shards finished so far (resume point).
pub mod cached;
pub mod pack;
pub mod sequential_order;
pub mod shard_source;
pub mod store;
pub mod streamed;
pub mod tar;
pub mod upload;

pub use cached::CachedShardStore;
pub use pack::{pack, PackEvent, PackOptions, PackSummary};
pub use sequential_order::shard_sequential_order;
pub use shard_source::ShardSource;
pub use store::{LocalShardStore, PlannedRead, RemoteShardStore, ShardStore};
pub use streamed::{StreamSettings, StreamedShardStore};
pub use upload::{upload, UploadEvent, UploadSummary};

use serde::{Deserialize, Serialize};

/// The index file that marks a directory as a packed dataset.
pub const INDEX_FILE: &str = "shard-index.json";
/// The resume journal of an unfinished `pack`.
pub const JOURNAL_FILE: &str = "shard-index.partial.json";
/// Format tag in the index; bumped on any incompatible change.
pub const FORMAT: &str = "scdino-shards/1";

/// `shard-000042.tar`.
pub fn shard_file_name(shard: usize) -> String {
    format!("shard-{shard:06}.tar")
}

/// Member key of the sample at `ImageFolder` position `position` among `n` samples: zero-padded
/// so that keys sort like positions (at least 6 digits).
pub fn sample_key(position: usize, n: usize) -> String {
    let width = n.saturating_sub(1).to_string().len().max(6);
    format!("{position:0width$}")
}

/// `shard-index.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardIndexFile {
    /// [`FORMAT`].
    pub format: String,
    /// The original dataset root, as `ImageFolder` saw it. Sample paths are rebuilt from it,
    /// so features and reports name the same images as for the unpacked tree.
    pub root: String,
    /// The `data.label_folder_depth` the stored labels were cut with.
    pub label_folder_depth: usize,
    /// `ImageFolder.classes`.
    pub classes: Vec<String>,
    /// Non-TIFF images the original indexing skipped (kept so the index compares equal).
    pub skipped_other_images: Vec<String>,
    /// How the shards were cut; `plan` fingerprints it together with the sample list.
    pub pack: PackSettings,
    pub shards: Vec<ShardEntry>,
    /// One entry per sample, in `ImageFolder` order (`samples[i].position == i`).
    pub samples: Vec<SampleEntry>,
}

/// The settings that decide which sample goes where; a rerun with other settings is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackSettings {
    pub seed: u64,
    pub shuffle: bool,
    pub max_shard_bytes: u64,
    pub max_shard_samples: usize,
    /// sha256 over the settings, root, classes and every sample's path, label and class.
    pub plan: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardEntry {
    pub file: String,
    pub bytes: u64,
    /// Hex sha256 of the whole file: what a rerun of `pack` verifies.
    pub sha256: String,
    pub samples: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleEntry {
    /// `ImageFolder` position in the original tree.
    pub position: usize,
    /// Path relative to `root` (the original file's).
    pub path: String,
    pub label: String,
    pub class_index: usize,
    pub shard: usize,
    /// Member key; the TIFF is `<key>.tiff`.
    pub key: String,
    /// Byte offset of the TIFF's data in the shard, and its length.
    pub offset: u64,
    pub length: u64,
    /// CRC-32 (IEEE) of the TIFF bytes, checked on every read (cheap next to decoding).
    pub crc32: u32,
}

/// `<key>.json` inside the tar, for readers without our index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberMeta {
    pub path: String,
    pub label: String,
    pub class_index: usize,
    pub position: usize,
}

/// Python's `os.path.join(root, rel)` for the relative paths we store.
pub(crate) fn join_root(root: &str, rel: &str) -> String {
    if root.is_empty() || root.ends_with('/') {
        format!("{root}{rel}")
    } else {
        format!("{root}/{rel}")
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// True if `dir` holds a packed dataset (its index file exists).
pub fn is_packed_dir(dir: &std::path::Path) -> bool {
    dir.join(INDEX_FILE).is_file()
}
