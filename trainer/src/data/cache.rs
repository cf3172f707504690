//! Verified local copies of objects: the node-local cache and `trainer data preload`.
//!
//! An entry is the object's bytes at `{dir}/{key}` plus a sidecar `{key}.sum` holding its
//! size and SHA-256. Both are written to a unique temporary name and renamed into place, data
//! first, so a reader that finds the sidecar finds complete data, and a crashed writer leaves
//! at most a stray temporary file. An entry counts only if the data matches its sidecar, so a
//! torn or bit-rotted copy is a miss (and gets rewritten), never a wrong image. The layout is
//! the dataset's own tree, so a cache or a preload target can also serve as a local
//! `dataset_dir` (sidecars are not TIFFs; the index ignores them).
//!
//! Several processes of a node share one cache. They never corrupt it (atomic renames of
//! identical content), and a `{key}.lock` file created with `O_EXCL` makes the others wait
//! for the one already fetching an object instead of fetching it again.
use super::data_error::DataError;
use scdino_base::fs::write_atomic;
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SIDECAR: &str = ".sum";
const MAGIC: &str = "scdino-cache-v1";
/// A lock older than this belongs to a process that died while fetching.
const STALE_LOCK: Duration = Duration::from_secs(60);

/// A key that stays inside the directory it is joined to (no empty, `.` or `..` component).
pub fn safe_rel(rel: &str) -> bool {
    !rel.is_empty()
        && rel
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

fn sidecar(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(SIDECAR);
    PathBuf::from(s)
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` as a verified entry at `path` (creating parent folders).
pub fn write_verified(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)
            .map_err(|e| DataError::io(parent, "creating cache folder", e))?;
    }
    write_atomic(path, bytes).map_err(|e| DataError::io(path, "writing cache entry", e))?;
    let sum = format!("{MAGIC} {} {}\n", bytes.len(), hex(&Sha256::digest(bytes)));
    let side = sidecar(path);
    write_atomic(&side, sum.as_bytes()).map_err(|e| DataError::io(&side, "writing checksum", e))
}

/// The bytes of a verified entry at `path`, or `None` if it is missing, incomplete, of
/// another size than `expected`, or does not match its checksum.
pub fn read_verified(path: &Path, expected: Option<u64>) -> Option<Vec<u8>> {
    let sum = fs::read_to_string(sidecar(path)).ok()?;
    let mut parts = sum.split_whitespace();
    if parts.next()? != MAGIC {
        return None;
    }
    let size: u64 = parts.next()?.parse().ok()?;
    let digest = parts.next()?;
    if expected.is_some_and(|n| n != size) {
        return None;
    }
    let bytes = fs::read(path).ok()?;
    (bytes.len() as u64 == size && hex(&Sha256::digest(&bytes)) == digest).then_some(bytes)
}

/// Size and hex SHA-256 recorded for the entry at `path`, if its sidecar is intact and the
/// data file has that size. Cheap (the data is not re-hashed): for large entries whose
/// contents are checked piecewise anyway (shards, by each sample's CRC-32).
pub fn entry_digest(path: &Path) -> Option<(u64, String)> {
    let sum = fs::read_to_string(sidecar(path)).ok()?;
    let mut parts = sum.split_whitespace();
    if parts.next()? != MAGIC {
        return None;
    }
    let size: u64 = parts.next()?.parse().ok()?;
    let digest = parts.next()?.to_string();
    (fs::metadata(path).ok()?.len() == size).then_some((size, digest))
}

/// Whether a verified entry exists without keeping its bytes (for resumable copies).
pub fn is_verified(path: &Path, expected: Option<u64>) -> bool {
    read_verified(path, expected).is_some()
}

/// Where [`NodeCache::fetch_through`] found the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Cache,
    Fetched,
}

/// The node-local cache of one dataset (see the module docs).
pub struct NodeCache {
    dir: PathBuf,
    /// Bytes this process may still add. The node's cap is split evenly between the
    /// processes sharing it (`LOCAL_WORLD_SIZE`), so together they never exceed it without
    /// having to coordinate on every write.
    budget: AtomicU64,
    full: AtomicBool,
    pub hits: AtomicU64,
    pub writes: AtomicU64,
    pub not_cached_full: AtomicU64,
}

impl NodeCache {
    /// A cache for the objects below `dir` (`{cache.dir}/{bucket}/{prefix}`), capped at
    /// `max_bytes` for everything under `root` (`cache.dir`), shared by `sharers` processes.
    pub fn open(root: &Path, dir: &Path, max_bytes: u64, sharers: u64) -> Result<Self, DataError> {
        fs::create_dir_all(dir).map_err(|e| DataError::io(dir, "creating cache folder", e))?;
        let used = du(root);
        let budget = max_bytes.saturating_sub(used) / sharers.max(1);
        Ok(Self {
            dir: dir.to_path_buf(),
            budget: AtomicU64::new(budget),
            full: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            not_cached_full: AtomicU64::new(0),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Deletes the entry `rel` (data and sidecar), e.g. an outdated version of it; its
    /// bytes return to this process's budget.
    pub fn remove(&self, rel: &str) {
        if !safe_rel(rel) {
            return;
        }
        let path = self.path(rel);
        let size = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let _ = fs::remove_file(sidecar(&path));
        if fs::remove_file(&path).is_ok() {
            self.budget.fetch_add(size, Ordering::Relaxed);
        }
    }

    /// The cached bytes of `rel`, or `fetch()`'s, which are then cached (if the cap allows).
    /// If another process is fetching `rel` right now, waits for its entry instead. With a
    /// known `size`, an entry of another size is a miss; without, the entry's own checksum
    /// decides (for sources where asking the size would cost what the cache saves).
    pub fn fetch_through(
        &self,
        rel: &str,
        size: Option<u64>,
        fetch: impl FnOnce() -> Result<Vec<u8>, DataError>,
    ) -> Result<(Vec<u8>, Origin), DataError> {
        if !safe_rel(rel) {
            return fetch().map(|b| (b, Origin::Fetched));
        }
        let path = self.path(rel);
        if let Some(b) = read_verified(&path, size) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok((b, Origin::Cache));
        }
        let lock = {
            let mut s = path.as_os_str().to_owned();
            s.push(".lock");
            PathBuf::from(s)
        };
        if let Some(parent) = path.parent() {
            let _ = fs::create_dir_all(parent);
        }
        let deadline = Instant::now() + STALE_LOCK;
        let held = loop {
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock)
            {
                Ok(_) => break true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if let Some(b) = read_verified(&path, size) {
                        self.hits.fetch_add(1, Ordering::Relaxed);
                        return Ok((b, Origin::Cache));
                    }
                    let stale = fs::metadata(&lock)
                        .and_then(|m| m.modified())
                        .map(|t| t.elapsed().unwrap_or_default() > STALE_LOCK)
                        .unwrap_or(false);
                    if stale {
                        let _ = fs::remove_file(&lock);
                        continue;
                    }
                    if Instant::now() > deadline {
                        break false; // fetch it ourselves rather than hang
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => break false, // read-only or full disk: stream without caching
            }
        };
        // The holder may have finished between our failed create and now.
        if held {
            if let Some(b) = read_verified(&path, size) {
                let _ = fs::remove_file(&lock);
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok((b, Origin::Cache));
            }
        }
        let result = fetch();
        if let Ok(bytes) = &result {
            if held {
                self.store(&path, bytes);
            }
        }
        if held {
            let _ = fs::remove_file(&lock);
        }
        result.map(|b| (b, Origin::Fetched))
    }

    fn store(&self, path: &Path, bytes: &[u8]) {
        let n = bytes.len() as u64;
        let reserved = self
            .budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(n))
            .is_ok();
        if !reserved {
            self.not_cached_full.fetch_add(1, Ordering::Relaxed);
            if !self.full.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "cache {} reached data.cache.max_bytes; further images are streamed without caching",
                    self.dir.display()
                );
            }
            return;
        }
        match write_verified(path, bytes) {
            Ok(()) => {
                self.writes.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.budget.fetch_add(n, Ordering::Relaxed);
                if !self.full.swap(true, Ordering::Relaxed) {
                    tracing::warn!("cannot write to the cache ({e}); streaming without caching");
                }
            }
        }
    }
}

/// Bytes in the files under `dir` (0 if it does not exist).
fn du(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(_) => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                Err(_) => {}
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn entries_verify_size_and_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("A/x.tif");
        assert!(read_verified(&p, None).is_none());
        write_verified(&p, b"hello").unwrap();
        assert_eq!(read_verified(&p, Some(5)).unwrap(), b"hello");
        assert!(read_verified(&p, Some(6)).is_none());
        fs::write(&p, b"hellO").unwrap(); // same size, other bytes
        assert!(read_verified(&p, Some(5)).is_none());
        fs::write(&p, b"hell").unwrap(); // torn
        assert!(read_verified(&p, None).is_none());
        // No temporaries left behind.
        let names: Vec<_> = fs::read_dir(dir.path().join("A"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn concurrent_processes_fetch_each_object_once() {
        let dir = tempfile::tempdir().unwrap();
        let fetches = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (root, fetches) = (dir.path().to_path_buf(), fetches.clone());
                std::thread::spawn(move || {
                    // One NodeCache per thread, as one per process.
                    let c = NodeCache::open(&root, &root.join("b/p"), 1 << 20, 1).unwrap();
                    for k in 0..20 {
                        let rel = format!("C{}/{k}.tif", k % 3);
                        let want = vec![k as u8; 1000 + k];
                        let (got, _) = c
                            .fetch_through(&rel, Some(want.len() as u64), || {
                                fetches.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(5 + t));
                                Ok(want.clone())
                            })
                            .unwrap();
                        assert_eq!(got, want);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 20);
        for k in 0..20usize {
            let p = dir.path().join(format!("b/p/C{}/{k}.tif", k % 3));
            assert_eq!(read_verified(&p, None).unwrap(), vec![k as u8; 1000 + k]);
        }
    }

    #[test]
    fn cap_stops_caching_but_keeps_serving() {
        let dir = tempfile::tempdir().unwrap();
        let c = NodeCache::open(dir.path(), &dir.path().join("b"), 2500, 1).unwrap();
        for k in 0..4 {
            let (b, o) = c
                .fetch_through(&format!("A/{k}"), Some(1000), || Ok(vec![1; 1000]))
                .unwrap();
            assert_eq!((b.len(), o), (1000, Origin::Fetched));
        }
        assert_eq!(c.writes.load(Ordering::Relaxed), 2);
        assert_eq!(c.not_cached_full.load(Ordering::Relaxed), 2);
        assert!(du(dir.path()) <= 2500);
        // The cap counts what is already there: a second process gets no room.
        let c2 = NodeCache::open(dir.path(), &dir.path().join("b"), 2500, 1).unwrap();
        let (_, o) = c2
            .fetch_through("A/0", Some(1000), || unreachable!())
            .unwrap();
        assert_eq!(o, Origin::Cache);
        c2.fetch_through("A/3", Some(1000), || Ok(vec![1; 1000]))
            .unwrap();
        assert_eq!(c2.writes.load(Ordering::Relaxed), 0);
    }
}
