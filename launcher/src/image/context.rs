//! The build context as the engine receives it: the source tree minus what `.dockerignore`
//! excludes, plus the files the launcher adds (the generated Containerfile, a baked run config,
//! the prebuilt binaries), written as one tar and streamed to the engine while it is written,
//! so a context with a gigabyte of libraries never sits in memory.
use super::ignore::DockerIgnore;
use super::ImageError;
use bytes::Bytes;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One entry of the context: where it comes from and its name inside the tar.
enum Source {
    File(PathBuf),
    Bytes(Vec<u8>),
}

pub struct Context {
    entries: Vec<(String, Source)>,
}

impl Context {
    /// Every file and symlink under `root` that `.dockerignore` keeps, in sorted order.
    pub fn scan(root: &Path) -> Result<Self, ImageError> {
        let ignore = DockerIgnore::load(root)?;
        let mut entries = Vec::new();
        walk(root, "", &ignore, &mut entries)?;
        Ok(Self { entries })
    }

    /// A file the launcher writes (replaces a scanned file of the same name).
    pub fn add_bytes(&mut self, name: &str, data: Vec<u8>) {
        self.entries.retain(|(n, _)| n != name);
        self.entries.push((name.to_string(), Source::Bytes(data)));
    }

    /// Every file under `dir` as `prefix/…`, whatever `.dockerignore` says.
    pub fn add_tree(&mut self, prefix: &str, dir: &Path) -> Result<(), ImageError> {
        self.entries
            .retain(|(n, _)| !n.starts_with(&format!("{prefix}/")));
        walk(dir, prefix, &DockerIgnore::default(), &mut self.entries)
    }

    /// Writes the tar: regular files with their mode and size, symlinks as links; owner, group
    /// and times fixed so that an unchanged tree gives the same bytes (and the same cache).
    pub fn write_tar<W: Write>(&self, out: W) -> Result<W, ImageError> {
        let mut tar = tar::Builder::new(out);
        tar.mode(tar::HeaderMode::Deterministic);
        tar.follow_symlinks(false);
        // The engine's tar reader rejects GNU sparse entries (type 'S'), and staged libraries
        // copied with `cp` can be sparse.
        tar.sparse(false);
        for (name, src) in &self.entries {
            let res = match src {
                Source::File(path) => tar.append_path_with_name(path, name),
                Source::Bytes(data) => {
                    let mut h = tar::Header::new_gnu();
                    h.set_size(data.len() as u64);
                    h.set_mode(0o644);
                    h.set_mtime(0);
                    h.set_entry_type(tar::EntryType::Regular);
                    tar.append_data(&mut h, name, data.as_slice())
                }
            };
            res.map_err(|e| ImageError::Context {
                name: name.clone(),
                message: e.to_string(),
            })?;
        }
        tar.into_inner().map_err(|e| ImageError::Context {
            name: "<end of archive>".into(),
            message: e.to_string(),
        })
    }

    /// The tar as a stream of chunks for the engine, written on a blocking thread. A write error
    /// ends the stream early; the engine then reports a truncated context and the caller gets
    /// the error from the returned handle.
    pub fn into_stream(
        self,
    ) -> (
        tokio_stream_like::Receiver,
        tokio::task::JoinHandle<Result<(), ImageError>>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
        let handle = tokio::task::spawn_blocking(move || {
            let w = ChunkWriter {
                tx,
                buf: Vec::with_capacity(CHUNK),
            };
            let mut w = self.write_tar(w)?;
            w.flush().map_err(|e| ImageError::Context {
                name: "<end of archive>".into(),
                message: e.to_string(),
            })?;
            Ok(())
        });
        (tokio_stream_like::Receiver(rx), handle)
    }
}

const CHUNK: usize = 1 << 20;

struct ChunkWriter {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(chunk)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "engine closed"))
    }
}

/// A `Stream` over the chunk channel (tokio's receiver is not one by itself).
pub mod tokio_stream_like {
    use bytes::Bytes;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    pub struct Receiver(pub(super) tokio::sync::mpsc::Receiver<Bytes>);

    impl futures_util::Stream for Receiver {
        type Item = Bytes;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
            self.0.poll_recv(cx)
        }
    }
}

fn walk(
    dir: &Path,
    prefix: &str,
    ignore: &DockerIgnore,
    out: &mut Vec<(String, Source)>,
) -> Result<(), ImageError> {
    let io = |source| ImageError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map_err(io)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?;
    names.sort_by_key(|e| e.file_name());
    for e in names {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            return Err(ImageError::Context {
                name: e.path().display().to_string(),
                message: "file name is not UTF-8".into(),
            });
        };
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let ft = e.file_type().map_err(io)?;
        let excluded = ignore.is_excluded(&rel);
        if ft.is_dir() {
            // An excluded folder is skipped whole unless a `!` rule might re-include something.
            if !excluded || ignore.has_exceptions() {
                walk(&e.path(), &rel, ignore, out)?;
            }
        } else if !excluded && (ft.is_file() || ft.is_symlink()) {
            out.push((rel, Source::File(e.path())));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_holds_kept_files_and_added_ones_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join(".dockerignore"), "target\n*.log\n!keep.log\n").unwrap();
        std::fs::create_dir_all(root.join("target/release")).unwrap();
        std::fs::write(root.join("target/release/big"), b"x").unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/main.rs"), b"fn main() {}").unwrap();
        std::fs::write(root.join("a.log"), b"no").unwrap();
        std::fs::write(root.join("keep.log"), b"yes").unwrap();
        std::os::unix::fs::symlink("src/main.rs", root.join("link")).unwrap();
        let extra = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(extra.path().join("bin")).unwrap();
        std::fs::write(extra.path().join("bin/trainer"), b"ELF").unwrap();

        let mut ctx = Context::scan(root).unwrap();
        ctx.add_bytes("Containerfile.gen", b"FROM scratch\n".to_vec());
        ctx.add_tree("prebuilt", extra.path()).unwrap();
        let bytes = ctx.write_tar(Vec::new()).unwrap();

        let mut ar = tar::Archive::new(bytes.as_slice());
        let mut got = Vec::new();
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().display().to_string();
            let mut body = String::new();
            if e.header().entry_type().is_symlink() {
                body = format!("-> {}", e.link_name().unwrap().unwrap().display());
            } else {
                std::io::Read::read_to_string(&mut e, &mut body).unwrap();
            }
            got.push((name, body));
        }
        let want = [
            (".dockerignore", "target\n*.log\n!keep.log\n"),
            ("keep.log", "yes"),
            ("link", "-> src/main.rs"),
            ("src/main.rs", "fn main() {}"),
            ("Containerfile.gen", "FROM scratch\n"),
            ("prebuilt/bin/trainer", "ELF"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want);
        // Same tree, same bytes (the engine's cache depends on it).
        let mut again = Context::scan(root).unwrap();
        again.add_bytes("Containerfile.gen", b"FROM scratch\n".to_vec());
        again.add_tree("prebuilt", extra.path()).unwrap();
        assert_eq!(again.write_tar(Vec::new()).unwrap(), bytes);
    }
}
