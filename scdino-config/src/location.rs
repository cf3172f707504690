//! Where a dataset lives (`data.dataset_dir`, `data.test_dir`, `--images`, a pack's output): a
//! path on this machine's file systems (also written `file:///path`) or objects below a prefix
//! of a remote store: `s3://bucket/prefix` (Amazon S3 and S3-compatible servers),
//! `gs://bucket/prefix` (Google Cloud Storage) or `az://container/prefix` (Azure Blob Storage,
//! the account from `AZURE_STORAGE_ACCOUNT_NAME`). The string is parsed here, once, so the
//! stages match on the kind instead of each testing the string for a scheme again (and each
//! deciding differently what a malformed URL means). This crate links no store client, so the
//! launcher parses locations exactly as the trainer does.
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A dataset's location, as written in the YAML (`/fsx/cells`, `s3://bucket/prefix`,
/// `gs://bucket/prefix`, `az://container/prefix`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DatasetLocation {
    /// A local or shared (FSx, NFS) path, relative ones resolved against the working
    /// directory.
    Local(PathBuf),
    /// Objects below a bucket (container) prefix, read through the store's client.
    Remote(StoreUrl),
}

/// Which remote store a [`StoreUrl`] names; each is reached by `object_store`'s own client
/// for it, with credentials from that store's environment variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `s3://`: Amazon S3 or an S3-compatible server.
    S3,
    /// `gs://`: Google Cloud Storage.
    Gcs,
    /// `az://`: Azure Blob Storage (a container of the storage account).
    Azure,
}

impl Scheme {
    const ALL: [Scheme; 3] = [Scheme::S3, Scheme::Gcs, Scheme::Azure];

    /// The URL scheme, without `://`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::S3 => "s3",
            Scheme::Gcs => "gs",
            Scheme::Azure => "az",
        }
    }

    /// The store's name in messages.
    pub fn service(self) -> &'static str {
        match self {
            Scheme::S3 => "S3",
            Scheme::Gcs => "Google Cloud Storage",
            Scheme::Azure => "Azure Blob Storage",
        }
    }

    /// The scheme `url` starts with, if it is a store URL.
    fn of(url: &str) -> Option<Scheme> {
        Scheme::ALL.into_iter().find(|s| {
            url.strip_prefix(s.as_str())
                .is_some_and(|r| r.starts_with("://"))
        })
    }
}

/// `s3://bucket/prefix` (or `gs://`, `az://`), split. The bucket is never empty and the prefix
/// has no leading or trailing '/', so two spellings of one prefix compare equal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreUrl {
    scheme: Scheme,
    bucket: String,
    prefix: String,
}

/// A location string that names no dataset we can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocationError {
    /// `s3://` (`gs://`, `az://`) with nothing or a '/' where the bucket should be.
    #[error("{article} {scheme}:// dataset needs a bucket: {scheme}://bucket/prefix")]
    NoBucket {
        location: String,
        scheme: &'static str,
        /// "an s3://", "a gs://", "an az://", as they are read aloud.
        article: &'static str,
    },
    /// Another scheme (`http://`, `hdfs://`).
    #[error("{location:?}: only local paths (or file:///path), s3://bucket/prefix, gs://bucket/prefix and az://container/prefix are supported")]
    Unsupported { location: String },
    /// A location that had to be a store URL and is not.
    #[error("{location:?} is not an s3://, gs:// or az:// URL")]
    NotRemote { location: String },
}

thread_local! {
    /// The location the schema's parse refused on this thread, with its key: serde carries
    /// only a message out of a failed parse, and a malformed location is refused like every
    /// other invalid value, naming its key and line ([`refused_during`]).
    static REFUSED: std::cell::RefCell<Option<(&'static str, LocationError)>> =
        const { std::cell::RefCell::new(None) };
}

/// Parses the location written under `key`: the one parse of a config's location string.
fn parse_keyed(text: String, key: &'static str) -> Result<DatasetLocation, LocationError> {
    text.parse().inspect_err(|e: &LocationError| {
        REFUSED.with(|r| *r.borrow_mut() = Some((key, e.clone())));
    })
}

/// `data.dataset_dir` as the schema reads it (`#[serde(deserialize_with)]`).
pub(crate) fn dataset_dir<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<DatasetLocation, D::Error> {
    let text = <String as serde::Deserialize>::deserialize(d)?;
    parse_keyed(text, "data.dataset_dir").map_err(serde::de::Error::custom)
}

/// `data.test_dir` as the schema reads it (`#[serde(deserialize_with)]`).
pub(crate) fn test_dir<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<DatasetLocation>, D::Error> {
    let text = <Option<String> as serde::Deserialize>::deserialize(d)?;
    text.map(|t| parse_keyed(t, "data.test_dir"))
        .transpose()
        .map_err(serde::de::Error::custom)
}

/// Runs the schema's parse `parse` and gives, beside its result, the location it refused
/// (if that was why it failed) with the key it was written under.
pub(crate) fn refused_during<T>(
    parse: impl FnOnce() -> T,
) -> (T, Option<(&'static str, LocationError)>) {
    REFUSED.with(|r| r.borrow_mut().take());
    let out = parse();
    (out, REFUSED.with(|r| r.borrow_mut().take()))
}

impl FromStr for DatasetLocation {
    type Err = LocationError;

    fn from_str(s: &str) -> Result<Self, LocationError> {
        if Scheme::of(s).is_some() {
            StoreUrl::parse(s).map(Self::Remote)
        } else if let Some(path) = s.strip_prefix("file://") {
            Ok(Self::Local(PathBuf::from(path)))
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

/// The location as the YAML writes it (store URLs without a trailing '/'; a `file://` URL as
/// its path).
impl fmt::Display for DatasetLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local(p) => write!(f, "{}", p.display()),
            Self::Remote(u) => write!(f, "{u}"),
        }
    }
}

impl DatasetLocation {
    /// The place this location names, spelled one way, so two spellings of one dataset compare
    /// equal: a local path made absolute against the working directory with its symbolic links
    /// and `..` resolved (`./data` and `/work/data` are one place), a store URL without
    /// trailing '/'. A path that does not exist is only made absolute. A checkpoint records it
    /// to tell a resume on other data from one on the same data.
    pub fn canonical(&self) -> String {
        match self {
            Self::Local(p) => std::fs::canonicalize(p)
                .or_else(|_| std::path::absolute(p))
                .unwrap_or_else(|_| p.clone())
                .display()
                .to_string(),
            Self::Remote(u) => u.to_string(),
        }
    }

    /// The path, for a dataset on this machine's file systems.
    pub fn local(&self) -> Option<&std::path::Path> {
        match self {
            Self::Local(p) => Some(p),
            Self::Remote(_) => None,
        }
    }
}

impl StoreUrl {
    pub fn parse(url: &str) -> Result<Self, LocationError> {
        let scheme = Scheme::of(url).ok_or_else(|| LocationError::NotRemote {
            location: url.to_string(),
        })?;
        let rest = &url[scheme.as_str().len() + 3..];
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(LocationError::NoBucket {
                location: url.to_string(),
                scheme: scheme.as_str(),
                article: if scheme == Scheme::Gcs { "a" } else { "an" },
            });
        }
        Ok(Self {
            scheme,
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
        })
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The bucket (an Azure container).
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
        self.url_of_key(&self.key(rel))
    }

    /// The folder of a node-local cache below `dir` that holds this prefix's objects:
    /// `dir/bucket/prefix` for S3 (as it always was), `dir/gs/bucket/prefix` and
    /// `dir/az/container/prefix` for the others. S3 bucket names have at least 3 characters,
    /// so no S3 bucket's folder is `gs` or `az`.
    pub fn cache_dir(&self, dir: &std::path::Path) -> PathBuf {
        let base = match self.scheme {
            Scheme::S3 => dir.to_path_buf(),
            other => dir.join(other.as_str()),
        };
        base.join(&self.bucket).join(&self.prefix)
    }

    /// `s3://bucket/key` of a whole object key (not relative to the prefix).
    pub fn url_of_key(&self, key: &str) -> String {
        format!("{}://{}/{key}", self.scheme.as_str(), self.bucket)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = self.scheme.as_str();
        if self.prefix.is_empty() {
            write!(f, "{scheme}://{}", self.bucket)
        } else {
            write!(f, "{scheme}://{}/{}", self.bucket, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = StoreUrl::parse("s3://bkt/a/b/").unwrap();
        assert_eq!((u.bucket(), u.prefix()), ("bkt", "a/b"));
        assert_eq!(u.root(), "s3://bkt/a/b");
        assert_eq!(u.url_of("C/x.tif"), "s3://bkt/a/b/C/x.tif");
        let top = StoreUrl::parse("s3://bkt").unwrap();
        assert_eq!(
            (top.root(), top.key("C/x.tif")),
            ("s3://bkt".into(), "C/x.tif".into())
        );
        assert!(matches!(
            StoreUrl::parse("s3:///x"),
            Err(LocationError::NoBucket { .. })
        ));
        assert!(matches!(
            StoreUrl::parse("/data/x"),
            Err(LocationError::NotRemote { .. })
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
        assert_eq!(
            s3,
            DatasetLocation::Remote(StoreUrl::parse("s3://bkt/a").unwrap())
        );
        assert_eq!(s3.local(), None);
        let e = "s3:///x".parse::<DatasetLocation>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "an s3:// dataset needs a bucket: s3://bucket/prefix"
        );
        let e = "http://b/x".parse::<DatasetLocation>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"http://b/x\": only local paths (or file:///path), s3://bucket/prefix, gs://bucket/prefix and az://container/prefix are supported"
        );
    }

    #[test]
    fn gs_az_and_file_locations_parse_into_the_same_types() {
        for text in ["gs://bkt/pbmc", "az://cells", "az://cells/plate 1/a"] {
            let l: DatasetLocation = text.parse().unwrap();
            assert_eq!(l.to_string(), text);
            assert_eq!(l.local(), None);
        }
        let g = StoreUrl::parse("gs://bkt/a/b/").unwrap();
        assert_eq!(
            (g.scheme(), g.bucket(), g.prefix()),
            (Scheme::Gcs, "bkt", "a/b")
        );
        assert_eq!(g.url_of("C/x.tif"), "gs://bkt/a/b/C/x.tif");
        let a = StoreUrl::parse("az://cont").unwrap();
        assert_eq!((a.scheme(), a.root()), (Scheme::Azure, "az://cont".into()));
        assert_eq!(a.url_of_key("k/x.tif"), "az://cont/k/x.tif");
        assert_ne!(
            "s3://bkt/a".parse::<DatasetLocation>().unwrap().canonical(),
            "gs://bkt/a".parse::<DatasetLocation>().unwrap().canonical()
        );
        let e = "gs:///x".parse::<DatasetLocation>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "a gs:// dataset needs a bucket: gs://bucket/prefix"
        );
        assert!(matches!(
            StoreUrl::parse("gsx://b"),
            Err(LocationError::NotRemote { .. })
        ));
        assert_eq!(
            "file:///fsx/cells".parse::<DatasetLocation>().unwrap(),
            DatasetLocation::Local("/fsx/cells".into())
        );
    }
}
