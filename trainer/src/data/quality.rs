//! Data-quality warnings: a padded (constant) stain or a NaN pixel shows up in thousands of
//! images, so each kind of problem is reported once per process, naming the channel and the
//! first file it was seen in, instead of once per image per epoch.
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static REPORTED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// The loader calls [`constant_channel`] / [`nonfinite_pixels`] for every affected image (a
/// padded stain is in all of them): after the first report these flags answer with one
/// atomic load, without the lock or a key allocation.
const FAST_CHANNELS: usize = 64;
static CONSTANT_REPORTED: [AtomicBool; FAST_CHANNELS] =
    [const { AtomicBool::new(false) }; FAST_CHANNELS];
static NONFINITE_REPORTED: AtomicBool = AtomicBool::new(false);

/// Prints `message()` as a warning the first time `key` is seen in this process. Returns
/// whether it printed.
pub fn warn_once(key: &str, message: impl FnOnce() -> String) -> bool {
    let mut seen = REPORTED.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.insert(key.to_owned()) {
        return false;
    }
    tracing::warn!("{}", message());
    true
}

/// `"2 (DAPI)"`, or `"2"` when the config names fewer channels.
pub fn channel_label(channel: usize, names: &[String]) -> String {
    match names.get(channel) {
        Some(name) => format!("{channel} ({name})"),
        None => channel.to_string(),
    }
}

/// One image had a constant channel (scaled to 0 where scDINO made the image NaN).
pub fn constant_channel(channel: usize, names: &[String], file: &Path) {
    let flag = CONSTANT_REPORTED.get(channel);
    if flag.is_some_and(|f| f.load(Ordering::Relaxed)) {
        return;
    }
    if let Some(f) = flag {
        f.store(true, Ordering::Relaxed);
    }
    warn_once(&format!("constant-channel/{channel}"), || {
        format!(
            "channel {} is constant in {} (first seen; other images are not reported): it is \
             scaled to 0 there instead of scDINO's NaN, and carries no information in such images",
            channel_label(channel, names),
            file.display()
        )
    });
}

/// One image had NaN or infinite pixels (left out of min/max and scaled to 0).
pub fn nonfinite_pixels(count: usize, file: &Path) {
    if NONFINITE_REPORTED.swap(true, Ordering::Relaxed) {
        return;
    }
    warn_once("nonfinite-pixels", || {
        format!(
            "{} has {count} NaN or infinite pixel(s) (first such image; others are not \
             reported): they are left out of the min–max range and scaled to 0, where scDINO \
             dropped or replaced the whole image",
            file.display()
        )
    });
}

/// A selected channel whose standard deviation over the dataset is zero: normalising by it
/// would divide by zero, so it is normalised with std 1 (every pixel becomes `-mean`).
pub fn zero_std_channel(channel: usize, names: &[String]) {
    warn_once(&format!("zero-std/{channel}"), || {
        format!(
            "channel {} has standard deviation 0 over the mean/std subset (a constant or \
             empty stain): it is normalised with std 1 and carries no information; consider \
             leaving it out of data.channel_combinations",
            channel_label(channel, names)
        )
    });
}
