//! TensorBoard scalar event files (`events.out.tfevents.*`).
//!
//! The file is a sequence of TFRecords, each
//! `u64 length (LE) | masked crc32c(length) | Event bytes | masked crc32c(Event bytes)`,
//! beginning with an `Event { file_version: "brain.Event:2" }`. It is append-only
//! and records are only ever handed to the OS whole, so a crash leaves at worst
//! a partial last record, which TensorBoard's reader treats as end-of-file.

use super::crc32c::masked_crc32c;
use super::{proto, MetricsError};
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Version string TensorBoard expects in the first record.
const FILE_VERSION: &str = "brain.Event:2";

/// Buffered bytes that trigger a write without an explicit [`TensorBoardWriter::flush`]:
/// bounds memory while keeping writes to one syscall per many steps.
const AUTO_FLUSH_BYTES: usize = 64 * 1024;

/// If a flush fails (disk full) and this much is still pending, the pending
/// records are dropped: losing some scalars beats growing without bound while
/// training continues.
const MAX_PENDING_BYTES: usize = 16 * 1024 * 1024;

/// Per-process file counter, the `{n}` of the file name, so two writers
/// created within the same second do not collide.
static FILE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writer of one TensorBoard event file holding scalar summaries.
///
/// Records are buffered in memory and written on [`flush`](Self::flush) (call
/// it at epoch end), when the buffer exceeds 64 KiB, and on drop. A failed
/// write is rolled back to the last complete record so that a later successful
/// flush never appends after a torn record (which would hide everything after
/// it from TensorBoard).
#[derive(Debug)]
pub struct TensorBoardWriter {
    path: PathBuf,
    file: File,
    /// Complete, framed records not yet handed to the OS.
    pending: Vec<u8>,
    /// Length of the file up to the end of its last complete record.
    committed: u64,
}

impl TensorBoardWriter {
    /// Creates `dir` if needed and a new event file in it named
    /// `events.out.tfevents.{unix_seconds}.{hostname}.{pid}.{n}`, as TensorBoard
    /// and PyTorch name them (TensorBoard orders a run's files by name). The
    /// version record is written immediately so the run shows up at once.
    pub fn create(dir: &Path) -> Result<Self, MetricsError> {
        std::fs::create_dir_all(dir).map_err(MetricsError::io(dir, "creating log directory"))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let host = hostname();
        let pid = std::process::id();
        let (path, file) = loop {
            let n = FILE_COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!(
                "events.out.tfevents.{}.{host}.{pid}.{n}",
                now.as_secs()
            ));
            match OpenOptions::new().append(true).create_new(true).open(&path) {
                Ok(file) => break (path, file),
                // Another writer (e.g. a previous run with a recycled pid) got there first.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(MetricsError::io(path, "creating event file")(e)),
            }
        };
        let mut writer = TensorBoardWriter {
            path,
            file,
            pending: Vec::new(),
            committed: 0,
        };
        writer.push_record(&proto::file_version_event(now.as_secs_f64(), FILE_VERSION));
        writer.flush()?;
        Ok(writer)
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records one scalar at `step`, stamped with the current wall time.
    pub fn add_scalar(&mut self, tag: &str, value: f32, step: i64) -> Result<(), MetricsError> {
        self.add_scalars(step, &[(tag, value)])
    }

    /// Records several scalars at `step` as one Event (one record, one wall
    /// time), which is how a training step's loss, learning rate, etc. belong
    /// together. Nothing is written for an empty slice.
    pub fn add_scalars(&mut self, step: i64, scalars: &[(&str, f32)]) -> Result<(), MetricsError> {
        self.add_scalars_at(step, unix_now(), scalars)
    }

    /// [`add_scalars`](Self::add_scalars) with an explicit wall time in seconds
    /// since the Unix epoch, e.g. the time a step started rather than when its
    /// metrics were reduced.
    pub fn add_scalars_at(
        &mut self,
        step: i64,
        wall_time: f64,
        scalars: &[(&str, f32)],
    ) -> Result<(), MetricsError> {
        if scalars.is_empty() {
            return Ok(());
        }
        self.push_record(&proto::scalars_event(wall_time, step, scalars));
        if self.pending.len() >= AUTO_FLUSH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Hands all buffered records to the OS (they then survive a crash of this
    /// process, not necessarily of the node; see [`sync`](Self::sync)).
    pub fn flush(&mut self) -> Result<(), MetricsError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        match self.file.write_all(&self.pending) {
            Ok(()) => {
                self.committed += self.pending.len() as u64;
                self.pending.clear();
                Ok(())
            }
            Err(e) => {
                // Cut a torn record off so later records stay readable; the
                // pending ones are retried on the next flush. Best effort: if
                // this fails too, the file is no worse than after a crash.
                let _ = self.file.set_len(self.committed);
                if self.pending.len() > MAX_PENDING_BYTES {
                    self.pending.clear();
                }
                Err(MetricsError::io(&self.path, "writing event file")(e))
            }
        }
    }

    /// [`flush`](Self::flush), then fsync, so the records survive a node crash.
    pub fn sync(&mut self) -> Result<(), MetricsError> {
        self.flush()?;
        self.file
            .sync_data()
            .map_err(MetricsError::io(&self.path, "syncing event file"))
    }

    /// Frames `data` as one TFRecord into the pending buffer.
    fn push_record(&mut self, data: &[u8]) {
        let len = (data.len() as u64).to_le_bytes();
        self.pending.extend_from_slice(&len);
        self.pending
            .extend_from_slice(&masked_crc32c(&len).to_le_bytes());
        self.pending.extend_from_slice(data);
        self.pending
            .extend_from_slice(&masked_crc32c(data).to_le_bytes());
    }
}

impl Drop for TensorBoardWriter {
    /// Flushes what is buffered; an error here cannot be reported, so callers
    /// who care call [`TensorBoardWriter::flush`] themselves first.
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The host name for the file name, without a libc dependency: Linux exposes it
/// in /proc; `HOSTNAME` and "localhost" are fallbacks. Path separators and
/// whitespace are replaced so the name stays one path component.
pub(crate) fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c == '/' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if clean.is_empty() {
        "localhost".to_owned()
    } else {
        clean
    }
}
