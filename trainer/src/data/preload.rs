//! `trainer data preload`: copy an `s3://` (`gs://`, `az://`) dataset to a local directory (FSx, NVMe) before
//! a run, as the AWS setup did with `lfs hsm_restore` or an NVMe copy job, but resumable:
//! every file is written as a verified entry (see [`cache`](super::cache)), and a rerun skips
//! the entries that verify, so an interrupted copy continues where it stopped. The copy is
//! the dataset's tree, usable as `data.dataset_dir` with the same index and splits.
use super::cache::{is_verified, safe_rel, write_verified};
use super::data_error::DataError;
use super::object_store::{Remote, StoreUrl};
use crate::config::DataSection;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PreloadSummary {
    pub objects: u64,
    /// Downloaded in this run.
    pub copied: u64,
    /// Already present and verified.
    pub skipped: u64,
    pub bytes_copied: u64,
}

/// Copies every object below `url` (`data.dataset_dir`) to `to/{key relative to the prefix}`
/// with `jobs` concurrent downloads, through the client `data.object_store` configures.
pub fn preload(
    url: &StoreUrl,
    data: &DataSection,
    to: &Path,
    jobs: usize,
    show_progress: bool,
) -> Result<PreloadSummary, DataError> {
    let remote = Remote::open(url, &data.object_store)?;
    let mut objects = remote.list()?;
    objects.retain(|o| !o.rel.ends_with('/'));
    if let Some(bad) = objects.iter().find(|o| !safe_rel(&o.rel)) {
        return Err(DataError::StoreConfig {
            url: remote.url.url_of(&bad.rel),
            reason: "key has an empty, '.' or '..' component; it cannot be copied to a file".into(),
        });
    }
    let total: u64 = objects.iter().map(|o| o.size).sum();
    let bar = if show_progress {
        indicatif::ProgressBar::new(total)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(format!("{url} -> {}", to.display()));
    let next = AtomicUsize::new(0);
    let (copied, skipped, bytes) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let failed = AtomicBool::new(false);
    let first_err: Mutex<Option<DataError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                while !failed.load(Ordering::Relaxed) {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(o) = objects.get(k) else { return };
                    let path = to.join(&o.rel);
                    let r = if is_verified(&path, Some(o.size)) {
                        skipped.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    } else {
                        remote.get(&o.location, Some(o.size)).and_then(|b| {
                            write_verified(&path, &b)?;
                            copied.fetch_add(1, Ordering::Relaxed);
                            bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
                            Ok(())
                        })
                    };
                    match r {
                        Ok(()) => bar.inc(o.size),
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            first_err
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    bar.finish_and_clear();
    if let Some(e) = first_err.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    Ok(PreloadSummary {
        objects: objects.len() as u64,
        copied: copied.into_inner(),
        skipped: skipped.into_inner(),
        bytes_copied: bytes.into_inner(),
    })
}
