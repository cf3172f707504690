//! A store object read in byte ranges as it is consumed, never whole: a plate's object table
//! in a bucket can hold millions of rows and thousands of feature columns, of which a screen
//! needs four. A CSV is read front to back in [`RANGE`]-byte requests; a Parquet table
//! (through [`ChunkReader`]) fetches its footer and, once told which they are
//! ([`RangedObject::expect_chunks`]), each column chunk it reads in one request, nothing else.
use crate::data::object_store::Remote;
use crate::data::DataError;
use bytes::Bytes;
use parquet::file::reader::{ChunkReader, Length};
use std::collections::VecDeque;
use std::io::Read;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Bytes per request of a front-to-back read: few requests for a large table, little held.
pub const RANGE: u64 = 8 << 20;

/// One object of a store, its size known. Clones share the column chunks they expect and hold.
#[derive(Clone)]
pub struct RangedObject {
    remote: Arc<Remote>,
    /// Its key relative to `remote`'s root.
    key: String,
    size: u64,
    chunks: Arc<Mutex<Chunks>>,
}

/// The byte ranges a Parquet reader will read (its column chunks), and the last few fetched:
/// the parquet crate reads a page's header and then its data in two calls, so a chunk is
/// fetched once and served from here.
#[derive(Default)]
struct Chunks {
    expected: Vec<Range<u64>>,
    held: VecDeque<(u64, Bytes)>,
    /// Chunks held at once: the columns read side by side.
    keep: usize,
}

impl RangedObject {
    /// `key` of `remote`, asked for its size once; a missing object is an error naming it.
    pub fn open(remote: Arc<Remote>, key: &str) -> Result<Self, DataError> {
        let size = remote.head(key)?.ok_or_else(|| {
            let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such object");
            DataError::io(remote.url.url_of(key), "reading", missing)
        })?;
        Ok(Self {
            remote,
            key: key.to_string(),
            size,
            chunks: Arc::default(),
        })
    }

    /// The column chunks a Parquet read will ask for, `side_by_side` of them read in turn:
    /// each is then fetched whole in one request when first asked for.
    pub fn expect_chunks(&self, chunks: Vec<Range<u64>>, side_by_side: usize) {
        let mut c = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        c.expected = chunks;
        c.keep = side_by_side.max(1);
        c.held.clear();
    }

    /// `len` bytes at `offset` from an expected chunk holding them (fetched whole on first
    /// use), or None when no expected chunk does.
    fn chunk_bytes(&self, offset: u64, len: u64) -> Result<Option<Bytes>, DataError> {
        let mut c = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        let Some(chunk) = c
            .expected
            .iter()
            .find(|r| r.start <= offset && offset + len <= r.end)
            .cloned()
        else {
            return Ok(None);
        };
        // A chunk the metadata places past the object's end holds what there is: the parquet
        // reader then reports the short read (a damaged file), never a panic here.
        let part = |bytes: &Bytes| {
            let end = ((offset - chunk.start + len) as usize).min(bytes.len());
            let at = ((offset - chunk.start) as usize).min(end);
            bytes.slice(at..end)
        };
        if let Some((_, bytes)) = c.held.iter().find(|(start, _)| *start == chunk.start) {
            return Ok(Some(part(bytes)));
        }
        let bytes = self.range(chunk.start, chunk.end - chunk.start)?;
        if c.held.len() >= c.keep {
            c.held.pop_front();
        }
        c.held.push_back((chunk.start, bytes.clone()));
        Ok(Some(part(&bytes)))
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// `len` bytes from `offset` (clamped to the object's end).
    fn range(&self, offset: u64, len: u64) -> Result<Bytes, DataError> {
        let len = len.min(self.size.saturating_sub(offset));
        if len == 0 {
            return Ok(Bytes::new());
        }
        Ok(Bytes::from(self.remote.get_range(
            &self.key,
            offset,
            len as usize,
        )?))
    }

    /// The object from `start` to its end as a stream of [`RANGE`]-byte requests.
    pub fn reader(&self, start: u64) -> RangedRead {
        RangedRead {
            object: self.clone(),
            next: start,
            held: Bytes::new(),
        }
    }
}

/// A front-to-back read of a [`RangedObject`], one range held at a time.
pub struct RangedRead {
    object: RangedObject,
    /// The offset of the first byte not yet fetched.
    next: u64,
    held: Bytes,
}

impl Read for RangedRead {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.held.is_empty() {
            self.held = self
                .object
                .range(self.next, RANGE)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            self.next += self.held.len() as u64;
        }
        let n = out.len().min(self.held.len());
        out[..n].copy_from_slice(&self.held[..n]);
        let _ = self.held.split_to(n);
        Ok(n)
    }
}

impl Length for RangedObject {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for RangedObject {
    type T = RangedRead;

    /// A page header inside an expected chunk is read from the held chunk; elsewhere, a
    /// front-to-back read.
    fn get_read(&self, start: u64) -> parquet::errors::Result<RangedRead> {
        let external = |e: DataError| parquet::errors::ParquetError::External(Box::new(e));
        let end = {
            let c = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
            c.expected
                .iter()
                .find(|r| r.start <= start && start < r.end)
                .map(|r| r.end)
        };
        let Some(end) = end else {
            return Ok(self.reader(start));
        };
        let held = self.chunk_bytes(start, end - start).map_err(external)?;
        Ok(RangedRead {
            object: self.clone(),
            next: end,
            held: held.unwrap_or_default(),
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let external = |e: DataError| parquet::errors::ParquetError::External(Box::new(e));
        match self.chunk_bytes(start, length as u64).map_err(external)? {
            Some(bytes) => Ok(bytes),
            None => self.range(start, length as u64).map_err(external),
        }
    }
}
