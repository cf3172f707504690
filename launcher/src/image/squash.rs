//! `launcher image squash`: the image as the squashfs file Enroot and Pyxis mount, in the
//! layout `enroot import` writes (the rootfs, `/etc/environment` from the config's Env,
//! `/etc/rc` running the entrypoint in the working directory with the labels as comments,
//! `/etc/fstab` for volumes, an empty `/etc/rc.local`), so `srun --container-image=FILE` reads
//! one file from shared storage instead of every node pulling. Named by the image ID; an
//! existing file for the same ID is verified against its recorded SHA-256 and reused.
use super::engine::{engine_error, remove_container};
use super::inspect::{self, ImageFacts};
use super::{ImageError, SquashError};
use crate::fsutil::hex;
use crate::shell::quote;
use bollard::models::ContainerCreateBody;
use bollard::Docker;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Enroot's default `ENROOT_SQUASH_OPTIONS` (`-comp lzo -noD`): every squashfuse and kernel
/// reads lzo, and uncompressed data mounts fastest.
pub const DEFAULT_OPTIONS: &str = "-comp lzo -noD";

#[derive(Debug, Clone)]
pub struct Squashed {
    pub path: PathBuf,
    pub reused: bool,
    pub sha256: String,
    pub bytes: u64,
}

/// `DIR/sha256-HEX.sqsh` for image ID `sha256:HEX`.
pub fn file_name(image_id: &str) -> String {
    format!("{}.sqsh", image_id.replace(':', "-"))
}

pub async fn squash(
    docker: &Docker,
    image: &str,
    out_dir: &Path,
    options: &str,
) -> Result<Squashed, ImageError> {
    let facts =
        inspect::from_engine(docker, image)
            .await?
            .ok_or_else(|| SquashError::NoSuchImage {
                image: image.to_string(),
            })?;
    let id = facts.id.clone().ok_or_else(|| SquashError::NoImageId {
        image: image.to_string(),
    })?;
    std::fs::create_dir_all(out_dir).map_err(|source| ImageError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let path = out_dir.join(file_name(&id));
    if path.exists() {
        match verify(&path) {
            Ok(sum) => {
                let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                return Ok(Squashed {
                    path,
                    reused: true,
                    sha256: sum,
                    bytes,
                });
            }
            Err(why) => {
                tracing::info!(
                    "[squash] {} is not a good copy ({why}): rebuilding it",
                    path.display()
                );
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_file(sidecar(&path));
            }
        }
    }
    let work = tempfile::Builder::new()
        .prefix(".squash-")
        .tempdir_in(out_dir)
        .map_err(|source| ImageError::Io {
            path: out_dir.to_path_buf(),
            source,
        })?;
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir(&rootfs).map_err(|source| ImageError::Io {
        path: rootfs.clone(),
        source,
    })?;
    export_rootfs(docker, &id, &rootfs).await?;
    configure(&rootfs, &facts)?;
    let tmp = work.path().join("image.sqsh");
    let mut cmd = Command::new("mksquashfs");
    cmd.arg(&rootfs)
        .arg(&tmp)
        .args(["-all-root", "-no-progress", "-quiet"])
        .args(options.split_whitespace());
    if let Ok(t) = std::env::var("SOURCE_DATE_EPOCH") {
        cmd.args(["-mkfs-time", &t, "-all-time", &t]);
    }
    let out = cmd.output().map_err(SquashError::MksquashfsMissing)?;
    if !out.status.success() {
        return Err(SquashError::MksquashfsFailed {
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }
        .into());
    }
    // Readable by every job user (a 0600 file makes Pyxis say "Invalid image format").
    set_mode(&tmp, 0o644)?;
    let sum = sha256_file(&tmp)?;
    let bytes = std::fs::metadata(&tmp).map(|m| m.len()).unwrap_or(0);
    crate::fsutil::write_atomic(
        &sidecar(&path),
        format!("{sum}  {}\n", file_name(&id)).as_bytes(),
    )
    .map_err(|source| ImageError::Io {
        path: sidecar(&path),
        source,
    })?;
    std::fs::rename(&tmp, &path).map_err(|source| ImageError::Io {
        path: path.clone(),
        source,
    })?;
    crate::fsutil::sync_dir(out_dir);
    Ok(Squashed {
        path,
        reused: false,
        sha256: sum,
        bytes,
    })
}

fn sidecar(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".sha256");
    PathBuf::from(s)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), ImageError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        ImageError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

fn sha256_file(path: &Path) -> Result<String, ImageError> {
    let io = |source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// The file's SHA-256 if it matches its sidecar and squashfs-tools can read its superblock.
pub fn verify(path: &Path) -> Result<String, String> {
    let recorded =
        std::fs::read_to_string(sidecar(path)).map_err(|e| format!("no checksum file: {e}"))?;
    let recorded = recorded.split_whitespace().next().unwrap_or("").to_string();
    let actual = sha256_file(path).map_err(|e| e.to_string())?;
    if actual != recorded {
        return Err(format!(
            "SHA-256 {actual} differs from the recorded {recorded}"
        ));
    }
    let s = Command::new("unsquashfs")
        .arg("-s")
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run unsquashfs: {e}"))?;
    if !s.status.success() {
        return Err("unsquashfs cannot read its superblock".into());
    }
    Ok(actual)
}

/// `docker create` + `docker export`, unpacked without `dev/*` and `.dockerenv` (as Enroot's
/// dockerd:// import does). The container is removed whatever happens.
async fn export_rootfs(docker: &Docker, id: &str, rootfs: &Path) -> Result<(), ImageError> {
    let body = ContainerCreateBody {
        image: Some(id.to_string()),
        // Never started; an explicit command keeps images without CMD/ENTRYPOINT exportable.
        entrypoint: Some(vec!["/bin/true".into()]),
        network_disabled: Some(true),
        ..Default::default()
    };
    let created = docker
        .create_container(None, body)
        .await
        .map_err(|e| engine_error("creating a container to export", e))?;
    let result = async {
        let (tx, rx) = std::sync::mpsc::sync_channel::<bytes::Bytes>(8);
        let dest = rootfs.to_path_buf();
        let unpack = tokio::task::spawn_blocking(move || unpack(ChannelReader::new(rx), &dest));
        let mut stream = docker.export_container(&created.id);
        let mut failed = None;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(b) => {
                    if tx.send(b).is_err() {
                        break; // the unpacker stopped; its error follows
                    }
                }
                Err(e) => {
                    failed = Some(engine_error("exporting the container", e));
                    break;
                }
            }
        }
        drop(tx);
        let unpacked = unpack.await.map_err(SquashError::Unpacker)?;
        if let Some(e) = failed {
            return Err(e);
        }
        unpacked
    }
    .await;
    remove_container(docker, &created.id).await;
    result
}

struct ChannelReader {
    rx: std::sync::mpsc::Receiver<bytes::Bytes>,
    cur: bytes::Bytes,
}

impl ChannelReader {
    fn new(rx: std::sync::mpsc::Receiver<bytes::Bytes>) -> Self {
        Self {
            rx,
            cur: bytes::Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.recv() {
                Ok(b) => self.cur = b,
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        self.cur = self.cur.slice(n..);
        Ok(n)
    }
}

fn unpack(reader: impl Read, dest: &Path) -> Result<(), ImageError> {
    let mut ar = tar::Archive::new(reader);
    ar.set_preserve_permissions(true);
    ar.set_unpack_xattrs(false);
    ar.set_overwrite(true);
    let entries = ar.entries().map_err(SquashError::ExportUnreadable)?;
    for entry in entries {
        let mut entry = entry.map_err(SquashError::ExportUnreadable)?;
        let path = entry.path().map_err(SquashError::ExportPath)?.to_path_buf();
        let rel = path.strip_prefix("./").unwrap_or(&path);
        if rel == Path::new(".dockerenv") || (rel.starts_with("dev") && rel != Path::new("dev")) {
            continue;
        }
        entry.unpack_in(dest).map_err(|error| SquashError::Unpack {
            path: rel.to_path_buf(),
            error,
        })?;
    }
    Ok(())
}

/// Writes Enroot's configuration files from the image config (enroot's doc/image-format.md).
pub fn configure(rootfs: &Path, facts: &ImageFacts) -> Result<(), ImageError> {
    let etc = rootfs.join("etc");
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| ImageError::Io { path: p, source }
    };
    std::fs::create_dir_all(&etc).map_err(io(&etc))?;
    let (files, workdir) = enroot_files(facts);
    for (name, text) in files {
        let p = etc.join(name);
        // A symlink there (Debian's /etc/environment is a file, but images vary) is replaced.
        let _ = std::fs::remove_file(&p);
        std::fs::File::create(&p)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(io(&p))?;
    }
    let wd = rootfs.join(workdir.trim_start_matches('/'));
    std::fs::create_dir_all(&wd).map_err(io(&wd))?;
    Ok(())
}

/// `(etc file name, content)` for environment, fstab, rc, rc.local; and the working directory.
pub fn enroot_files(facts: &ImageFacts) -> (Vec<(&'static str, String)>, String) {
    let c = facts.config.config().clone().unwrap_or_default();
    let env: String = c
        .env()
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|e| format!("{e}\n"))
        .collect();
    let fstab: String = c
        .volumes()
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|v| format!("${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n"))
        .collect();
    let mut rc = String::new();
    for (k, v) in facts.labels() {
        rc += &format!("# {k} {}\n", v.replace('\n', " "));
    }
    if !rc.is_empty() {
        rc.push('\n');
    }
    let workdir = c
        .working_dir()
        .clone()
        .filter(|w| !w.is_empty())
        .unwrap_or_else(|| "/".into());
    let entry: Vec<String> = c.entrypoint().clone().unwrap_or_default();
    let mut cmd: Vec<String> = c.cmd().clone().unwrap_or_default();
    if entry.is_empty() && cmd.is_empty() {
        cmd = vec!["/bin/sh".into()];
    }
    let words = |w: &[String]| w.iter().map(|s| quote(s)).collect::<Vec<_>>().join(" ");
    let (e, all) = (words(&entry), words(&[entry.clone(), cmd].concat()));
    let wq = quote(&workdir);
    rc += &format!(
        "mkdir -p {wq} 2> /dev/null\ncd {wq} && unset OLDPWD || exit 1\n\nif [ -s /etc/rc.local ]; then\n    . /etc/rc.local\nfi\n\nif [ $# -gt 0 ]; then\n    exec {e} \"$@\"\nelse\n    exec {all}\nfi\n"
    );
    let rc_local = "# This file is sourced by /etc/rc when the container starts.\n# It can be used to manipulate the entrypoint or the command of the container.\n".to_string();
    (
        vec![
            ("environment", env),
            ("fstab", fstab),
            ("rc", rc),
            ("rc.local", rc_local),
        ],
        workdir,
    )
}
