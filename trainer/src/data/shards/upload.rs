//! Uploading a packed directory to `s3://`, `gs://` or `az://` bucket/prefix: every shard, then the index last,
//! so a reader that finds `shard-index.json` under the prefix finds all its shards too.
//!
//! Resumable: a shard already in the bucket with the index's size and the index's sha256 in
//! its `x-amz-meta-sha256` (written by this upload) is skipped, one HEAD per shard. An index
//! already in the bucket that differs from the new one is deleted before any shard is
//! replaced, so a reader never pairs an old index with new shards.
use super::{ShardIndexFile, INDEX_FILE};
use crate::data::data_error::DataError;
use crate::data::object_store::Remote;
use ::object_store::path::Path as ObjPath;
use ::object_store::{
    Attribute, Attributes, GetOptions, ObjectStoreExt, PutMultipartOptions, PutOptions,
    WriteMultipart,
};
use std::io::Read;
use std::path::Path;

/// The user metadata key holding a shard's hex sha256.
pub const SHA256_METADATA: &str = "sha256";
/// Shards larger than this go up as multipart uploads (S3 caps a single PUT at 5 GB).
pub const MULTIPART_THRESHOLD: u64 = 64 << 20;
const PART_SIZE: usize = 16 << 20;

#[derive(Debug, Clone)]
pub enum UploadEvent {
    /// Already in the bucket with the same size and checksum.
    Skipped {
        shard: usize,
        bytes: u64,
    },
    Uploaded {
        shard: usize,
        bytes: u64,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UploadSummary {
    pub shards: usize,
    pub uploaded_shards: usize,
    pub skipped_shards: usize,
    pub uploaded_bytes: u64,
    /// False if the identical index was already there.
    pub index_uploaded: bool,
}

/// The size and `sha256` metadata of `rel`, or `None` if absent.
pub fn remote_state(
    remote: &Remote,
    rel: &str,
) -> Result<Option<(u64, Option<String>)>, DataError> {
    let key = ObjPath::from(remote.url.key(rel).as_str());
    let opts = GetOptions {
        head: true,
        ..Default::default()
    };
    match remote.block_on(remote.store().get_opts(&key, opts)) {
        Ok(r) => {
            let sha = r
                .attributes
                .get(&Attribute::Metadata(SHA256_METADATA.into()))
                .map(|v| v.as_ref().to_string());
            Ok(Some((r.meta.size, sha)))
        }
        Err(::object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(remote.error(remote.url.url_of(rel), "checking object", e)),
    }
}

fn upload_file(remote: &Remote, path: &Path, rel: &str, sha256: &str) -> Result<(), DataError> {
    upload_file_with(remote, path, rel, sha256, MULTIPART_THRESHOLD, PART_SIZE)
}

/// Uploads `path` as `rel` with its sha256 as metadata: one PUT up to `multipart_threshold`
/// bytes, else a multipart upload in parts of `part_size` (S3: at least 5 MiB but the last).
/// Public so tests can drive the multipart path with a small file.
pub fn upload_file_with(
    remote: &Remote,
    path: &Path,
    rel: &str,
    sha256: &str,
    multipart_threshold: u64,
    part_size: usize,
) -> Result<(), DataError> {
    let key = ObjPath::from(remote.url.key(rel).as_str());
    let url = remote.url.url_of(rel);
    let mut attributes = Attributes::new();
    attributes.insert(
        Attribute::Metadata(SHA256_METADATA.into()),
        sha256.to_string().into(),
    );
    let size = std::fs::metadata(path)
        .map_err(|e| DataError::io(path, "reading shard", e))?
        .len();
    if size <= multipart_threshold {
        let bytes = std::fs::read(path).map_err(|e| DataError::io(path, "reading shard", e))?;
        let opts = PutOptions {
            attributes,
            ..Default::default()
        };
        remote
            .block_on(remote.store().put_opts(&key, bytes.into(), opts))
            .map_err(|e| remote.error(url, "uploading shard", e))?;
        return Ok(());
    }
    let opts = PutMultipartOptions {
        attributes,
        ..Default::default()
    };
    // All of it inside the runtime: `WriteMultipart::write` spawns the part uploads as tasks.
    remote.block_on(async {
        let upload = remote
            .store()
            .put_multipart_opts(&key, opts)
            .await
            .map_err(|e| remote.error(url.clone(), "starting multipart upload", e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, part_size);
        let mut file =
            std::fs::File::open(path).map_err(|e| DataError::io(path, "reading shard", e))?;
        let mut buf = vec![0u8; part_size];
        loop {
            let n = file
                .read(&mut buf)
                .map_err(|e| DataError::io(path, "reading shard", e))?;
            if n == 0 {
                break;
            }
            writer
                .wait_for_capacity(4)
                .await
                .map_err(|e| remote.error(url.clone(), "uploading shard part", e))?;
            writer.write(&buf[..n]);
        }
        writer
            .finish()
            .await
            .map_err(|e| remote.error(url.clone(), "finishing multipart upload", e))?;
        Ok(())
    })
}

/// Uploads the finished packed directory `dir` (it must hold its index, i.e. `pack` has
/// completed) to `remote`'s prefix; the index goes up last.
pub fn upload(
    dir: &Path,
    remote: &Remote,
    on_event: &mut dyn FnMut(UploadEvent),
) -> Result<UploadSummary, DataError> {
    let index_path = dir.join(INDEX_FILE);
    let raw = std::fs::read(&index_path).map_err(|e| DataError::io(&index_path, "reading", e))?;
    let index: ShardIndexFile =
        serde_json::from_slice(&raw).map_err(|e| DataError::ShardIndex {
            path: index_path.clone(),
            reason: format!("not a shard index: {e}"),
        })?;
    let index_key = ObjPath::from(remote.url.key(INDEX_FILE).as_str());
    let old_index =
        match remote.block_on(async { remote.store().get(&index_key).await?.bytes().await }) {
            Ok(b) => Some(b),
            Err(::object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(remote.error(remote.url.url_of(INDEX_FILE), "reading", e)),
        };
    let index_same = old_index.as_deref() == Some(raw.as_slice());
    if old_index.is_some() && !index_same {
        remote
            .block_on(remote.store().delete(&index_key))
            .map_err(|e| remote.error(remote.url.url_of(INDEX_FILE), "deleting old index", e))?;
    }
    let mut summary = UploadSummary {
        shards: index.shards.len(),
        ..Default::default()
    };
    for (i, shard) in index.shards.iter().enumerate() {
        let there = remote_state(remote, &shard.file)?;
        if let Some((size, Some(sha))) = &there {
            if *size == shard.bytes && *sha == shard.sha256 {
                summary.skipped_shards += 1;
                on_event(UploadEvent::Skipped {
                    shard: i,
                    bytes: shard.bytes,
                });
                continue;
            }
        }
        upload_file(remote, &dir.join(&shard.file), &shard.file, &shard.sha256)?;
        summary.uploaded_shards += 1;
        summary.uploaded_bytes += shard.bytes;
        on_event(UploadEvent::Uploaded {
            shard: i,
            bytes: shard.bytes,
        });
    }
    if !index_same {
        remote.put(INDEX_FILE, raw)?;
        summary.index_uploaded = true;
    }
    Ok(summary)
}
