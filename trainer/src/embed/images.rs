//! Which images `trainer embed` reads: every TIFF below a folder or an `s3://`, `gs://` or `az://` prefix, in any
//! layout, or the paths a CSV lists; always in one sorted order, so every rank, every shard
//! of an array job and every rerun agree on which image is number `i`.
use crate::config::{DatasetLocation, StoreUrl};
use crate::data::csv::{Csv, CsvError};
use crate::data::index::TIFF_EXTENSIONS;
use crate::data::object_store::Remote;
use crate::data::screen::cell_source::ScreenSource;
use crate::data::ImageSource;
use crate::data::{decode_tiff_into, DataError, ImageChw};
use ::object_store::path::Path as ObjPath;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ImagesError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Csv(#[from] CsvError),
    #[error("{}: cannot list: {source}", path.display())]
    List {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Screen(String),
    #[error("no .tif/.tiff images below {0}")]
    NoImages(String),
    #[error("{}: {count} paths are listed more than once (e.g. {}); each image must be listed once", path.display(), examples.join(", "))]
    DuplicatePaths {
        path: PathBuf,
        count: usize,
        examples: Vec<String>,
    },
    #[error("{}:{line}: the path {given:?} is not relative to --images (no leading '/', no '..')", path.display())]
    NotRelative {
        path: PathBuf,
        line: usize,
        given: String,
    },
}

/// Where the images live.
pub enum Root {
    Local(PathBuf),
    Remote {
        url: StoreUrl,
        remote: Box<Remote>,
    },
    /// A screen's cells, cut from its sites; `table` is its LoadData table or plate as the
    /// config names it.
    Screen {
        table: DatasetLocation,
        source: Arc<ScreenSource>,
        /// `data.screen` and the channels read, as JSON: part of what the job manifest
        /// records, so a rerun with another box size or segmentation is another job.
        settings: String,
    },
}

/// One image file: its path relative to the root ('/'-separated, the key metadata is joined
/// on) and, for a listed object, the store's own path and size.
struct Entry {
    rel: String,
    location: Option<(ObjPath, u64)>,
}

/// The images of one job, sorted by relative path.
pub struct ImageList {
    pub root: Root,
    entries: Entries,
}

enum Entries {
    Files(Vec<Entry>),
    /// A screen's cells by their index in it, in the order of their paths: a screen of
    /// millions of cells keeps one number a cell, its paths made when asked.
    Cells(Arc<ScreenSource>, Vec<usize>),
}

impl Root {
    /// `images` as given on the command line: `s3://`, `gs://` or `az://` bucket/prefix, or a
    /// folder. The store's settings (endpoint, region, plain HTTP) come from its environment
    /// variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`), as any client's of that store.
    pub fn open(images: &str) -> Result<Self, ImagesError> {
        let location: DatasetLocation =
            images
                .parse()
                .map_err(|e: crate::config::LocationError| DataError::StoreConfig {
                    url: images.to_string(),
                    reason: e.to_string(),
                })?;
        match location {
            DatasetLocation::Local(dir) => Ok(Self::Local(dir)),
            DatasetLocation::Remote(url) => {
                let remote = Remote::open(&url, &crate::config::ObjectStoreSection::default())?;
                Ok(Self::Remote {
                    url,
                    remote: Box::new(remote),
                })
            }
        }
    }

    /// The screen the `data` section of `config` names (see `data.screen`).
    pub fn screen(config: &Path) -> Result<Self, ImagesError> {
        let cfg = crate::train::init_layout::load_config(config)
            .map_err(|e| ImagesError::Screen(format!("{}: {e}", config.display())))?;
        Self::screen_of(&cfg, &config.display().to_string())
    }

    /// The screen of a loaded config's `data` section (`origin` names the config in errors):
    /// the pipeline's profiling stage embeds its own run's screen this way.
    pub fn screen_of(cfg: &crate::config::Config, origin: &str) -> Result<Self, ImagesError> {
        let screen = cfg.data.screen.as_ref().ok_or_else(|| {
            ImagesError::Screen(format!(
                "{origin}: data.screen is not set (it names how cells are cut from the screen's sites)"
            ))
        })?;
        let source = crate::data::screen::open::open_screen(&cfg.data, screen)
            .map_err(|e| ImagesError::Data(e.into()))?;
        let settings = serde_json::json!({
            "screen": screen,
            "channels": cfg.data.channel_names,
        })
        .to_string();
        Ok(Self::Screen {
            table: cfg.data.dataset_dir.clone(),
            source: Arc::new(source),
            settings,
        })
    }

    /// The screen whose cells these are, for their metadata.
    pub fn screen_source(&self) -> Option<Arc<ScreenSource>> {
        match self {
            Self::Screen { source, .. } => Some(source.clone()),
            _ => None,
        }
    }

    /// Where `rel` lives, as written into `Metadata_ImagePath` and messages.
    pub fn full_path(&self, rel: &str) -> String {
        match self {
            Self::Local(dir) => dir.join(rel).display().to_string(),
            Self::Remote { url, .. } => url.url_of(rel),
            Self::Screen { table, .. } => format!("{table}/{rel}"),
        }
    }

    /// The root as the job manifest records it: a local folder canonicalised, so the same
    /// folder given relative or absolute is the same job.
    pub fn describe(&self) -> String {
        match self {
            Self::Local(dir) => std::fs::canonicalize(dir)
                .unwrap_or_else(|_| dir.clone())
                .display()
                .to_string(),
            Self::Remote { url, .. } => url.root(),
            Self::Screen {
                table, settings, ..
            } => {
                let table = match table.local().map(std::fs::canonicalize) {
                    Some(Ok(path)) => path.display().to_string(),
                    _ => table.to_string(),
                };
                format!("{table} {settings}")
            }
        }
    }
}

impl ImageList {
    /// Every TIFF below `root` (recursively, hidden files and folders skipped), or, with
    /// `list`, the paths in its `path` column (relative to `root`).
    pub fn open(root: Root, list: Option<&Path>) -> Result<Self, ImagesError> {
        let mut files = match (list, &root) {
            (Some(csv), _) => listed(csv)?,
            (None, Root::Local(dir)) => {
                let mut out = vec![];
                walk(dir, "", &mut out)?;
                out
            }
            (None, Root::Remote { remote, .. }) => remote
                .list()?
                .into_iter()
                .filter(|l| is_tiff(&l.rel) && !l.rel.split('/').any(|p| p.starts_with('.')))
                .map(|l| Entry {
                    rel: l.rel,
                    location: Some((l.location, l.size)),
                })
                .collect(),
            // `{plate}/{well}/{site}/{object}`: sorted, a site's cells stay together.
            (None, Root::Screen { source, .. }) => {
                let mut cells: Vec<usize> = (0..source.cells().len()).collect();
                cells.sort_by(|&a, &b| source.cmp_paths(a, b));
                if cells.is_empty() {
                    return Err(ImagesError::NoImages(root.describe()));
                }
                let source = source.clone();
                return Ok(Self {
                    root,
                    entries: Entries::Cells(source, cells),
                });
            }
        };
        files.sort_by(|a, b| a.rel.cmp(&b.rel));
        if files.is_empty() {
            return Err(ImagesError::NoImages(root.describe()));
        }
        Ok(Self {
            root,
            entries: Entries::Files(files),
        })
    }

    pub fn len(&self) -> usize {
        match &self.entries {
            Entries::Files(f) => f.len(),
            Entries::Cells(_, c) => c.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Image `i`'s path relative to the root.
    pub fn rel(&self, i: usize) -> std::borrow::Cow<'_, str> {
        match &self.entries {
            Entries::Files(f) => f[i].rel.as_str().into(),
            Entries::Cells(source, c) => source.cell_path(c[i]).into(),
        }
    }

    /// Every image's path relative to the root, in order.
    pub fn rels(&self) -> impl Iterator<Item = std::borrow::Cow<'_, str>> {
        (0..self.len()).map(|i| self.rel(i))
    }

    /// For a screen's image: its index among the screen's cells.
    pub fn cell(&self, i: usize) -> Option<usize> {
        match &self.entries {
            Entries::Cells(_, c) => Some(c[i]),
            Entries::Files(_) => None,
        }
    }

    /// For a screen whose cells bring their own channels: the names of image `i`'s, in the
    /// order [`Self::read`] returns them; `None` where every image has every channel.
    pub fn cell_channel_names(&self, i: usize) -> Option<Vec<String>> {
        let Entries::Cells(source, cells) = &self.entries else {
            return None;
        };
        let cell = cells[i];
        let names = source.layout().channels();
        source
            .cell_channels(cell)
            .map(|own| own.iter().map(|&c| names[c].clone()).collect())
    }

    /// Image `i` decoded (the pipeline's decoder), `bytes` reused as the read buffer.
    pub fn read(&self, i: usize, bytes: &mut Vec<u8>) -> Result<ImageChw, DataError> {
        let e = match &self.entries {
            Entries::Cells(source, c) => return Ok(source.read_cell(c[i])?),
            Entries::Files(f) => &f[i],
        };
        let shown = PathBuf::from(self.root.full_path(&e.rel));
        match &self.root {
            Root::Local(dir) => {
                use std::io::Read;
                bytes.clear();
                std::fs::File::open(dir.join(&e.rel))
                    .and_then(|mut f| f.read_to_end(bytes))
                    .map_err(|err| DataError::io(&shown, "reading", err))?;
            }
            Root::Screen { .. } => {
                return Err(DataError::InvalidArgument(format!(
                    "{}: not a cell of the screen",
                    shown.display()
                )))
            }
            Root::Remote { url, remote } => {
                *bytes = match &e.location {
                    Some((location, size)) => remote.get(location, Some(*size))?,
                    None => remote.get(&ObjPath::from(url.key(&e.rel)), None)?,
                };
            }
        }
        let mut img = ImageChw {
            channels: 0,
            height: 0,
            width: 0,
            data: vec![],
        };
        decode_tiff_into(bytes, &shown, &mut img)?;
        Ok(img)
    }
}

fn is_tiff(name: &str) -> bool {
    let lower = name.to_lowercase();
    TIFF_EXTENSIONS.iter().any(|ext| lower.ends_with(ext))
}

/// The TIFFs below `dir/prefix`, relative to `dir`.
fn walk(dir: &Path, prefix: &str, out: &mut Vec<Entry>) -> Result<(), ImagesError> {
    let here = dir.join(prefix);
    let list_err = |source| ImagesError::List {
        path: here.clone(),
        source,
    };
    for item in std::fs::read_dir(&here).map_err(list_err)? {
        let item = item.map_err(list_err)?;
        let name = item.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        // Follows symbolic links, as a dataset tree of links to the real files is common.
        let meta = std::fs::metadata(item.path()).map_err(list_err)?;
        if meta.is_dir() {
            walk(dir, &rel, out)?;
        } else if is_tiff(&name) {
            out.push(Entry {
                rel,
                location: None,
            });
        }
    }
    Ok(())
}

/// The `path` column of `csv`; a path listed twice or not relative is an error.
fn listed(csv: &Path) -> Result<Vec<Entry>, ImagesError> {
    let table = Csv::read(csv)?;
    let col = table.column("path")?;
    let mut seen = std::collections::HashSet::new();
    let mut dups = vec![];
    let mut out = vec![];
    for (line, fields) in &table.rows {
        let rel = normalise_rel(&fields[col]);
        if rel.starts_with('/') || rel.split('/').any(|p| p == "..") {
            return Err(ImagesError::NotRelative {
                path: csv.to_path_buf(),
                line: *line,
                given: fields[col].clone(),
            });
        }
        if !seen.insert(rel.clone()) {
            dups.push(rel);
            continue;
        }
        out.push(Entry {
            rel,
            location: None,
        });
    }
    if !dups.is_empty() {
        return Err(ImagesError::DuplicatePaths {
            path: csv.to_path_buf(),
            count: dups.len(),
            examples: dups.into_iter().take(5).collect(),
        });
    }
    Ok(out)
}

/// A path as a join key: '/'-separated, without a leading `./`.
pub fn normalise_rel(path: &str) -> String {
    let p = path.trim().replace('\\', "/");
    p.trim_start_matches("./").to_string()
}
