//! Error type of the data layer.
//!
//! Every variant that concerns a file or directory carries its path, so a bad
//! file among a hundred thousand can be found from the message alone. Input
//! data never causes a panic: the reader, indexer and preprocessing return
//! these errors instead.

use std::path::{Path, PathBuf};

/// Errors raised while reading, indexing, splitting, preprocessing or
/// generating image data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An operating-system I/O error on `path`.
    #[error("{}: {context}: {source}", path.display())]
    Io {
        path: PathBuf,
        /// What we were doing, e.g. "opening file".
        context: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// The `tiff` crate rejected the file (not a TIFF, truncated, corrupt).
    #[error("{}: invalid or truncated TIFF: {source}", path.display())]
    Tiff {
        path: PathBuf,
        #[source]
        source: tiff::TiffError,
    },

    /// A well-formed TIFF whose layout or sample type we do not support, or
    /// whose pages disagree with each other.
    #[error("{}: unsupported TIFF: {reason}", path.display())]
    UnsupportedTiff { path: PathBuf, reason: String },

    /// The dataset root does not exist or is not a directory.
    #[error("{}: dataset root {reason}", path.display())]
    DatasetRoot { path: PathBuf, reason: &'static str },

    /// The dataset root has no class sub-directories (torchvision raises
    /// `FileNotFoundError("Couldn't find any class folder")` here).
    #[error("{}: no class folders found in dataset root", path.display())]
    NoClassFolders { path: PathBuf },

    /// No class folder contains a `.tif`/`.tiff` file (one empty class among others is only
    /// a warning; torchvision raised `FileNotFoundError` for either).
    #[error("{}: no .tif/.tiff files in any class folder ({})", root.display(), classes.join(", "))]
    EmptyClasses { root: PathBuf, classes: Vec<String> },

    /// `folder_depth_for_labels` points above the first component of a path
    /// (Python would raise `IndexError` on `path.split("/")[-depth-2]`).
    #[error(
        "{}: folder_depth_for_labels={depth} needs at least {} '/'-separated components, path has {components}",
        path.display(), depth + 2
    )]
    LabelDepth {
        path: PathBuf,
        depth: usize,
        components: usize,
    },

    /// A selected channel index is not below the number of image channels.
    #[error("channel index {channel} out of range for an image with {channels} channels")]
    ChannelOutOfRange { channel: usize, channels: usize },

    /// A function argument is outside its valid range (fractions, sizes...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A screen (LoadData table, object table, plate) that is wrong; the inner error (a
    /// `ScreenError`, boxed so this module does not depend on the screen's) names the file,
    /// row or key.
    #[error(transparent)]
    Screen(Box<dyn std::error::Error + Send + Sync>),

    /// A packed shard or one of its members is missing, truncated or fails its checksum.
    /// Names the shard file and, when one member is at fault, its key (the member name
    /// without extension) and the sample's original path.
    #[error("{}{}: {reason}", shard.display(), key.as_deref().map(|k| format!(" [{k}]")).unwrap_or_default())]
    Shard {
        shard: PathBuf,
        key: Option<String>,
        reason: String,
    },

    /// The shard index (`shard-index.json`) or the pack journal is unreadable or inconsistent.
    #[error("{}: {reason}", path.display())]
    ShardIndex { path: PathBuf, reason: String },
    /// A request to the object store failed after its retries (`url` names the object or
    /// the listed prefix).
    #[error("{url}: {context}: {source}{note}")]
    ObjectStore {
        url: String,
        context: &'static str,
        #[source]
        source: Box<object_store::Error>,
        /// Empty, or what else helps (where the credentials of a refused request came from).
        note: String,
    },

    /// The store's client could not get credentials (`credentials` says from where; never a
    /// value).
    #[error("{url}: no {service} credentials: {credentials}: {reason}")]
    Credentials {
        url: String,
        /// The store's name: S3, Google Cloud Storage, Azure Blob Storage.
        service: &'static str,
        credentials: String,
        reason: String,
    },

    /// An object-store URL or client setting we cannot use.
    #[error("{url}: {reason}")]
    StoreConfig { url: String, reason: String },

    /// An object's body disagrees with its listing (e.g. fewer bytes than listed).
    #[error("{url}: {reason}")]
    CorruptObject { url: String, reason: String },

    /// Wraps an error that has no path of its own (e.g. from preprocessing)
    /// with the file it occurred on.
    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<DataError>,
    },
}

impl DataError {
    /// True when the image's own bytes are bad (undecodable or inconsistent), as opposed to
    /// the storage failing: the errors `data.on_corrupt: skip` may skip.
    pub fn is_corrupt_image(&self) -> bool {
        matches!(
            self,
            DataError::Tiff { .. }
                | DataError::UnsupportedTiff { .. }
                | DataError::CorruptObject { .. }
        )
    }

    pub(crate) fn store(
        url: impl Into<String>,
        context: &'static str,
        source: object_store::Error,
    ) -> Self {
        DataError::ObjectStore {
            url: url.into(),
            context,
            source: Box::new(source),
            note: String::new(),
        }
    }

    /// Attach `path` to an error that does not already name a file.
    pub fn in_file(self, path: impl Into<PathBuf>) -> DataError {
        match self {
            DataError::ChannelOutOfRange { .. } | DataError::InvalidArgument(_) => {
                DataError::InFile {
                    path: path.into(),
                    source: Box::new(self),
                }
            }
            other => other,
        }
    }

    pub(crate) fn io(
        path: impl Into<PathBuf>,
        context: &'static str,
        source: std::io::Error,
    ) -> Self {
        DataError::Io {
            path: path.into(),
            context,
            source,
        }
    }

    /// For `map_err` on [`scdino_base::fs::write_atomic`] of `path`: the error names the file.
    pub(crate) fn writing(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |e| Self::io(path, "writing", e)
    }

    pub(crate) fn unsupported(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        DataError::UnsupportedTiff {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
