//! Reading the files a screen's tables name: local paths (absolute, or relative to the table
//! that names them) and `s3://`, `gs://`, `az://` URLs, each bucket through one client that
//! every loader thread shares.
use super::ranged_object::RangedObject;
use super::ScreenError;
use crate::config::{ObjectStoreSection, StoreUrl};
use crate::data::object_store::Remote;
use crate::data::DataError;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where a table lives, so the relative paths it names can be resolved against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    Dir(PathBuf),
    /// A store URL of a "directory", without trailing '/'.
    Url(String),
}

impl Base {
    /// The folder (or URL prefix) holding `address`.
    pub fn of(address: &str) -> Self {
        if is_url(address) {
            let dir = address.rsplit_once('/').map_or(address, |(d, _)| d);
            Self::Url(dir.to_string())
        } else {
            let parent = Path::new(address).parent().unwrap_or(Path::new(""));
            Self::Dir(parent.to_path_buf())
        }
    }

    /// `path` as named in a table: a URL or absolute path as is, anything else below `self`.
    pub fn resolve(&self, path: &str) -> String {
        if is_url(path) || Path::new(path).is_absolute() {
            return path.to_string();
        }
        match self {
            Self::Dir(d) => d.join(path).display().to_string(),
            Self::Url(u) => format!("{u}/{}", path.trim_start_matches("./")),
        }
    }
}

/// True for the store URLs the trainer reads.
pub fn is_url(address: &str) -> bool {
    ["s3://", "gs://", "az://"]
        .iter()
        .any(|s| address.starts_with(s))
}

/// Reads whole files by address, opening one object-store client per bucket on first use.
pub struct Files {
    settings: ObjectStoreSection,
    stores: Mutex<HashMap<String, Arc<Remote>>>,
}

impl Files {
    pub fn new(settings: &ObjectStoreSection) -> Self {
        Self {
            settings: settings.clone(),
            stores: Mutex::new(HashMap::new()),
        }
    }

    /// The bytes of `address` (a local path or a store URL).
    pub fn read(&self, address: &str) -> Result<Vec<u8>, ScreenError> {
        if !is_url(address) {
            return std::fs::read(address).map_err(|e| DataError::io(address, "reading", e).into());
        }
        let url = StoreUrl::parse(address).map_err(|e| DataError::StoreConfig {
            url: address.to_string(),
            reason: e.to_string(),
        })?;
        let remote = self.remote(&url)?;
        let key = ::object_store::path::Path::from(url.prefix());
        Ok(remote.get(&key, None)?)
    }

    /// [`Self::read`] as text; a name ending in `.gz` is decompressed (the Cell Painting
    /// Gallery's `load_data.csv.gz`).
    pub fn read_text(&self, address: &str) -> Result<String, ScreenError> {
        let bytes = self.read(address)?;
        let bytes = if address.ends_with(".gz") {
            use std::io::Read;
            let mut out = Vec::new();
            flate2::read::MultiGzDecoder::new(&bytes[..])
                .read_to_end(&mut out)
                .map_err(|e| DataError::io(address, "decompressing", e))?;
            out
        } else {
            bytes
        };
        String::from_utf8(bytes)
            .map_err(|e| ScreenError::table(address, format!("not UTF-8 text: {e}")))
    }

    /// The text of `address` (`.gz` decompressed) as a stream, never whole (an object table of
    /// a plate can hold millions of rows and thousands of columns): a local file is read as it
    /// is parsed, a store object in ranges as it is parsed.
    pub fn open_text(&self, address: &str) -> Result<Box<dyn std::io::BufRead>, ScreenError> {
        use std::io::BufReader;
        let input: Box<dyn std::io::Read> = if is_url(address) {
            Box::new(self.open_object(address)?.reader(0))
        } else {
            Box::new(
                std::fs::File::open(address)
                    .map_err(|e| ScreenError::from(DataError::io(address, "reading", e)))?,
            )
        };
        Ok(if address.ends_with(".gz") {
            Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(input)))
        } else {
            Box::new(BufReader::new(input))
        })
    }

    /// The store object `address` (a store URL), read in ranges as it is consumed.
    pub fn open_object(&self, address: &str) -> Result<RangedObject, ScreenError> {
        let url = StoreUrl::parse(address).map_err(|e| DataError::StoreConfig {
            url: address.to_string(),
            reason: e.to_string(),
        })?;
        Ok(RangedObject::open(self.remote(&url)?, url.prefix())?)
    }

    /// The client of `url`'s bucket, opened once.
    fn remote(&self, url: &StoreUrl) -> Result<Arc<Remote>, ScreenError> {
        let bucket = format!("{}://{}", url.scheme().as_str(), url.bucket());
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = stores.get(&bucket) {
            return Ok(r.clone());
        }
        let root = StoreUrl::parse(&bucket).map_err(|e| DataError::StoreConfig {
            url: bucket.clone(),
            reason: e.to_string(),
        })?;
        let remote = Arc::new(Remote::open(&root, &self.settings)?);
        stores.insert(bucket, remote.clone());
        Ok(remote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_resolve_against_the_table() {
        let local = Base::of("/data/plate1/load_data.csv");
        assert_eq!(local, Base::Dir("/data/plate1".into()));
        assert_eq!(local.resolve("Images/a.tiff"), "/data/plate1/Images/a.tiff");
        assert_eq!(local.resolve("/abs/a.tiff"), "/abs/a.tiff");
        assert_eq!(local.resolve("s3://b/k.tiff"), "s3://b/k.tiff");
        let remote = Base::of("s3://cpg/src/load_data.csv.gz");
        assert_eq!(
            remote.resolve("./Images/a.tiff"),
            "s3://cpg/src/Images/a.tiff"
        );
        assert_eq!(Base::of("table.csv").resolve("a.tiff"), "a.tiff");
    }
}
