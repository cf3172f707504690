//! What Pyxis and Enroot accept as `container.image` and `container.mounts`, and where a host
//! path appears inside the container.
use std::path::{Path, PathBuf};

/// Why `container.image` cannot be given to Pyxis/Enroot as written; each says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageRefError {
    #[error("{0:?} is not a squashfs file path")]
    NotAFilePath(String),
    #[error("{0:?}: use an absolute .sqsh path (compute nodes do not share the submit directory's meaning)")]
    RelativeSquashfs(String),
    #[error("{0:?} would be pulled from Docker Hub (Pyxis treats only paths starting with '/' or '.' as files): write the absolute path")]
    SquashfsFromHub(String),
    #[error("{0:?}: digests need Enroot 4; pin a tag (REGISTRY#IMAGE:TAG) for Enroot 3.x")]
    DigestNeedsEnroot4(String),
    #[error("{image:?}: registry {registry:?} is not a host name")]
    Registry { image: String, registry: String },
    #[error("{image:?} looks like a Docker-style registry/image reference; Enroot 3.x needs REGISTRY#IMAGE:TAG, e.g. {suggestion}")]
    DockerStyle { image: String, suggestion: String },
    #[error("{image:?}: image name {name:?} may hold only lower-case letters, digits, '/', '.', '_', '-'")]
    Name { image: String, name: String },
    #[error("{image:?}: tag {tag:?} may hold only letters, digits, '.', '_', '-'")]
    Tag { image: String, tag: String },
    #[error(
        "{reason} (Enroot 4 syntax: REGISTRY/IMAGE[:TAG][@sha256:HEX] or REGISTRY#IMAGE[:TAG])"
    )]
    Enroot4 { reason: String },
}

/// Why a `container.mounts` entry is not a Pyxis mount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    #[error("{0:?}: one mount per list entry, without ',' (Pyxis separates mounts with ',')")]
    Several(String),
    #[error("{0:?} must be SRC:DST or SRC:DST:FLAGS (flags joined with '+')")]
    Shape(String),
    #[error("{0:?}: the source must be an absolute path (or tmpfs/umount)")]
    Source(String),
    #[error("{0:?}: the destination must be an absolute path")]
    Destination(String),
}

/// An image reference as the cluster's Enroot reads it: Enroot 4 also takes Docker-style
/// `REGISTRY/IMAGE[:TAG][@sha256:HEX]` (commit f29a45c), which pins the exact image by digest.
pub fn check_image_for(image: &str, enroot_version: u32) -> Result<(), ImageRefError> {
    if enroot_version < 4 || image.starts_with('/') || image.starts_with('.') {
        return check_image(image);
    }
    let uri = image.strip_prefix("docker://").unwrap_or(image);
    // Enroot 4 still accepts `[USER@]REGISTRY#IMAGE`: validate it as REGISTRY/IMAGE.
    let docker = match uri.split_once('#') {
        Some((reg, rest)) => format!("{}/{rest}", reg.rsplit_once('@').map_or(reg, |(_, r)| r)),
        None => uri.to_string(),
    };
    crate::image::reference::ImageRef::parse(&docker)
        .map(|_| ())
        .map_err(|e| ImageRefError::Enroot4 {
            reason: e.to_string(),
        })
}

/// Enroot 3.x image references: `[USER@][REGISTRY#]IMAGE[:TAG]`, or a squashfs path.
pub fn check_image(image: &str) -> Result<(), ImageRefError> {
    if image.starts_with('/') {
        return if image.ends_with('/') || image.contains('\n') {
            Err(ImageRefError::NotAFilePath(image.into()))
        } else {
            Ok(())
        };
    }
    if image.starts_with('.') {
        return Err(ImageRefError::RelativeSquashfs(image.into()));
    }
    if image.ends_with(".sqsh") {
        return Err(ImageRefError::SquashfsFromHub(image.into()));
    }
    let rest = image
        .strip_prefix("docker://")
        .unwrap_or(image)
        .rsplit_once('@')
        .map_or(image, |(_, r)| r);
    if image.contains("@sha256:") {
        return Err(ImageRefError::DigestNeedsEnroot4(image.into()));
    }
    let (registry, name_tag) = match rest.split_once('#') {
        Some((r, n)) => (Some(r), n),
        None => (None, rest),
    };
    if let Some(r) = registry {
        if r.is_empty()
            || !r
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
        {
            return Err(ImageRefError::Registry {
                image: image.into(),
                registry: r.into(),
            });
        }
    }
    let (name, tag) = match name_tag.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (name_tag, None),
    };
    if registry.is_none() {
        if let Some(first) = name.split('/').next() {
            if name.contains('/')
                && (first.contains('.') || first.contains(':') || first == "localhost")
            {
                return Err(ImageRefError::DockerStyle {
                    image: image.into(),
                    suggestion: format!("{}#{}", first, &image[first.len() + 1..]),
                });
            }
        }
    }
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"/._-".contains(&b))
    {
        return Err(ImageRefError::Name {
            image: image.into(),
            name: name.into(),
        });
    }
    if let Some(t) = tag {
        if t.is_empty()
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(ImageRefError::Tag {
                image: image.into(),
                tag: t.into(),
            });
        }
    }
    Ok(())
}

/// One Pyxis mount: `SRC[:DST[:FLAGS]]`.
pub fn check_mount(m: &str) -> Result<(), MountError> {
    if m.contains(',') || m.contains('\n') {
        return Err(MountError::Several(m.into()));
    }
    let parts: Vec<&str> = m.split(':').collect();
    if parts.len() > 3 || parts.iter().any(|p| p.is_empty()) {
        return Err(MountError::Shape(m.into()));
    }
    let src = parts[0];
    if !(src.starts_with('/') || src == "tmpfs" || src == "umount") {
        return Err(MountError::Source(m.into()));
    }
    if let Some(dst) = parts.get(1) {
        if !dst.starts_with('/') {
            return Err(MountError::Destination(m.into()));
        }
    }
    Ok(())
}

/// The container path of a host path, through the mounts (`None` when no mount covers it).
pub fn container_path(mounts: &[String], host: &Path) -> Option<PathBuf> {
    mounts
        .iter()
        .filter_map(|m| {
            let mut p = m.split(':');
            let src = Path::new(p.next()?);
            let dst = p.next().map(Path::new).unwrap_or(src);
            let rel = host.strip_prefix(src).ok()?;
            // `dst.join("")` would add a trailing '/'.
            let inside = if rel.as_os_str().is_empty() {
                dst.to_path_buf()
            } else {
                dst.join(rel)
            };
            Some((src.as_os_str().len(), inside))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, p)| p)
}
