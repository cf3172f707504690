//! Packed shards on S3 *without* a node-local cache, read in large chunks ahead of the order.
//!
//! Why: with `data.order: shard_sequential` a rank reads a contiguous run of shards, yet one
//! ranged GET per sample would still pay S3's per-request latency for every image. Given the
//! epoch's order ([`ShardStore::will_read`]), the planned reads are grouped into chunks (runs
//! of one shard's planned members, at most `data.object_store.shard_chunk_bytes` long, see
//! [`plan_chunks`]) ordered by first use; fetcher threads download the next
//! `data.object_store.shard_chunks_ahead` chunks with one ranged GET each, and reads are served from
//! memory. Memory stays bounded by `shard_chunks_ahead × shard_chunk_bytes`: a chunk is
//! dropped once all its planned reads were served, or when the reader has moved
//! `shard_chunks_ahead` chunks past it (a sample the shuffle buffer emits that late, and any
//! read not announced, gets a ranged GET of its own). Each rank plans only its own samples,
//! so it fetches only the byte ranges around them.
//!
//! An order that would not pay (scDINO's exact order touches every shard at random): the
//! window is simulated over the plan ([`simulate`]) and the plan is streamed only if that at
//! least halves the number of requests; otherwise every read stays a ranged GET.
use super::store::{PlannedRead, ShardStore};
use crate::data::data_error::DataError;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// `data.object_store.shard_chunk_bytes`, `data.object_store.shard_chunks_ahead`, and the fetcher threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSettings {
    pub chunk_bytes: u64,
    /// Chunks in memory or in flight at most; 0 turns streaming off.
    pub chunks_ahead: usize,
    /// Chunk GETs in flight at most (≤ `chunks_ahead`).
    pub fetchers: usize,
}

/// One chunk: bytes `start..end` of shard object `name`, covering `reads` planned reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub name: String,
    pub start: u64,
    pub end: u64,
    pub reads: usize,
}

/// Chunks in order of first use, and the chunk of each planned read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkPlan {
    pub chunks: Vec<Chunk>,
    pub chunk_of: Vec<usize>,
}

/// Groups `reads` into chunks: per shard, members in byte order join the current chunk while
/// it stays within `chunk_bytes` (a single larger member gets a chunk of its own) and the gap
/// to the previous member (unplanned bytes: other ranks' or held-out samples) is at most
/// `chunk_bytes / 8`. Chunks are numbered by their first planned use.
pub fn plan_chunks(reads: &[PlannedRead<'_>], chunk_bytes: u64) -> ChunkPlan {
    let mut by_place: Vec<usize> = (0..reads.len()).collect();
    by_place.sort_by(|&a, &b| {
        (reads[a].name, reads[a].offset, a).cmp(&(reads[b].name, reads[b].offset, b))
    });
    let max_gap = chunk_bytes / 8;
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut chunk_of = vec![0usize; reads.len()];
    let mut first_use: Vec<usize> = Vec::new();
    for &r in &by_place {
        let read = &reads[r];
        let end = read.offset + read.len;
        let joins = chunks.last().is_some_and(|c| {
            c.name == read.name
                && end.max(c.end) - c.start <= chunk_bytes
                && read.offset.saturating_sub(c.end) <= max_gap
        });
        if joins {
            let c = chunks.last_mut().expect("checked");
            c.end = c.end.max(end);
            c.reads += 1;
            let k = chunks.len() - 1;
            first_use[k] = first_use[k].min(r);
        } else {
            chunks.push(Chunk {
                name: read.name.to_string(),
                start: read.offset,
                end,
                reads: 1,
            });
            first_use.push(r);
        }
        chunk_of[r] = chunks.len() - 1;
    }
    let mut by_use: Vec<usize> = (0..chunks.len()).collect();
    by_use.sort_by_key(|&c| first_use[c]);
    let mut renumber = vec![0usize; chunks.len()];
    for (new, &old) in by_use.iter().enumerate() {
        renumber[old] = new;
    }
    let mut ordered = vec![None; chunks.len()];
    for (old, c) in chunks.into_iter().enumerate() {
        ordered[renumber[old]] = Some(c);
    }
    ChunkPlan {
        chunks: ordered
            .into_iter()
            .map(|c| c.expect("a permutation"))
            .collect(),
        chunk_of: chunk_of.into_iter().map(|c| renumber[c]).collect(),
    }
}

/// The window over a plan: which chunks are fetched or in memory, as both the store and
/// [`simulate`] move it.
#[derive(Debug, Clone)]
struct Window {
    /// Chunks below `lo` are gone (served completely, failed, or passed by the reader).
    lo: usize,
    size: usize,
    remaining: Vec<usize>,
    done: Vec<bool>,
}

impl Window {
    fn new(plan: &ChunkPlan, size: usize) -> Self {
        Self {
            lo: 0,
            size,
            remaining: plan.chunks.iter().map(|c| c.reads).collect(),
            done: vec![false; plan.chunks.len()],
        }
    }

    /// The reader needs chunk `c`: `false` if it is gone (read it directly). Chunks the
    /// window must drop to reach `c` are marked done.
    fn reach(&mut self, c: usize) -> bool {
        if c < self.lo || self.done[c] {
            return false;
        }
        if c >= self.lo + self.size {
            for d in self.lo..=c - self.size {
                self.done[d] = true;
            }
            self.skip_done();
        }
        true
    }

    fn skip_done(&mut self) {
        while self.lo < self.done.len() && self.done[self.lo] {
            self.lo += 1;
        }
    }

    /// One planned read of chunk `c` was served from memory.
    fn served(&mut self, c: usize) {
        self.remaining[c] = self.remaining[c].saturating_sub(1);
        if self.remaining[c] == 0 {
            self.finish(c);
        }
    }

    fn finish(&mut self, c: usize) {
        self.done[c] = true;
        self.skip_done();
    }

    /// Chunks whose GET may start now.
    fn fetchable(&self) -> std::ops::Range<usize> {
        self.lo..(self.lo + self.size).min(self.done.len())
    }
}

/// Requests the store makes if the planned reads arrive in order: `(chunk GETs, direct
/// ranged GETs)`.
pub fn simulate(plan: &ChunkPlan, chunks_ahead: usize) -> (usize, usize) {
    if chunks_ahead == 0 {
        return (0, plan.chunk_of.len());
    }
    let mut w = Window::new(plan, chunks_ahead);
    let mut fetched_below = w.fetchable().end;
    let mut direct = 0;
    for &c in &plan.chunk_of {
        if w.reach(c) {
            w.served(c);
        } else {
            direct += 1;
        }
        fetched_below = fetched_below.max(w.fetchable().end);
    }
    (fetched_below, direct)
}

enum ChunkState {
    Waiting,
    Fetching,
    Ready(Arc<Vec<u8>>),
    Gone,
}

struct Active {
    plan: ChunkPlan,
    window: Window,
    states: Vec<ChunkState>,
    /// shard name → member offset → chunk.
    lookup: HashMap<String, HashMap<u64, usize>>,
    next_fetch: usize,
    /// States below this are already `Gone`.
    released: usize,
}

impl Active {
    /// Drops the bytes of chunks the window has let go of (all below `lo`, and any in the
    /// window already served completely).
    fn release(&mut self) {
        for s in &mut self.states[self.released..self.window.lo] {
            *s = ChunkState::Gone;
        }
        self.released = self.released.max(self.window.lo);
        for c in self.window.fetchable() {
            if self.window.done[c] {
                self.states[c] = ChunkState::Gone;
            }
        }
    }

    /// Downloaded chunks still held (only the window holds any).
    fn ready(&self) -> usize {
        self.window
            .fetchable()
            .filter(|&c| matches!(self.states[c], ChunkState::Ready(_)))
            .count()
    }
}

#[derive(Default)]
struct Counters {
    chunk_gets: AtomicU64,
    chunk_bytes: AtomicU64,
    served: AtomicU64,
    direct: AtomicU64,
    peak_chunks: AtomicU64,
}

#[derive(Default)]
struct State {
    active: Option<Active>,
    /// Chunk GETs in flight, of any plan: a chunk the reader passed (or an old plan's) still
    /// takes memory until its GET returns, so it counts against `chunks_ahead` too.
    downloading: usize,
    generation: u64,
    fetchers: usize,
    shutdown: bool,
}

struct Shared {
    remote: Arc<dyn ShardStore>,
    settings: StreamSettings,
    state: Mutex<State>,
    changed: Condvar,
    counters: Counters,
}

/// A [`ShardStore`] that streams another (remote) store's shards in chunks; see the module
/// docs.
pub struct StreamedShardStore {
    shared: Arc<Shared>,
}

/// What a [`StreamedShardStore`] did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamCounts {
    pub chunk_gets: u64,
    pub chunk_bytes: u64,
    /// Reads served from downloaded chunks.
    pub served: u64,
    /// Reads that went to the remote store on their own.
    pub direct: u64,
    /// Most chunks held in memory or downloading at once (never above `chunks_ahead`).
    pub peak_chunks: u64,
}

impl StreamedShardStore {
    pub fn new(remote: Arc<dyn ShardStore>, settings: StreamSettings) -> Self {
        Self {
            shared: Arc::new(Shared {
                remote,
                settings: StreamSettings {
                    fetchers: settings.fetchers.clamp(1, settings.chunks_ahead.max(1)),
                    ..settings
                },
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                counters: Counters::default(),
            }),
        }
    }

    pub fn counts(&self) -> StreamCounts {
        let c = &self.shared.counters;
        StreamCounts {
            chunk_gets: c.chunk_gets.load(Ordering::Relaxed),
            chunk_bytes: c.chunk_bytes.load(Ordering::Relaxed),
            served: c.served.load(Ordering::Relaxed),
            direct: c.direct.load(Ordering::Relaxed),
            peak_chunks: c.peak_chunks.load(Ordering::Relaxed),
        }
    }
}

impl Drop for StreamedShardStore {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.changed.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fetcher thread: downloads fetchable chunks of the current plan until shutdown.
    fn fetch_chunks(&self) {
        loop {
            let (generation, c, chunk) = {
                let mut st = self.lock();
                loop {
                    if st.shutdown {
                        return;
                    }
                    let (generation, downloading) = (st.generation, st.downloading);
                    let limit = self.settings.chunks_ahead;
                    let picked = st.active.as_mut().and_then(|a| {
                        a.release();
                        let held = a.ready() + downloading;
                        let range = a.window.fetchable();
                        a.next_fetch = a.next_fetch.max(range.start);
                        while a.next_fetch < range.end
                            && !matches!(a.states[a.next_fetch], ChunkState::Waiting)
                        {
                            a.next_fetch += 1;
                        }
                        if held >= limit || a.next_fetch >= range.end {
                            return None;
                        }
                        let c = a.next_fetch;
                        a.next_fetch += 1;
                        a.states[c] = ChunkState::Fetching;
                        self.counters
                            .peak_chunks
                            .fetch_max(held as u64 + 1, Ordering::Relaxed);
                        Some((generation, c, a.plan.chunks[c].clone()))
                    });
                    if let Some(p) = picked {
                        st.downloading += 1;
                        break p;
                    }
                    st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            let got = self.remote.read_range(
                &chunk.name,
                chunk.start,
                (chunk.end - chunk.start) as usize,
            );
            let mut st = self.lock();
            st.downloading -= 1;
            if let Ok(b) = &got {
                self.counters.chunk_gets.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .chunk_bytes
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
            }
            if st.generation == generation {
                if let Some(a) = st.active.as_mut() {
                    if matches!(a.states[c], ChunkState::Fetching) {
                        match got {
                            Ok(b) => a.states[c] = ChunkState::Ready(Arc::new(b)),
                            Err(e) => {
                                tracing::warn!(
                                    "streaming {} bytes {}..{} failed, its samples are read one by one: {e}",
                                    chunk.name, chunk.start, chunk.end
                                );
                                a.window.finish(c);
                            }
                        }
                        a.release();
                    }
                }
            }
            drop(st);
            self.changed.notify_all();
        }
    }

    /// The bytes of the chunk holding member `name@offset` once it is downloaded, or `None`
    /// if the read is not streamed.
    fn chunk_for(&self, name: &str, offset: u64) -> Option<(Arc<Vec<u8>>, u64)> {
        let mut st = self.lock();
        loop {
            let a = st.active.as_mut()?;
            let c = *a.lookup.get(name)?.get(&offset)?;
            if !a.window.reach(c) {
                return None;
            }
            a.release();
            match &a.states[c] {
                ChunkState::Ready(b) => {
                    let b = b.clone();
                    let start = a.plan.chunks[c].start;
                    a.window.served(c);
                    a.release();
                    drop(st);
                    self.changed.notify_all();
                    return Some((b, start));
                }
                ChunkState::Gone => return None,
                ChunkState::Waiting | ChunkState::Fetching => {
                    self.changed.notify_all();
                    st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }
}

impl ShardStore for StreamedShardStore {
    fn read_all(&self, name: &str) -> Result<Vec<u8>, DataError> {
        self.shared.remote.read_all(name)
    }

    fn read_range_into(
        &self,
        name: &str,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), DataError> {
        if let Some((bytes, start)) = self.shared.chunk_for(name, offset) {
            let from = (offset - start) as usize;
            if let Some(member) = bytes.get(from..from + len) {
                buf.clear();
                buf.extend_from_slice(member);
                self.shared.counters.served.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
        }
        self.shared.counters.direct.fetch_add(1, Ordering::Relaxed);
        self.shared.remote.read_range_into(name, offset, len, buf)
    }

    /// Plans chunks for `reads` (replacing any earlier plan) if streaming them pays.
    fn will_read(&self, reads: &[PlannedRead<'_>]) {
        let s = self.shared.settings;
        let plan = plan_chunks(reads, s.chunk_bytes);
        let (gets, direct) = simulate(&plan, s.chunks_ahead);
        let stream = s.chunks_ahead > 0 && !reads.is_empty() && 2 * (gets + direct) <= reads.len();
        let mut st = self.shared.lock();
        st.generation += 1;
        st.active = stream.then(|| {
            let mut lookup: HashMap<String, HashMap<u64, usize>> = HashMap::new();
            for (r, &c) in reads.iter().zip(&plan.chunk_of) {
                lookup
                    .entry(r.name.to_string())
                    .or_default()
                    .insert(r.offset, c);
            }
            Active {
                window: Window::new(&plan, s.chunks_ahead),
                states: plan.chunks.iter().map(|_| ChunkState::Waiting).collect(),
                plan,
                lookup,
                next_fetch: 0,
                released: 0,
            }
        });
        while stream && st.fetchers < s.fetchers {
            st.fetchers += 1;
            let me = self.shared.clone();
            std::thread::spawn(move || me.fetch_chunks());
        }
        drop(st);
        self.shared.changed.notify_all();
    }

    fn locate(&self, name: &str) -> PathBuf {
        self.shared.remote.locate(name)
    }

    fn describe(&self) -> String {
        self.shared.remote.describe()
    }

    fn report(&self) -> Option<String> {
        let c = self.counts();
        Some(format!(
            "shard stream: {} samples from {} chunk GETs ({:.1} MB), {} by ranged GET",
            c.served,
            c.chunk_gets,
            c.chunk_bytes as f64 / 1e6,
            c.direct
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    /// Shards in memory that log every range request; ranges longer than `fail_above`
    /// bytes fail (a chunk GET that exhausted its retries).
    struct MemStore {
        objects: HashMap<String, Vec<u8>>,
        requests: Mutex<Vec<(String, u64, usize)>>,
        fail_above: usize,
    }

    const SHARDS: usize = 3;
    const MEMBERS: usize = 10;
    const SPACING: u64 = 512;
    const LEN: u64 = 400;

    fn shard(s: usize) -> String {
        format!("shard-{s:06}.tar")
    }

    impl MemStore {
        fn new(fail_above: usize) -> Arc<Self> {
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            let objects = (0..SHARDS)
                .map(|s| {
                    let bytes = (0..SPACING * MEMBERS as u64)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x as u8
                        })
                        .collect();
                    (shard(s), bytes)
                })
                .collect();
            Arc::new(Self {
                objects,
                requests: Mutex::new(Vec::new()),
                fail_above,
            })
        }

        fn requests(&self) -> Vec<(String, u64, usize)> {
            self.requests.lock().unwrap().clone()
        }

        fn member(&self, (s, m): (usize, usize)) -> &[u8] {
            let off = m as u64 * SPACING;
            &self.objects[&shard(s)][off as usize..(off + LEN) as usize]
        }
    }

    impl ShardStore for MemStore {
        fn read_all(&self, name: &str) -> Result<Vec<u8>, DataError> {
            Ok(self.objects[name].clone())
        }

        fn read_range_into(
            &self,
            name: &str,
            offset: u64,
            len: usize,
            buf: &mut Vec<u8>,
        ) -> Result<(), DataError> {
            self.requests
                .lock()
                .unwrap()
                .push((name.to_string(), offset, len));
            if len > self.fail_above {
                return Err(DataError::Shard {
                    shard: PathBuf::from(name),
                    key: None,
                    reason: "injected failure".into(),
                });
            }
            let o = offset as usize;
            *buf = self.objects[name][o..o + len].to_vec();
            Ok(())
        }

        fn locate(&self, name: &str) -> PathBuf {
            PathBuf::from(name)
        }

        fn describe(&self) -> String {
            "memory".into()
        }
    }

    fn names() -> Vec<String> {
        (0..SHARDS).map(shard).collect()
    }

    fn planned<'a>(names: &'a [String], order: &[(usize, usize)]) -> Vec<PlannedRead<'a>> {
        order
            .iter()
            .map(|&(s, m)| PlannedRead {
                name: &names[s],
                offset: m as u64 * SPACING,
                len: LEN,
            })
            .collect()
    }

    /// Shards 2, 0, 1 front to back, members slightly shuffled within each shard (as a small
    /// shuffle buffer leaves them).
    fn sequential_order() -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for s in [2, 0, 1] {
            let mut ms: Vec<usize> = (0..MEMBERS).collect();
            for pair in ms.chunks_mut(2) {
                pair.reverse();
            }
            out.extend(ms.into_iter().map(|m| (s, m)));
        }
        out
    }

    /// 4 members (at 512-byte spacing, 400 bytes each, gaps of 112 bytes) fit in 2048 bytes:
    /// 4 + 4 + 2 chunks per shard.
    const SETTINGS: StreamSettings = StreamSettings {
        chunk_bytes: 2048,
        chunks_ahead: 2,
        fetchers: 2,
    };

    #[test]
    fn chunks_follow_shards_size_gaps_and_first_use() {
        let names = names();
        let order = sequential_order();
        let plan = plan_chunks(&planned(&names, &order), 2048);
        let spans: Vec<(String, u64, u64, usize)> = plan
            .chunks
            .iter()
            .map(|c| (c.name.clone(), c.start, c.end, c.reads))
            .collect();
        let mut want = Vec::new();
        for s in [2, 0, 1] {
            want.push((shard(s), 0, 3 * SPACING + LEN, 4));
            want.push((shard(s), 4 * SPACING, 7 * SPACING + LEN, 4));
            want.push((shard(s), 8 * SPACING, 9 * SPACING + LEN, 2));
        }
        assert_eq!(spans, want);
        for (r, &(s, m)) in order.iter().enumerate() {
            let c = &plan.chunks[plan.chunk_of[r]];
            assert_eq!(c.name, shard(s));
            assert!(c.start <= m as u64 * SPACING && m as u64 * SPACING + LEN <= c.end);
        }
        // A gap above chunk_bytes / 8 starts a new chunk: members 0 and 2 of a shard are 624
        // bytes apart, above 4096 / 8.
        let sparse = planned(&names, &[(0, 0), (0, 2), (0, 3)]);
        let plan = plan_chunks(&sparse, 4096);
        assert_eq!(plan.chunks.len(), 2);
        assert_eq!(plan.chunk_of, vec![0, 1, 1]);
        // A member larger than the chunk size still gets a chunk (of its own).
        let plan = plan_chunks(&planned(&names, &[(1, 0), (1, 1)]), 64);
        assert_eq!(plan.chunks.len(), 2);
        assert_eq!((plan.chunks[0].start, plan.chunks[0].end), (0, LEN));
        // The same member twice (the sampler's padding) is one place in one chunk.
        let plan = plan_chunks(&planned(&names, &[(0, 5), (0, 5)]), 2048);
        assert_eq!(plan.chunks.len(), 1);
        assert_eq!(plan.chunks[0].reads, 2);
    }

    #[test]
    fn simulation_counts_requests_and_rejects_random_orders() {
        let names = names();
        let plan = plan_chunks(&planned(&names, &sequential_order()), 2048);
        assert_eq!(simulate(&plan, 2), (9, 0));
        assert_eq!(simulate(&plan, 0), (0, 30));
        let plan = plan_chunks(&planned(&names, &interleaved_order()), 2048);
        let (gets, direct) = simulate(&plan, 2);
        assert!(2 * (gets + direct) > 30, "{gets} + {direct}");
        // With room for every chunk it streams again.
        assert_eq!(simulate(&plan, 9), (9, 0));
    }

    /// A store over a fresh [`MemStore`] (ranges above `fail_above` bytes fail) with `order`
    /// announced.
    fn planned_store(
        fail_above: usize,
        order: &[(usize, usize)],
    ) -> (Arc<MemStore>, StreamedShardStore) {
        let remote = MemStore::new(fail_above);
        let store = StreamedShardStore::new(remote.clone(), SETTINGS);
        store.will_read(&planned(&names(), order));
        (remote, store)
    }

    /// Reads member `m` of shard `s` through `store` and checks its bytes.
    fn read_checked(
        store: &StreamedShardStore,
        remote: &MemStore,
        (s, m): (usize, usize),
        buf: &mut Vec<u8>,
    ) {
        store
            .read_range_into(&shard(s), m as u64 * SPACING, LEN as usize, buf)
            .unwrap();
        assert_eq!(*buf, remote.member((s, m)), "{s}:{m}");
    }

    /// [`read_checked`] for every member of `order`, in order.
    fn read_all_checked(store: &StreamedShardStore, remote: &MemStore, order: &[(usize, usize)]) {
        let mut buf = Vec::new();
        for &sm in order {
            read_checked(store, remote, sm, &mut buf);
        }
    }

    /// Member-major across shards: every read lands in another shard's chunk.
    fn interleaved_order() -> Vec<(usize, usize)> {
        (0..MEMBERS)
            .flat_map(|m| (0..SHARDS).map(move |s| (s, m)))
            .collect()
    }

    #[test]
    fn a_sequential_order_is_read_in_chunk_gets_with_bounded_memory() {
        let order = sequential_order();
        let (remote, store) = planned_store(usize::MAX, &order);
        read_all_checked(&store, &remote, &order);
        let req = remote.requests();
        assert_eq!(req.len(), 9, "{req:?}");
        assert!(req.iter().all(|r| r.2 > LEN as usize), "{req:?}");
        let c = store.counts();
        assert_eq!((c.served, c.direct, c.chunk_gets), (30, 0, 9));
        assert!(c.peak_chunks <= 2, "{c:?}");
        assert_eq!(c.chunk_bytes, 3 * (2 * (3 * SPACING + LEN) + SPACING + LEN));
    }

    /// The worker's side of a streamed read is a copy into its reused buffer: no allocation
    /// per sample (chunk downloads allocate on the fetcher threads, once per chunk).
    #[test]
    fn reads_served_from_chunks_allocate_nothing() {
        let order = sequential_order();
        let (remote, store) = planned_store(usize::MAX, &order);
        let names = names();
        let mut buf = Vec::with_capacity(LEN as usize);
        let ((), allocations) = crate::alloc_count::allocations_in(|| {
            for &(s, m) in &order {
                store
                    .read_range_into(&names[s], m as u64 * SPACING, LEN as usize, &mut buf)
                    .unwrap();
            }
        });
        assert_eq!(allocations, 0);
        assert_eq!(store.counts().served, 30);
        assert_eq!(buf, remote.member(*order.last().unwrap()));
    }

    #[test]
    fn concurrent_readers_get_the_right_bytes() {
        let order = Arc::new(sequential_order());
        let (remote, store) = planned_store(usize::MAX, &order);
        let store = Arc::new(store);
        let next = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (store, order, next, remote) =
                    (store.clone(), order.clone(), next.clone(), remote.clone());
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    while let Some(&sm) = order.get(next.fetch_add(1, Ordering::SeqCst)) {
                        read_checked(&store, &remote, sm, &mut buf);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // How many reads a stalled thread pushes past the window depends on scheduling; the
        // bytes, the total and the memory bound do not.
        let c = store.counts();
        assert_eq!(c.served + c.direct, 30);
        assert!(c.chunk_gets <= 9, "{c:?}");
        assert!(c.peak_chunks <= 2, "{c:?}");
    }

    #[test]
    fn stragglers_and_unannounced_reads_get_ranged_gets_of_their_own() {
        let order = sequential_order();
        let (remote, store) = planned_store(usize::MAX, &order);
        // The first planned read comes last: by then its chunk has been passed.
        read_all_checked(&store, &remote, &order[1..]);
        let mut buf = Vec::new();
        read_checked(&store, &remote, order[0], &mut buf);
        // A second read of a member whose chunk was served completely.
        read_checked(&store, &remote, (0, 0), &mut buf);
        // A range nobody announced.
        store
            .read_range_into(&shard(1), 300, LEN as usize, &mut buf)
            .unwrap();
        assert_eq!(buf, remote.objects[&shard(1)][300..300 + LEN as usize]);
        let c = store.counts();
        assert_eq!((c.served, c.direct), (29, 3), "{c:?}");
        let direct: Vec<_> = remote
            .requests()
            .into_iter()
            .filter(|r| r.2 == LEN as usize)
            .collect();
        assert_eq!(direct.len(), 3, "{direct:?}");
    }

    #[test]
    fn a_random_order_is_not_streamed() {
        let order = interleaved_order();
        let (remote, store) = planned_store(usize::MAX, &order);
        read_all_checked(&store, &remote, &order);
        assert_eq!(store.counts().chunk_gets, 0);
        assert_eq!(remote.requests().len(), 30);
    }

    #[test]
    fn a_failed_chunk_get_falls_back_to_member_reads() {
        let order = sequential_order();
        let (remote, store) = planned_store(LEN as usize, &order);
        read_all_checked(&store, &remote, &order);
        let c = store.counts();
        assert_eq!((c.served, c.direct, c.chunk_gets), (0, 30, 0), "{c:?}");
    }

    #[test]
    fn a_new_plan_replaces_the_old_one_mid_way() {
        let order = sequential_order();
        let (remote, store) = planned_store(usize::MAX, &order);
        read_all_checked(&store, &remote, &order[..7]);
        // The next epoch: the same samples, shards in reverse order.
        let next: Vec<(usize, usize)> = order.iter().rev().copied().collect();
        store.will_read(&planned(&names(), &next));
        read_all_checked(&store, &remote, &next);
        // Chunk GETs of the old plan still in flight are dropped; the new one streams fully.
        let c = store.counts();
        assert_eq!((c.served, c.direct), (37, 0), "{c:?}");
    }

    #[test]
    fn dropping_the_store_stops_its_fetchers() {
        let (_, store) = planned_store(usize::MAX, &sequential_order());
        let shared = Arc::downgrade(&store.shared);
        drop(store);
        let t0 = Instant::now();
        while shared.upgrade().is_some() {
            assert!(t0.elapsed() < Duration::from_secs(10), "fetchers still run");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
