//! Which source reads a dataset: the one place that knows every kind (local folder, packed
//! shards, S3 objects or shards, each with or without the node-local cache), so the sources
//! themselves know only the [`ImageSource`] trait and not each other.
use super::data_error::DataError;
use super::image_source::{LocalSource, SharedSource};
use crate::config::StoreUrl;
use std::sync::Arc;

/// Opens the dataset named by `data.dataset_dir`: `s3://bucket/prefix` holding packed shards
/// (`data.format: shards`, or `auto` and a `shard-index.json` object under the prefix, one
/// HEAD) is read by ranged GETs through [`RemoteShardStore`], in chunks ahead of a sequential
/// order ([`StreamedShardStore`]) or, with `data.cache.dir`, through a [`CachedShardStore`]
/// that caches whole shards; any other `s3://` prefix streams
/// through [`ObjectStoreSource`](super::stream::ObjectStoreSource); a packed directory (see
/// [`super::shards`]) when `data.format` says so or, with `auto`, when it holds a shard index;
/// otherwise the `ImageFolder` tree on a local or shared (FSx) file system. With
/// `data.cache.dir`, every source goes through the node-local cache (S3 objects, and local
/// or S3 shards cached whole).
pub fn open_source(data: &crate::config::DataSection) -> Result<SharedSource, DataError> {
    use super::shards::{is_packed_dir, CachedShardStore, LocalShardStore, ShardSource};
    use crate::config::{DataFormat, DatasetLocation};
    if let Some(screen) = &data.screen {
        return Ok(Arc::new(super::screen::open::open_screen(data, screen)?));
    }
    let dataset_dir = match &data.dataset_dir {
        DatasetLocation::Local(dir) => dir,
        DatasetLocation::Remote(url) => return open_remote(url, data),
    };
    let packed = match data.format {
        DataFormat::Folder => false,
        DataFormat::Shards => true,
        DataFormat::Auto => is_packed_dir(dataset_dir),
    };
    // With `data.cache.dir`, a local or FSx dataset is cached under `{cache}/fs/{its path}`.
    let cache = match &data.cache.dir {
        Some(dir) => {
            let absolute = std::path::absolute(dataset_dir)
                .map_err(|e| DataError::io(dataset_dir, "resolving", e))?;
            let below: std::path::PathBuf = absolute
                .components()
                .filter(|c| matches!(c, std::path::Component::Normal(_)))
                .collect();
            Some(super::cache::NodeCache::open(
                dir,
                &dir.join("fs").join(below),
                data.cache.max_bytes,
                super::stream::processes_per_node(),
            )?)
        }
        None => None,
    };
    if packed {
        let store: Arc<dyn super::shards::ShardStore> = Arc::new(LocalShardStore::new(dataset_dir));
        let store = match cache {
            Some(cache) => Arc::new(CachedShardStore::open(store, cache)?),
            None => store,
        };
        return Ok(Arc::new(ShardSource::open(store, data.label_folder_depth)?));
    }
    let files = LocalSource::open(dataset_dir, data.label_folder_depth)?;
    Ok(match cache {
        Some(cache) => Arc::new(super::local_cache::CachedLocalSource::new(files, cache)?),
        None => Arc::new(files),
    })
}

/// [`open_source`] for a dataset below `url`: its shards, or its objects one by one.
fn open_remote(
    url: &StoreUrl,
    data: &crate::config::DataSection,
) -> Result<SharedSource, DataError> {
    use super::shards::{
        CachedShardStore, RemoteShardStore, ShardSource, StreamSettings, StreamedShardStore,
    };
    use crate::config::DataFormat;
    let packed = match data.format {
        DataFormat::Folder => None,
        DataFormat::Shards => Some(RemoteShardStore::open(url, &data.object_store)?),
        DataFormat::Auto => {
            let store = RemoteShardStore::open(url, &data.object_store)?;
            store.is_packed()?.then_some(store)
        }
    };
    let Some(store) = packed else {
        return Ok(Arc::new(super::stream::ObjectStoreSource::open(url, data)?));
    };
    let store: Arc<dyn super::shards::ShardStore> = match &data.cache.dir {
        Some(dir) => {
            let cache = super::cache::NodeCache::open(
                dir,
                &url.cache_dir(dir),
                data.cache.max_bytes,
                super::stream::processes_per_node(),
            )?;
            Arc::new(CachedShardStore::open(Arc::new(store), cache)?)
        }
        None => Arc::new(StreamedShardStore::new(
            Arc::new(store),
            StreamSettings {
                chunk_bytes: data.object_store.shard_chunk_bytes,
                chunks_ahead: data.object_store.shard_chunks_ahead,
                fetchers: data.object_store.max_concurrency,
            },
        )),
    };
    Ok(Arc::new(ShardSource::open(store, data.label_folder_depth)?))
}
