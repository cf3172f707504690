//! Where a dataset lives (`data.dataset_dir`, `data.test_dir`): a path on this machine's file
//! systems or an `s3://bucket/prefix`. The YAML writes both as one string; it is parsed here,
//! once, when the config is read, so the stages match on the kind instead of each testing
//! the string for `s3://` again (and each deciding differently what a malformed URL means).
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A dataset's location, as written in the YAML (`/fsx/cells` or `s3://bucket/prefix`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DatasetLocation {
    /// A local or shared (FSx, NFS) path, relative ones resolved against the working
    /// directory.
    Local(PathBuf),
    /// Objects below a bucket prefix, read through the S3 client.
    S3(S3Url),
}

/// `s3://bucket/prefix`, split. The bucket is never empty and the prefix has no leading or
/// trailing '/', so two spellings of one prefix compare equal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct S3Url {
    bucket: String,
    prefix: String,
}

/// A location string that names no dataset we can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocationError {
    /// `s3://` with nothing or a '/' where the bucket should be.
    #[error("an s3:// dataset needs a bucket: s3://bucket/prefix")]
    NoBucket { location: String },
    /// Another scheme (`gs://`, `http://`): only paths and S3 are read.
    #[error("{location:?}: only local paths and s3://bucket/prefix are supported")]
    Unsupported { location: String },
    /// A location that had to be an `s3://` URL and is not.
    #[error("{location:?} is not an s3:// URL")]
    NotS3 { location: String },
}

/// The location keys of the run config.
const KEYS: [&str; 2] = ["dataset_dir", "test_dir"];

/// Parses the `data` locations of a config's text before the schema does, so that a
/// malformed one is refused like every other invalid value, with its key and line (the
/// schema's own parse would only point at a column). Text that is not YAML is left to the
/// schema's parse, which reports it.
pub(crate) fn check_text(text: &str, v: &crate::Validator) -> Result<(), crate::Invalid> {
    let Ok(serde_json::Value::Object(root)) = serde_saphyr::from_str(text) else {
        return Ok(());
    };
    let Some(serde_json::Value::Object(data)) = root.get("data") else {
        return Ok(());
    };
    for key in KEYS {
        if let Some(serde_json::Value::String(s)) = data.get(key) {
            if let Err(e) = s.parse::<DatasetLocation>() {
                return Err(v.err(&format!("data.{key}"), &e.to_string()));
            }
        }
    }
    Ok(())
}

impl FromStr for DatasetLocation {
    type Err = LocationError;

    fn from_str(s: &str) -> Result<Self, LocationError> {
        if s.starts_with("s3://") {
            S3Url::parse(s).map(Self::S3)
        } else if s.contains("://") {
            Err(LocationError::Unsupported {
                location: s.to_string(),
            })
        } else {
            Ok(Self::Local(PathBuf::from(s)))
        }
    }
}

impl TryFrom<String> for DatasetLocation {
    type Error = LocationError;

    fn try_from(s: String) -> Result<Self, LocationError> {
        s.parse()
    }
}

impl From<DatasetLocation> for String {
    fn from(l: DatasetLocation) -> String {
        l.to_string()
    }
}

impl From<PathBuf> for DatasetLocation {
    fn from(p: PathBuf) -> Self {
        Self::Local(p)
    }
}

/// The location as the YAML writes it (`s3://` URLs without a trailing '/').
impl fmt::Display for DatasetLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local(p) => write!(f, "{}", p.display()),
            Self::S3(u) => write!(f, "{u}"),
        }
    }
}

impl DatasetLocation {
    /// The place this location names, spelled one way, so two spellings of one dataset compare
    /// equal: a local path made absolute against the working directory with its symbolic links
    /// and `..` resolved (`./data` and `/work/data` are one place), an S3 URL without trailing
    /// '/'. A path that does not exist is only made absolute. A checkpoint records it to tell a
    /// resume on other data from one on the same data.
    pub fn canonical(&self) -> String {
        match self {
            Self::Local(p) => std::fs::canonicalize(p)
                .or_else(|_| std::path::absolute(p))
                .unwrap_or_else(|_| p.clone())
                .display()
                .to_string(),
            Self::S3(u) => u.to_string(),
        }
    }

    /// The path, for a dataset on this machine's file systems.
    pub fn local(&self) -> Option<&std::path::Path> {
        match self {
            Self::Local(p) => Some(p),
            Self::S3(_) => None,
        }
    }
}

impl S3Url {
    pub fn parse(url: &str) -> Result<Self, LocationError> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| LocationError::NotS3 {
                location: url.to_string(),
            })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(LocationError::NoBucket {
                location: url.to_string(),
            });
        }
        Ok(Self {
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
        })
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The key prefix, without leading or trailing '/' (empty for a whole bucket).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The dataset root as it appears in sample paths: `s3://bucket/prefix`.
    pub fn root(&self) -> String {
        self.to_string()
    }

    /// The object key of `rel` (a key relative to the prefix).
    pub fn key(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// `s3://bucket/key` of `rel`, for messages and sample paths.
    pub fn url_of(&self, rel: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key(rel))
    }
}

impl fmt::Display for S3Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = S3Url::parse("s3://bkt/a/b/").unwrap();
        assert_eq!((u.bucket(), u.prefix()), ("bkt", "a/b"));
        assert_eq!(u.root(), "s3://bkt/a/b");
        assert_eq!(u.url_of("C/x.tif"), "s3://bkt/a/b/C/x.tif");
        let top = S3Url::parse("s3://bkt").unwrap();
        assert_eq!(
            (top.root(), top.key("C/x.tif")),
            ("s3://bkt".into(), "C/x.tif".into())
        );
        assert!(matches!(
            S3Url::parse("s3:///x"),
            Err(LocationError::NoBucket { .. })
        ));
        assert!(matches!(
            S3Url::parse("/data/x"),
            Err(LocationError::NotS3 { .. })
        ));
    }

    #[test]
    fn one_place_has_one_canonical_spelling() {
        let here = std::env::current_dir().unwrap();
        let rel: DatasetLocation = "src".parse().unwrap();
        let abs = DatasetLocation::Local(here.join("src"));
        let dotted = DatasetLocation::Local(here.join("src/../src/."));
        assert_eq!(rel.canonical(), abs.canonical());
        assert_eq!(dotted.canonical(), abs.canonical());
        assert!(std::path::Path::new(&abs.canonical()).is_absolute());
        let other: DatasetLocation = "tests".parse().unwrap();
        assert_ne!(other.canonical(), abs.canonical());
        // A path that is not there (a cluster path on a laptop) is made absolute as written.
        let missing: DatasetLocation = "no/such/dir".parse().unwrap();
        assert_eq!(
            missing.canonical(),
            here.join("no/such/dir").display().to_string()
        );
        let s3: DatasetLocation = "s3://bkt/a/b/".parse().unwrap();
        assert_eq!(s3.canonical(), "s3://bkt/a/b");
        assert_ne!(
            s3.canonical(),
            "s3://bkt/a".parse::<DatasetLocation>().unwrap().canonical()
        );
    }

    #[test]
    fn locations_parse_once_and_write_back_as_written() {
        for text in ["/fsx/cells", "rel/dir", "s3://bkt/pbmc", "s3://bkt"] {
            let l: DatasetLocation = text.parse().unwrap();
            assert_eq!(l.to_string(), text);
        }
        assert_eq!(
            "/fsx/cells".parse::<DatasetLocation>().unwrap().local(),
            Some(std::path::Path::new("/fsx/cells"))
        );
        let s3: DatasetLocation = "s3://bkt/a/".parse().unwrap();
        assert_eq!(s3, DatasetLocation::S3(S3Url::parse("s3://bkt/a").unwrap()));
        assert_eq!(s3.local(), None);
        let e = "s3:///x".parse::<DatasetLocation>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "an s3:// dataset needs a bucket: s3://bucket/prefix"
        );
        let e = "gs://b/x".parse::<DatasetLocation>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"gs://b/x\": only local paths and s3://bucket/prefix are supported"
        );
    }
}
