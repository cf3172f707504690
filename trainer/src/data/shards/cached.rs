//! Packed shards on S3 through the node-local cache (`data.cache` with `format: shards`).
//!
//! A sample read from a shard that is not cached yet is served by a ranged GET at once, and
//! the first such read also queues a background download of the whole shard (one GET) into
//! the cache; once it is there, verified against the SHA-256 in the shard index, every read
//! of that shard is a local `pread`. So the first epoch streams while it fills the cache and
//! later epochs issue no request at all, whatever the sample order. Shards are cached whole
//! because that is what makes them cheap: one large sequential GET instead of a ranged GET
//! per sample. At most [`MAX_DOWNLOADS`] shards download at a time per process, so the
//! downloads never starve the ranged reads the step is waiting for.
//!
//! Cache entries are the [`NodeCache`]'s (atomic, verified, shared by the node's ranks under
//! its size cap); a shard that does not fit stays remote.
use super::store::ShardStore;
use super::{ShardIndexFile, INDEX_FILE};
use crate::data::cache::{entry_digest, NodeCache};
use crate::data::data_error::DataError;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Whole-shard downloads in flight per process (each holds one shard in memory).
pub const MAX_DOWNLOADS: usize = 2;

#[derive(Clone)]
enum ShardState {
    /// Waiting for a download worker.
    Queued,
    Downloading,
    Local(Arc<File>),
    /// Not cacheable (cache full, unwritable, or the object does not match the index).
    Remote,
}

#[derive(Default)]
struct Downloads {
    /// Shards not in here have not been read yet.
    states: HashMap<String, ShardState>,
    queue: VecDeque<String>,
    workers: usize,
}

struct Shared {
    remote: Arc<dyn ShardStore>,
    cache: NodeCache,
    /// Size and SHA-256 of each shard, from the index.
    expected: HashMap<String, (u64, String)>,
    downloads: Mutex<Downloads>,
    settled: Condvar,
    local_reads: AtomicU64,
    remote_reads: AtomicU64,
}

/// A [`ShardStore`] that caches whole shards of another (remote) store; see the module docs.
pub struct CachedShardStore {
    shared: Arc<Shared>,
    index: Vec<u8>,
}

impl CachedShardStore {
    /// Reads the index from `remote` (one GET; served from memory afterwards) to learn each
    /// shard's size and checksum.
    pub fn open(remote: Arc<dyn ShardStore>, cache: NodeCache) -> Result<Self, DataError> {
        let index = remote.read_all(INDEX_FILE)?;
        let parsed: ShardIndexFile =
            serde_json::from_slice(&index).map_err(|e| DataError::Shard {
                shard: remote.locate(INDEX_FILE),
                key: None,
                reason: format!("not a shard index: {e}"),
            })?;
        let expected = parsed
            .shards
            .into_iter()
            .map(|s| (s.file, (s.bytes, s.sha256)))
            .collect();
        Ok(Self {
            shared: Arc::new(Shared {
                remote,
                cache,
                expected,
                downloads: Mutex::new(Downloads::default()),
                settled: Condvar::new(),
                local_reads: AtomicU64::new(0),
                remote_reads: AtomicU64::new(0),
            }),
            index,
        })
    }

    /// Blocks until every shard read so far is cached (or known not to be cacheable).
    pub fn wait_for_downloads(&self) {
        let mut d = self.shared.lock();
        while d
            .states
            .values()
            .any(|s| matches!(s, ShardState::Queued | ShardState::Downloading))
        {
            d = self
                .shared
                .settled
                .wait(d)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Samples read from cached shards and by ranged GETs so far.
    pub fn reads(&self) -> (u64, u64) {
        (
            self.shared.local_reads.load(Ordering::Relaxed),
            self.shared.remote_reads.load(Ordering::Relaxed),
        )
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Downloads> {
        self.downloads.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, name: &str, s: ShardState) {
        self.lock().states.insert(name.to_string(), s);
        self.settled.notify_all();
    }

    /// The local copy of `name` if it is cached; otherwise queues its download (on first
    /// read) and returns `None`: read it remotely meanwhile.
    fn local(self: &Arc<Self>, name: &str) -> Option<Arc<File>> {
        let mut d = self.lock();
        match d.states.get(name) {
            Some(ShardState::Local(f)) => return Some(f.clone()),
            Some(_) => return None,
            None if !self.expected.contains_key(name) => return None,
            None => {}
        }
        // Already cached (by an earlier run or another rank of the node): one small read.
        if let Some(f) = self.current_entry(name) {
            d.states
                .insert(name.to_string(), ShardState::Local(f.clone()));
            return Some(f);
        }
        d.states.insert(name.to_string(), ShardState::Queued);
        d.queue.push_back(name.to_string());
        if d.workers < MAX_DOWNLOADS {
            d.workers += 1;
            let me = self.clone();
            std::thread::spawn(move || me.download_queued());
        }
        None
    }

    /// A download worker: takes queued shards until none is left.
    fn download_queued(&self) {
        loop {
            let name = {
                let mut d = self.lock();
                let Some(name) = d.queue.pop_front() else {
                    d.workers -= 1;
                    return;
                };
                d.states.insert(name.clone(), ShardState::Downloading);
                name
            };
            let size = self.expected[&name].0;
            let settled = self.download(&name, size);
            self.set(&name, settled);
        }
    }

    /// The cache entry of shard `name`, opened, if its recorded size and SHA-256 are the
    /// index's.
    fn current_entry(&self, name: &str) -> Option<Arc<File>> {
        let (size, sha) = self.expected.get(name)?;
        let path = self.cache.dir().join(name);
        match entry_digest(&path) {
            Some((n, d)) if n == *size && d == *sha => File::open(&path).ok().map(Arc::new),
            _ => None,
        }
    }

    /// Brings `name` into the cache (or finds it there) and opens it. A cached shard counts
    /// if its entry's recorded size and SHA-256 are the index's (no re-hashing of the whole
    /// shard: every sample read from it is still checked against its CRC-32 in the index);
    /// an entry of another version of the shard is replaced.
    fn download(&self, name: &str, size: u64) -> ShardState {
        let sha = &self.expected[name].1;
        let path = self.cache.dir().join(name);
        if let Some(f) = self.current_entry(name) {
            return ShardState::Local(f);
        }
        if entry_digest(&path).is_some() {
            self.cache.remove(name);
        }
        let fetched = self.cache.fetch_through(name, Some(size), || {
            let bytes = self.remote.read_all(name)?;
            let got = hex(&Sha256::digest(&bytes));
            if bytes.len() as u64 != size || got != *sha {
                return Err(DataError::Shard {
                    shard: self.remote.locate(name),
                    key: None,
                    reason: format!(
                        "{} bytes with SHA-256 {got}, but the index lists {size} bytes with {sha}",
                        bytes.len()
                    ),
                });
            }
            Ok(bytes)
        });
        match fetched.map(|_| self.current_entry(name)) {
            Ok(Some(f)) => ShardState::Local(f),
            Ok(None) => ShardState::Remote, // cache full or unwritable
            Err(e) => {
                tracing::warn!("shard {name} not cached, reading it by ranged GETs: {e}");
                ShardState::Remote
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ShardStore for CachedShardStore {
    fn read_all(&self, name: &str) -> Result<Vec<u8>, DataError> {
        if name == INDEX_FILE {
            return Ok(self.index.clone());
        }
        self.shared.remote.read_all(name)
    }

    fn read_range_into(
        &self,
        name: &str,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), DataError> {
        if let Some(f) = self.shared.local(name) {
            buf.clear();
            buf.resize(len, 0);
            if f.read_exact_at(buf, offset).is_ok() {
                self.shared.local_reads.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            // The cached file went away or shrank under us: back to the remote copy.
            self.shared.set(name, ShardState::Remote);
        }
        self.shared.remote_reads.fetch_add(1, Ordering::Relaxed);
        self.shared.remote.read_range_into(name, offset, len, buf)
    }

    fn locate(&self, name: &str) -> PathBuf {
        self.shared.remote.locate(name)
    }

    fn describe(&self) -> String {
        format!(
            "{} (shards cached whole in {})",
            self.shared.remote.describe(),
            self.shared.cache.dir().display()
        )
    }

    fn report(&self) -> Option<String> {
        let (local, remote) = self.reads();
        Some(format!(
            "shard cache: {local} samples read from cached shards, {remote} by ranged GET"
        ))
    }
}
