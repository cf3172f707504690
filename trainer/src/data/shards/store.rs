//! Where shard bytes live: the reader needs only whole small objects (the index) and byte
//! ranges of large ones, which both local files (`pread`) and object stores (ranged GET)
//! provide. A remote store plugs in by implementing [`ShardStore`].
use crate::data::data_error::DataError;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// One member read announced ahead of time: `len` bytes of object `name` from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedRead<'a> {
    pub name: &'a str,
    pub offset: u64,
    pub len: u64,
}

pub trait ShardStore: Send + Sync {
    /// A whole (small) object, e.g. the index.
    fn read_all(&self, name: &str) -> Result<Vec<u8>, DataError>;
    /// `len` bytes of object `name` from `offset`; fewer bytes than asked is an error.
    fn read_range(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, DataError> {
        let mut buf = Vec::new();
        self.read_range_into(name, offset, len, &mut buf)?;
        Ok(buf)
    }
    /// [`Self::read_range`] into `buf`, reusing its allocation where the store can.
    fn read_range_into(
        &self,
        name: &str,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), DataError>;
    /// The reads about to come, in order (one epoch of one rank); a store may fetch ahead.
    /// A later call replaces the plan.
    fn will_read(&self, _reads: &[PlannedRead<'_>]) {}
    /// Where object `name` is, for messages (a path or URL).
    fn locate(&self, name: &str) -> PathBuf;
    fn describe(&self) -> String;
    /// Transfer counters for the log, for stores that have any.
    fn report(&self) -> Option<String> {
        None
    }
}

/// Shards in a local or shared (FSx, NFS) directory. Files are opened once and read with
/// positioned reads, so loader threads never contend on a file cursor.
#[derive(Debug)]
pub struct LocalShardStore {
    dir: PathBuf,
    open: Mutex<HashMap<String, Arc<File>>>,
}

impl LocalShardStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            open: Mutex::new(HashMap::new()),
        }
    }

    fn file(&self, name: &str) -> Result<Arc<File>, DataError> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = open.get(name) {
            return Ok(f.clone());
        }
        let path = self.dir.join(name);
        let f = Arc::new(File::open(&path).map_err(|e| DataError::io(&path, "opening shard", e))?);
        open.insert(name.to_string(), f.clone());
        Ok(f)
    }
}

impl ShardStore for LocalShardStore {
    fn read_all(&self, name: &str) -> Result<Vec<u8>, DataError> {
        let path = self.dir.join(name);
        std::fs::read(&path).map_err(|e| DataError::io(&path, "reading", e))
    }

    fn read_range_into(
        &self,
        name: &str,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), DataError> {
        let f = self.file(name)?;
        buf.clear();
        buf.resize(len, 0);
        f.read_exact_at(buf, offset)
            .map_err(|e| DataError::io(self.dir.join(name), "reading shard member", e))
    }

    fn locate(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }
}

/// Shards under an `s3://`, `gs://` or `az://` bucket/prefix: the index by one GET, sample bytes by ranged GETs
/// (retried like every other S3 request, per `data.object_store`), so no shard is ever downloaded
/// whole and any sample can be read from any loader thread.
pub struct RemoteShardStore {
    remote: crate::data::object_store::Remote,
}

impl RemoteShardStore {
    pub fn new(remote: crate::data::object_store::Remote) -> Self {
        Self { remote }
    }

    /// Opens `url` with the `data.object_store` client settings.
    pub fn open(
        url: &crate::config::StoreUrl,
        s3: &crate::config::ObjectStoreSection,
    ) -> Result<Self, DataError> {
        Ok(Self::new(crate::data::object_store::Remote::open(url, s3)?))
    }

    /// True if the prefix holds a shard index (one HEAD).
    pub fn is_packed(&self) -> Result<bool, DataError> {
        Ok(self.remote.head(super::INDEX_FILE)?.is_some())
    }

    pub fn remote(&self) -> &crate::data::object_store::Remote {
        &self.remote
    }
}

impl ShardStore for RemoteShardStore {
    fn read_all(&self, name: &str) -> Result<Vec<u8>, DataError> {
        let key = ::object_store::path::Path::from(self.remote.url.key(name).as_str());
        self.remote.get(&key, None)
    }

    /// A ranged GET arrives in a buffer of its own.
    fn read_range_into(
        &self,
        name: &str,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), DataError> {
        *buf = self.remote.get_range(name, offset, len)?;
        Ok(())
    }

    fn locate(&self, name: &str) -> PathBuf {
        PathBuf::from(self.remote.url.url_of(name))
    }

    fn describe(&self) -> String {
        self.remote.url.root()
    }
}
