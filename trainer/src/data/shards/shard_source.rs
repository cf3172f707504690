//! [`ShardSource`]: a packed dataset behind the same [`ImageSource`] as the original tree.
use super::store::{PlannedRead, ShardStore};
use super::{join_root, ShardIndexFile, FORMAT, INDEX_FILE};
use crate::data::data_error::DataError;
use crate::data::image_source::ImageSource;
use crate::data::index::{label_for, DatasetIndex, Sample};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, Clone)]
struct Location {
    shard: usize,
    offset: u64,
    length: u64,
    crc32: u32,
}

/// Reads samples of a packed dataset by position; `index()` is the original tree's.
pub struct ShardSource {
    store: Arc<dyn ShardStore>,
    index: DatasetIndex,
    keys: Vec<String>,
    locations: Vec<Location>,
    shard_files: Vec<String>,
    /// Per shard, the positions of its samples in member order.
    layout: Vec<Vec<usize>>,
    bytes: u64,
}

impl ShardSource {
    /// Reads and checks the index. `label_folder_depth` may differ from the one used at pack
    /// time: labels are then re-cut from the original paths exactly as the tree would give.
    pub fn open(store: Arc<dyn ShardStore>, label_folder_depth: usize) -> Result<Self, DataError> {
        let index_path = store.locate(INDEX_FILE);
        let bad = |reason: String| DataError::ShardIndex {
            path: index_path.clone(),
            reason,
        };
        let raw = store.read_all(INDEX_FILE)?;
        let file: ShardIndexFile =
            serde_json::from_slice(&raw).map_err(|e| bad(format!("not a shard index: {e}")))?;
        if file.format != FORMAT {
            return Err(bad(format!(
                "format {:?}, this trainer reads {FORMAT:?}",
                file.format
            )));
        }
        let mut layout: Vec<Vec<(u64, usize)>> = vec![Vec::new(); file.shards.len()];
        let mut samples = Vec::with_capacity(file.samples.len());
        let mut locations = Vec::with_capacity(file.samples.len());
        let mut keys = Vec::with_capacity(file.samples.len());
        for (i, s) in file.samples.iter().enumerate() {
            if s.position != i {
                return Err(bad(format!("sample {i} has position {}", s.position)));
            }
            let shard = file
                .shards
                .get(s.shard)
                .ok_or_else(|| bad(format!("sample {i} names missing shard {}", s.shard)))?;
            if s.offset + s.length > shard.bytes {
                return Err(bad(format!(
                    "sample {i} ({}) lies beyond the end of {}",
                    s.key, shard.file
                )));
            }
            if s.class_index >= file.classes.len() {
                return Err(bad(format!("sample {i} has class index {}", s.class_index)));
            }
            let path = PathBuf::from(join_root(&file.root, &s.path));
            let label = if label_folder_depth == file.label_folder_depth {
                s.label.clone()
            } else {
                label_for(&path, label_folder_depth)?
            };
            layout[s.shard].push((s.offset, i));
            samples.push(Sample {
                path,
                class_index: s.class_index,
                label,
            });
            keys.push(s.key.clone());
            locations.push(Location {
                shard: s.shard,
                offset: s.offset,
                length: s.length,
                crc32: s.crc32,
            });
        }
        let layout = layout
            .into_iter()
            .map(|mut v| {
                v.sort_unstable();
                v.into_iter().map(|(_, i)| i).collect()
            })
            .collect();
        Ok(Self {
            index: DatasetIndex {
                root: PathBuf::from(&file.root),
                classes: file.classes,
                samples,
                skipped_other_images: file
                    .skipped_other_images
                    .iter()
                    .map(PathBuf::from)
                    .collect(),
                groups: None,
            },
            bytes: file.shards.iter().map(|s| s.bytes).sum(),
            shard_files: file.shards.into_iter().map(|s| s.file).collect(),
            store,
            keys,
            locations,
            layout,
        })
    }

    /// Number of shard files.
    pub fn shard_count(&self) -> usize {
        self.shard_files.len()
    }

    fn member_error(&self, i: usize, reason: String) -> DataError {
        DataError::Shard {
            shard: self
                .store
                .locate(&self.shard_files[self.locations[i].shard]),
            key: Some(self.keys[i].clone()),
            reason: format!("{reason} (sample {})", self.index.samples[i].path.display()),
        }
    }
}

impl ImageSource for ShardSource {
    fn index(&self) -> &DatasetIndex {
        &self.index
    }

    fn read_bytes(&self, i: usize) -> Result<Vec<u8>, DataError> {
        let mut buf = Vec::new();
        self.read_bytes_into(i, &mut buf)?;
        Ok(buf)
    }

    fn read_bytes_into(&self, i: usize, buf: &mut Vec<u8>) -> Result<(), DataError> {
        let loc = &self.locations[i];
        self.store.read_range_into(
            &self.shard_files[loc.shard],
            loc.offset,
            loc.length as usize,
            buf,
        )?;
        let crc = crc32fast::hash(buf);
        if crc != loc.crc32 {
            return Err(self.member_error(
                i,
                format!(
                    "CRC-32 {crc:08x} does not match the index's {:08x}",
                    loc.crc32
                ),
            ));
        }
        Ok(())
    }

    fn locate_error(&self, i: usize, e: DataError) -> DataError {
        self.member_error(i, e.to_string())
    }

    /// Hands the member reads of `order` to the store (which may stream them in chunks).
    fn will_read(&self, order: &[usize]) {
        let reads: Vec<PlannedRead<'_>> = order
            .iter()
            .filter_map(|&i| self.locations.get(i))
            .map(|loc| PlannedRead {
                name: &self.shard_files[loc.shard],
                offset: loc.offset,
                len: loc.length,
            })
            .collect();
        self.store.will_read(&reads);
    }

    fn shard_layout(&self) -> Option<&[Vec<usize>]> {
        Some(&self.layout)
    }

    fn report(&self) -> Option<String> {
        self.store.report()
    }

    fn describe(&self) -> String {
        format!(
            "{} images in {} classes from {} shards ({:.1} MB) in {} (packed from {})",
            self.index.len(),
            self.index.classes.len(),
            self.shard_files.len(),
            self.bytes as f64 / 1e6,
            self.store.describe(),
            self.index.root.display()
        )
    }
}
