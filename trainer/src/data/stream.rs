//! [`ObjectStoreSource`]: a dataset streamed from `s3://`, `gs://` or `az://` bucket/prefix.
//!
//! Listing once gives the index (same `ImageFolder` order as the local tree, see
//! [`build_index_from_keys`]). Reads then go through the node-local cache (if configured) to
//! the store. [`ImageSource::will_read`] hands the sampler's order for this rank to a pool of
//! `data.object_store.max_concurrency` fetcher threads that keep at most `data.object_store.prefetch` images
//! fetched ahead (bounded memory). A rank only ever fetches the indices it is given, so ranks
//! never download each other's samples. Reads of indices not announced (features,
//! attention) are fetched on the spot.
use super::cache::{NodeCache, Origin};
use super::data_error::DataError;
use super::image_source::ImageSource;
use super::index::{build_index_from_keys, DatasetIndex};
use super::object_store::{Listed, Remote, StoreUrl};
use crate::config::DataSection;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Counters of one source, for logs and tests.
#[derive(Debug, Default)]
pub struct StreamStats {
    /// Objects downloaded (successful GETs).
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    /// Reads served by the node-local cache.
    pub cache_hits: AtomicU64,
    /// Reads that found their image already prefetched (or in flight).
    pub prefetched: AtomicU64,
}

/// A snapshot of [`StreamStats`] plus the cache's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub gets: u64,
    pub get_bytes: u64,
    pub cache_hits: u64,
    pub cache_writes: u64,
    pub not_cached_full: u64,
    pub prefetched: u64,
}

struct Fetcher {
    remote: Remote,
    cache: Option<NodeCache>,
    objects: Vec<Listed>,
    stats: StreamStats,
}

impl Fetcher {
    fn fetch(&self, i: usize) -> Result<Vec<u8>, DataError> {
        let obj = &self.objects[i];
        let get = || {
            let b = self.remote.get(&obj.location, Some(obj.size))?;
            self.stats.gets.fetch_add(1, Ordering::Relaxed);
            self.stats
                .get_bytes
                .fetch_add(b.len() as u64, Ordering::Relaxed);
            Ok(b)
        };
        match &self.cache {
            Some(c) => {
                let (b, origin) = c.fetch_through(&obj.rel, Some(obj.size), get)?;
                if origin == Origin::Cache {
                    self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                }
                Ok(b)
            }
            None => get(),
        }
    }
}

enum Slot {
    InFlight,
    Ready(Result<Vec<u8>, DataError>),
}

#[derive(Default)]
struct Queue {
    todo: VecDeque<usize>,
    slots: HashMap<usize, Slot>,
    shutdown: bool,
}

struct Prefetch {
    q: Mutex<Queue>,
    cv: Condvar,
    window: usize,
}

pub struct ObjectStoreSource {
    index: DatasetIndex,
    fetcher: Arc<Fetcher>,
    pf: Arc<Prefetch>,
}

impl ObjectStoreSource {
    /// Lists `url` (`data.dataset_dir`, or the test folder) and starts the fetcher threads;
    /// the rest of `data` says how (client, cache, labels, concurrency).
    pub fn open(url: &StoreUrl, data: &DataSection) -> Result<Self, DataError> {
        let remote = Remote::open(url, &data.object_store)?;
        let mut listed = remote.list()?;
        listed.retain(|o| !o.rel.ends_with('/'));
        let keys: Vec<&str> = listed.iter().map(|o| o.rel.as_str()).collect();
        let index = build_index_from_keys(&remote.url.root(), &keys, data.label_folder_depth)?;
        // Objects in index order: sample paths are `{root}/{rel}`.
        let by_rel: HashMap<&str, &Listed> = listed.iter().map(|o| (o.rel.as_str(), o)).collect();
        let root_len = remote.url.root().len() + 1;
        let objects = index
            .samples
            .iter()
            .map(|s| {
                let p = s.path.to_string_lossy();
                (*by_rel[&p[root_len..]]).clone()
            })
            .collect();
        let cache = match &data.cache.dir {
            Some(dir) => {
                let sub = url.cache_dir(dir);
                Some(NodeCache::open(
                    dir,
                    &sub,
                    data.cache.max_bytes,
                    processes_per_node(),
                )?)
            }
            None => None,
        };
        let fetcher = Arc::new(Fetcher {
            remote,
            cache,
            objects,
            stats: StreamStats::default(),
        });
        let pf = Arc::new(Prefetch {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            window: data.object_store.prefetch.max(1),
        });
        for _ in 0..data.object_store.max_concurrency.max(1) {
            let (pf, fetcher) = (pf.clone(), fetcher.clone());
            std::thread::Builder::new()
                .name("s3-fetch".into())
                .spawn(move || fetch_loop(&pf, &fetcher))
                .map_err(|e| DataError::io(url.root(), "starting fetcher threads", e))?;
        }
        Ok(Self { index, fetcher, pf })
    }

    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.fetcher.stats;
        let c = self.fetcher.cache.as_ref();
        let cache = |f: fn(&NodeCache) -> &AtomicU64| c.map_or(0, |c| f(c).load(Ordering::Relaxed));
        StatsSnapshot {
            gets: s.gets.load(Ordering::Relaxed),
            get_bytes: s.get_bytes.load(Ordering::Relaxed),
            cache_hits: s.cache_hits.load(Ordering::Relaxed),
            cache_writes: cache(|c| &c.writes),
            not_cached_full: cache(|c| &c.not_cached_full),
            prefetched: s.prefetched.load(Ordering::Relaxed),
        }
    }
}

/// Processes of this job on this node, which share the cache's cap: torchrun's and `trainer
/// launch`'s `LOCAL_WORLD_SIZE`, else Slurm's tasks per node (`"4"` or `"4(x2)"`), else 1.
pub(crate) fn processes_per_node() -> u64 {
    let leading = |v: String| -> Option<u64> {
        let digits: String = v.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse().ok()
    };
    [
        "LOCAL_WORLD_SIZE",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_TASKS_PER_NODE",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok().and_then(leading))
    .unwrap_or(1)
    .max(1)
}

fn fetch_loop(pf: &Prefetch, fetcher: &Fetcher) {
    loop {
        let i = {
            let mut q = pf.q.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if q.shutdown {
                    return;
                }
                if q.slots.len() < pf.window {
                    if let Some(i) = q.todo.pop_front() {
                        if q.slots.contains_key(&i) {
                            continue;
                        }
                        q.slots.insert(i, Slot::InFlight);
                        break i;
                    }
                }
                q = pf.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let r = fetcher.fetch(i);
        let mut q = pf.q.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot @ Slot::InFlight) = q.slots.get_mut(&i) {
            *slot = Slot::Ready(r);
        }
        pf.cv.notify_all();
    }
}

impl Drop for ObjectStoreSource {
    fn drop(&mut self) {
        let mut q = self.pf.q.lock().unwrap_or_else(|e| e.into_inner());
        q.shutdown = true;
        q.slots.clear();
        self.pf.cv.notify_all();
    }
}

impl ImageSource for ObjectStoreSource {
    fn index(&self) -> &DatasetIndex {
        &self.index
    }

    fn read_bytes(&self, i: usize) -> Result<Vec<u8>, DataError> {
        {
            let mut q = self.pf.q.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                match q.slots.get(&i) {
                    Some(Slot::Ready(_)) => {
                        let Some(Slot::Ready(r)) = q.slots.remove(&i) else {
                            unreachable!()
                        };
                        self.pf.cv.notify_all(); // room for the next prefetch
                        self.fetcher
                            .stats
                            .prefetched
                            .fetch_add(1, Ordering::Relaxed);
                        return r;
                    }
                    Some(Slot::InFlight) => {
                        q = self.pf.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                    }
                    None => {
                        // Not started: take it off the queue (it is usually near the front)
                        // and fetch it here, so it is never downloaded twice.
                        if let Some(pos) = q.todo.iter().position(|&j| j == i) {
                            q.todo.remove(pos);
                        }
                        break;
                    }
                }
            }
        }
        self.fetcher.fetch(i)
    }

    /// Replaces the previous order: images of an abandoned order that are still waiting are
    /// dropped, so memory stays bounded by `data.object_store.prefetch`.
    fn will_read(&self, order: &[usize]) {
        let mut q = self.pf.q.lock().unwrap_or_else(|e| e.into_inner());
        q.todo = order
            .iter()
            .copied()
            .filter(|&i| i < self.index.len())
            .collect();
        q.slots.retain(|_, s| matches!(s, Slot::InFlight));
        self.pf.cv.notify_all();
    }

    fn describe(&self) -> String {
        let cache = match &self.fetcher.cache {
            Some(c) => format!(", cached in {}", c.dir().display()),
            None => String::new(),
        };
        format!(
            "{} images in {} classes streamed from {}{cache}",
            self.index.len(),
            self.index.classes.len(),
            self.index.root.display()
        )
    }

    fn report(&self) -> Option<String> {
        let s = self.stats();
        Some(format!(
            "object store: {} GETs ({:.1} MB), {} cache hits, {} cached, {} not cached (cache full), {} served by prefetch",
            s.gets,
            s.get_bytes as f64 / 1e6,
            s.cache_hits,
            s.cache_writes,
            s.not_cached_full,
            s.prefetched
        ))
    }
}
