//! zarrs' async storage over an `object_store` client that reads a byte range in one request.
//!
//! `zarrs_object_store` 0.7 answers every partial read with a HEAD (for the object's size)
//! followed by a ranged GET, and zarrs reads partially every chunk that a region covers only in
//! part (compressed or not): so a cell's box cost two requests per chunk. `object_store`'s GET
//! takes open-ended and suffix ranges itself, so here each range is one GET, all ranges of a
//! call in flight at once; a missing object is `None`, as zarrs expects.
use ::object_store::path::Path as ObjPath;
use ::object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use futures_util::future::try_join_all;
use futures_util::StreamExt;
use zarrs::storage::byte_range::{ByteRange, ByteRangeIterator};
use zarrs::storage::{
    AsyncMaybeBytesIterator, AsyncReadableStorageTraits, Bytes, MaybeBytes, StorageError, StoreKey,
};

/// An `object_store` client served to zarrs, one GET per byte range.
pub(super) struct RangedObjectStore<T>(pub T);

impl<T: ObjectStore> RangedObjectStore<T> {
    /// `range` of the object at `key` (all of it for `None`); `None` if there is no object.
    async fn read(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
    ) -> Result<MaybeBytes, StorageError> {
        let (range, want) = match range {
            None | Some(ByteRange::FromStart(0, None)) => (None, None),
            Some(ByteRange::FromStart(_, Some(0))) | Some(ByteRange::Suffix(0)) => {
                return Ok(Some(Bytes::new()));
            }
            Some(ByteRange::FromStart(o, None)) => (Some(GetRange::Offset(o)), None),
            Some(ByteRange::FromStart(o, Some(n))) => (Some(GetRange::Bounded(o..o + n)), Some(n)),
            Some(ByteRange::Suffix(n)) => (Some(GetRange::Suffix(n)), None),
        };
        let opts = GetOptions {
            range,
            ..GetOptions::default()
        };
        let fail = |e: ::object_store::Error| StorageError::Other(format!("{key}: {e}"));
        let got = match self.0.get_opts(&ObjPath::from(key.as_str()), opts).await {
            Ok(got) => got,
            Err(::object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(fail(e)),
        };
        let bytes = got.bytes().await.map_err(fail)?;
        match want {
            Some(n) if bytes.len() as u64 != n => Err(StorageError::Other(format!(
                "{key}: asked for {n} bytes, got {}",
                bytes.len()
            ))),
            _ => Ok(Some(bytes)),
        }
    }
}

#[async_trait::async_trait]
impl<T: ObjectStore> AsyncReadableStorageTraits for RangedObjectStore<T> {
    async fn get(&self, key: &StoreKey) -> Result<MaybeBytes, StorageError> {
        self.read(key, None).await
    }

    async fn get_partial_many<'a>(
        &'a self,
        key: &StoreKey,
        byte_ranges: ByteRangeIterator<'a>,
    ) -> Result<AsyncMaybeBytesIterator<'a>, StorageError> {
        let ranges: Vec<ByteRange> = byte_ranges.collect();
        let got = try_join_all(ranges.into_iter().map(|r| self.read(key, Some(r)))).await?;
        let Some(all) = got.into_iter().collect::<Option<Vec<Bytes>>>() else {
            return Ok(None);
        };
        Ok(Some(
            futures_util::stream::iter(all.into_iter().map(Ok)).boxed(),
        ))
    }

    async fn size_key(&self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        match self.0.head(&ObjPath::from(key.as_str())).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(::object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(StorageError::Other(format!("{key}: {e}"))),
        }
    }

    fn supports_get_partial(&self) -> bool {
        true
    }
}
