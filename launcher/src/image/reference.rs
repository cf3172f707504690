//! Image references as Docker writes them: `[REGISTRY/]REPO[:TAG][@sha256:HEX]`. The first
//! component is a registry when it has a `.` or `:` or is `localhost` (Docker's rule);
//! otherwise the image lives on Docker Hub.
use super::{ImageError, ReferenceError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `None` for Docker Hub.
    pub registry: Option<String>,
    /// The repository path without the registry.
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:HEX`.
    pub digest: Option<String>,
}

impl ImageRef {
    pub fn parse(s: &str) -> Result<Self, ImageError> {
        let bad = |why: &'static str| {
            ImageError::from(ReferenceError {
                reference: s.to_string(),
                why,
            })
        };
        if s.is_empty() || s.chars().any(char::is_whitespace) {
            return Err(bad("empty or contains whitespace"));
        }
        let (name, digest) = match s.split_once('@') {
            Some((n, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| bad("the digest must be sha256:HEX"))?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad("the digest must be sha256: and 64 hex digits"));
                }
                (n, Some(d.to_ascii_lowercase()))
            }
            None => (s, None),
        };
        let (path, tag) = match name.rfind(':') {
            Some(i) if !name[i..].contains('/') => (&name[..i], Some(name[i + 1..].to_string())),
            _ => (name, None),
        };
        if tag.as_deref() == Some("") {
            return Err(bad("empty tag"));
        }
        let (registry, repository) = match path.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (Some(first.to_string()), rest.to_string())
            }
            _ => (None, path.to_string()),
        };
        if repository.is_empty()
            || !repository
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
        {
            return Err(bad(
                "the repository must be lowercase letters, digits and ._-/",
            ));
        }
        Ok(Self {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// `REGISTRY/REPO` (or `REPO` on Docker Hub): the name the engine pushes.
    pub fn name(&self) -> String {
        match &self.registry {
            Some(r) => format!("{r}/{}", self.repository),
            None => self.repository.clone(),
        }
    }

    pub fn tag_or_latest(&self) -> &str {
        self.tag.as_deref().unwrap_or("latest")
    }

    /// The registry host used for credentials and the registry API.
    pub fn registry_host(&self) -> &str {
        self.registry.as_deref().unwrap_or("docker.io")
    }

    /// Whether the registry is on this machine (plain HTTP is plausible there, and the engine
    /// allows it without configuration).
    pub fn is_loopback(&self) -> bool {
        let host = self.registry_host();
        let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
        host == "localhost" || host.starts_with("127.") || host == "[::1]"
    }

    /// `NAME@sha256:…` for a pushed manifest digest.
    pub fn with_digest(&self, digest: &str) -> String {
        format!("{}@{digest}", self.name())
    }
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_docker_forms() {
        let r = ImageRef::parse("127.0.0.1:5555/scdino/trainer:ci").unwrap();
        assert_eq!(r.registry.as_deref(), Some("127.0.0.1:5555"));
        assert_eq!(r.repository, "scdino/trainer");
        assert_eq!(r.tag.as_deref(), Some("ci"));
        assert!(r.is_loopback());
        let r = ImageRef::parse("scdino:dev").unwrap();
        assert_eq!((r.registry.clone(), r.name()), (None, "scdino".to_string()));
        assert_eq!(r.registry_host(), "docker.io");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = ImageRef::parse(&format!(
            "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer@{d}"
        ))
        .unwrap();
        assert_eq!((r.tag.clone(), r.digest.clone()), (None, Some(d.clone())));
        assert!(!r.is_loopback());
        assert_eq!(
            r.to_string(),
            format!("123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer@{d}")
        );
        let r = ImageRef::parse("localhost/x").unwrap();
        assert_eq!(r.registry.as_deref(), Some("localhost"));
    }

    #[test]
    fn refuses_bad_references() {
        for s in ["", "Upper/case", "x:", "x@sha256:12", "a b"] {
            assert!(ImageRef::parse(s).is_err(), "{s}");
        }
    }
}
