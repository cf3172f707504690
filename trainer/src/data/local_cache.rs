//! A local or shared-file-system dataset (FSx for Lustre, NFS) through the node-local cache
//! (`data.cache.dir` with a path `dataset_dir`): the first read of an image copies it to the
//! cache (NVMe), later reads never touch the shared file system, whose small-file reads and
//! metadata operations are what a hundred thousand 25 kB TIFFs per epoch are slow on.
//!
//! Entries are the [`NodeCache`]'s (atomic, SHA-256-verified, shared by the node's ranks,
//! capped), keyed by the image's path below the dataset root. A hit does not look at the
//! original file at all, so an image changed in place on the shared file system after it was
//! cached is not noticed: clear the cache when the dataset changes.
use super::cache::{NodeCache, Origin};
use super::data_error::DataError;
use super::image_source::{ImageSource, LocalSource};
use super::index::DatasetIndex;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct CachedLocalSource {
    files: LocalSource,
    cache: NodeCache,
    /// Each sample's path relative to the dataset root (its cache key).
    rels: Vec<String>,
    hits: AtomicU64,
    copies: AtomicU64,
}

impl CachedLocalSource {
    pub fn new(files: LocalSource, cache: NodeCache) -> Result<Self, DataError> {
        let root = &files.index().root;
        let rels = files
            .index()
            .samples
            .iter()
            .map(|s| {
                s.path
                    .strip_prefix(root)
                    .map(|r| r.to_string_lossy().into_owned())
                    .map_err(|_| {
                        DataError::InvalidArgument(format!(
                            "{} is not below the dataset root {}",
                            s.path.display(),
                            root.display()
                        ))
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            files,
            cache,
            rels,
            hits: AtomicU64::new(0),
            copies: AtomicU64::new(0),
        })
    }
}

impl ImageSource for CachedLocalSource {
    fn index(&self) -> &DatasetIndex {
        self.files.index()
    }

    fn read_bytes(&self, i: usize) -> Result<Vec<u8>, DataError> {
        let (bytes, origin) = self
            .cache
            .fetch_through(&self.rels[i], None, || self.files.read_bytes(i))?;
        match origin {
            Origin::Cache => self.hits.fetch_add(1, Ordering::Relaxed),
            Origin::Fetched => self.copies.fetch_add(1, Ordering::Relaxed),
        };
        Ok(bytes)
    }

    fn describe(&self) -> String {
        format!(
            "{} (through the node-local cache {})",
            self.files.describe(),
            self.cache.dir().display()
        )
    }

    fn report(&self) -> Option<String> {
        Some(format!(
            "node-local cache: {} hits, {} images read from {}",
            self.hits.load(Ordering::Relaxed),
            self.copies.load(Ordering::Relaxed),
            self.files.index().root.display()
        ))
    }
}
