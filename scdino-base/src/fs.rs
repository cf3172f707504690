//! Durable file replacement. Every output of a run (checkpoints, mean/std, features, kNN
//! results, cache entries, shards, logs rewritten on resume, generated scripts) goes through
//! [`write_atomic`]: a reader sees the old file or the new one, never a torn one, and once it
//! returns the new one survives a crash of the machine.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to a temporary file next to `path`, fsyncs it, renames it over `path` and
/// fsyncs the folder (so the rename itself is on disk). The parent folder must exist. On error
/// the temporary file is removed and `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_parts(path, &[bytes])
}

/// [`write_atomic`] of the concatenation of `parts`, without building it (a large text file
/// formatted in chunks by several threads).
pub fn write_atomic_parts<B: AsRef<[u8]>>(path: &Path, parts: &[B]) -> std::io::Result<()> {
    let tmp = temp_path(path)?;
    let result = (|| {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        for part in parts {
            f.write_all(part.as_ref())?;
        }
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    sync_dir(parent(path));
    Ok(())
}

/// Best effort: some filesystems (and FUSE mounts of object stores) refuse fsync on a folder.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

fn parent(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// `dir/.name.tmp.<pid>.<n>`: hidden, unique per process and call (two threads may replace the
/// same file), and never ending in an extension an indexer picks up (`.tiff`, `.safetensors`).
fn temp_path(path: &Path) -> std::io::Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} has no file name", path.display()),
        )
    })?;
    Ok(parent(path).join(format!(
        ".{}.tmp.{}.{}",
        name.to_string_lossy(),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.txt"]);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        write_atomic(&path, b"old").unwrap();
        // A folder in the way of the rename: the write fails and `a.txt/` stays as it was.
        let blocked = dir.path().join("b");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("x"), b"").unwrap();
        assert!(write_atomic(&blocked, b"new").is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert!(blocked.join("x").exists());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(names.is_empty(), "{names:?}");
    }

    #[test]
    fn a_missing_folder_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = write_atomic(&dir.path().join("no/such/a.txt"), b"x").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
}
