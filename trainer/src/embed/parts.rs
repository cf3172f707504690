//! The on-disk state of an embedding job, in `OUT.parquet.parts/`: the job's manifest, one
//! Parquet part per fixed slice of the sorted image list and, beside each, its entry (which
//! images it holds, how many rows, its SHA-256, the images that failed and why). Parts and
//! entries are written atomically, the entry after its part, so after a kill a part either
//! exists with its entry (kept) or is made again: a rerun neither duplicates nor loses a row.
//! Part `k` is images `k·S .. (k+1)·S` whatever the number of ranks or shards, so any split of
//! the work, and any resume of it, produces the same parts.
use super::metadata::MetadataFingerprint;
use crate::analysis::profiles::{
    self, ColumnData, ColumnSpec, ProfileStream, ProfilesError, StreamedTable,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PartsError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Profiles(#[from] ProfilesError),
    #[error("{}: {source}", path.display())]
    Parquet {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("{}: {what}", path.display())]
    Invalid { path: PathBuf, what: String },
    #[error("{} holds parts of another job ({differs} differs: {was} there, {now} now); rerun the same command to resume it, or delete the folder (or choose another --out) to start this one", dir.display())]
    OtherJob {
        dir: PathBuf,
        differs: &'static str,
        was: String,
        now: String,
    },
    #[error("{missing} of {total} parts are not finished in {} (e.g. parts {}); run the embedding (every shard) to the end first", dir.display(), examples.join(", "))]
    Unfinished {
        dir: PathBuf,
        missing: usize,
        total: usize,
        examples: Vec<String>,
    },
}

/// What a job is: a rerun must agree on all of it to reuse the parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobManifest {
    pub images: String,
    pub image_count: usize,
    /// SHA-256 of the sorted relative paths, one per line.
    pub image_list_sha256: String,
    pub part_size: usize,
    pub checkpoint_sha256: String,
    pub channels: Vec<String>,
    /// The metadata columns and what they were made from. Metadata can change between runs
    /// without re-embedding: the merge joins the metadata of the run that merges (so these
    /// are updated, never a reason to refuse the parts).
    pub columns: Vec<String>,
    pub precision: String,
    #[serde(default)]
    pub metadata: MetadataFingerprint,
}

impl JobManifest {
    pub fn parts(&self) -> usize {
        self.image_count.div_ceil(self.part_size)
    }

    /// Image indices of part `k`.
    pub fn range(&self, k: usize) -> std::ops::Range<usize> {
        k * self.part_size..((k + 1) * self.part_size).min(self.image_count)
    }

    /// The first field in which `self` (found on disk) and `now` differ.
    fn difference(&self, now: &Self) -> Option<(&'static str, String, String)> {
        let fields: [(&'static str, String, String); 7] = [
            ("--images", canonical(&self.images), canonical(&now.images)),
            (
                "the image count",
                self.image_count.to_string(),
                now.image_count.to_string(),
            ),
            (
                "the image list",
                self.image_list_sha256.clone(),
                now.image_list_sha256.clone(),
            ),
            (
                "--part-size",
                self.part_size.to_string(),
                now.part_size.to_string(),
            ),
            (
                "the checkpoint",
                self.checkpoint_sha256.clone(),
                now.checkpoint_sha256.clone(),
            ),
            (
                "--channels",
                self.channels.join(","),
                now.channels.join(","),
            ),
            ("--precision", self.precision.clone(), now.precision.clone()),
        ];
        fields.into_iter().find(|(_, a, b)| a != b)
    }
}

/// One finished part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartEntry {
    pub part: usize,
    /// Images `first .. first + images` of the sorted list, the first and last of them.
    pub first: usize,
    pub images: usize,
    pub first_path: String,
    pub last_path: String,
    /// Rows in the part's table (its images less its errors).
    pub rows: usize,
    pub sha256: String,
    /// `(Metadata_ImagePath, reason)` of each image that could not be embedded.
    pub errors: Vec<(String, String)>,
}

/// The parts folder of a job.
pub struct Parts {
    pub dir: PathBuf,
    pub job: JobManifest,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PartsError + '_ {
    move |source| PartsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The parts folder beside `out`: `OUT.parquet.parts/`.
pub fn parts_dir(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_os_string();
    name.push(".parts");
    PathBuf::from(name)
}

/// The errors table beside `out`: `OUT.errors.parquet` (`x.parquet` → `x.errors.parquet`).
pub fn errors_path(out: &Path) -> PathBuf {
    let stem = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = stem.strip_suffix(".parquet").unwrap_or(&stem);
    out.with_file_name(format!("{stem}.errors.parquet"))
}

impl Parts {
    /// Opens (or starts) the parts of `job` in `dir`; parts of another job are refused.
    pub fn open(dir: &Path, job: JobManifest) -> Result<Self, PartsError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join("manifest.json");
        match std::fs::read(&path) {
            Ok(bytes) => {
                let found: JobManifest =
                    serde_json::from_slice(&bytes).map_err(|e| PartsError::Invalid {
                        path: path.clone(),
                        what: format!("not a job manifest: {e}"),
                    })?;
                if let Some((differs, was, now)) = found.difference(&job) {
                    return Err(PartsError::OtherJob {
                        dir: dir.to_path_buf(),
                        differs,
                        was,
                        now,
                    });
                }
                if (&found.columns, &found.metadata) != (&job.columns, &job.metadata) {
                    tracing::info!(
                        "embed: the metadata differs from the run that made the parts (columns [{}] from {:?}, now [{}] from {:?}); the parts' features are kept and the table is joined with this run's metadata",
                        found.columns.join(", "),
                        found.metadata,
                        job.columns.join(", "),
                        job.metadata
                    );
                    write_manifest(&path, &job)?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_manifest(&path, &job)?,
            Err(e) => return Err(io(&path)(e)),
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            job,
        })
    }

    pub fn part_path(&self, k: usize) -> PathBuf {
        self.dir.join(format!("part-{k:07}.parquet"))
    }

    fn entry_path(&self, k: usize) -> PathBuf {
        self.dir.join(format!("part-{k:07}.json"))
    }

    /// The entry of part `k` when the part is finished and intact; a part whose file does
    /// not match its entry's SHA-256 counts as not finished (it is made again).
    pub fn finished(&self, k: usize) -> Result<Option<PartEntry>, PartsError> {
        let path = self.entry_path(k);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path)(e)),
        };
        let entry: PartEntry = serde_json::from_slice(&bytes).map_err(|e| PartsError::Invalid {
            path: path.clone(),
            what: format!("not a part entry: {e}"),
        })?;
        let part = self.part_path(k);
        let sha = match crate::data::shards::pack::sha256_file(&part) {
            Ok((_, sha)) => sha,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&part)(e)),
        };
        if sha != entry.sha256 || entry.part != k || entry.first != self.job.range(k).start {
            tracing::warn!(
                "{}: does not match its entry; it is made again",
                part.display()
            );
            return Ok(None);
        }
        Ok(Some(entry))
    }

    /// Writes part `k` (its table's bytes) and then its entry, each atomically.
    pub fn commit(&self, k: usize, table: &[u8], mut entry: PartEntry) -> Result<(), PartsError> {
        let part = self.part_path(k);
        scdino_base::fs::write_atomic(&part, table).map_err(io(&part))?;
        entry.sha256 = format!("{:x}", Sha256::digest(table));
        let path = self.entry_path(k);
        let json = serde_json::to_vec(&entry).expect("an entry serializes");
        scdino_base::fs::write_atomic(&path, &json).map_err(io(&path))
    }

    /// Every part's entry, or an error counting the unfinished ones.
    pub fn all_finished(&self) -> Result<Vec<PartEntry>, PartsError> {
        let total = self.job.parts();
        let mut entries = Vec::with_capacity(total);
        let mut missing = vec![];
        for k in 0..total {
            match self.finished(k)? {
                Some(e) => entries.push(e),
                None => missing.push(k),
            }
        }
        if !missing.is_empty() {
            return Err(PartsError::Unfinished {
                dir: self.dir.clone(),
                missing: missing.len(),
                total,
                examples: missing.iter().take(5).map(|k| k.to_string()).collect(),
            });
        }
        Ok(entries)
    }

    /// Copies every part, in order, into `out` (streamed: one part in memory at a time;
    /// written to a temporary file and renamed), and the errors of all parts into
    /// `errors_out`. `rejoin` gives each part its metadata columns as the merging run has
    /// them (before it is written), so a rerun with corrected metadata corrects the table.
    /// Returns the rows and the errors written.
    pub fn merge(
        &self,
        out: &Path,
        errors_out: &Path,
        rejoin: &dyn Fn(&PartEntry, &mut StreamedTable) -> Result<(), PartsError>,
    ) -> Result<(usize, usize), PartsError> {
        let entries = self.all_finished()?;
        let tmp = self.dir.join(".merged.parquet.tmp");
        let file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        let pq = |source| PartsError::Parquet {
            path: out.to_path_buf(),
            source,
        };
        let mut stream: Option<ProfileStream<std::io::BufWriter<std::fs::File>>> = None;
        let mut rows = 0;
        let mut writer = Some(std::io::BufWriter::new(file));
        for e in &entries {
            let mut part = profiles::read_streamed(&self.part_path(e.part))?;
            rejoin(e, &mut part)?;
            if part.rows != e.rows {
                return Err(PartsError::Invalid {
                    path: self.part_path(e.part),
                    what: format!("{} rows, its entry says {}", part.rows, e.rows),
                });
            }
            if stream.is_none() {
                let w = writer.take().expect("the writer is taken once");
                stream = Some(ProfileStream::new(w, part.columns.clone(), part.dim).map_err(pq)?);
            }
            let s = stream.as_mut().expect("opened above");
            if part.rows > 0 {
                s.write_group(&part.column_data(), &part.values)
                    .map_err(pq)?;
            }
            rows += part.rows;
        }
        let stream = stream.ok_or_else(|| PartsError::Invalid {
            path: self.dir.clone(),
            what: "no parts".into(),
        })?;
        let file = stream
            .finish()
            .map_err(pq)?
            .into_inner()
            .map_err(|e| io(&tmp)(e.into_error()))?;
        file.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, out).map_err(io(out))?;
        scdino_base::fs::sync_dir(out.parent().unwrap_or(Path::new(".")));
        let errors: Vec<&(String, String)> = entries.iter().flat_map(|e| &e.errors).collect();
        write_errors(errors_out, &errors)?;
        Ok((rows, errors.len()))
    }
}

/// A local folder as its canonical path (manifests written before `--images` was recorded
/// so may hold it relative); anything else as written.
fn canonical(images: &str) -> String {
    std::fs::canonicalize(images)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| images.to_string())
}

fn write_manifest(path: &Path, job: &JobManifest) -> Result<(), PartsError> {
    let json = serde_json::to_vec_pretty(job).expect("a manifest serializes");
    scdino_base::fs::write_atomic(path, &json).map_err(io(path))
}

/// The errors table: `Metadata_ImagePath`, `reason`, one row per image not embedded.
fn write_errors(path: &Path, errors: &[&(String, String)]) -> Result<(), PartsError> {
    let pq = |source| PartsError::Parquet {
        path: path.to_path_buf(),
        source,
    };
    let columns = vec![
        ColumnSpec::string("Metadata_ImagePath", false),
        ColumnSpec::string("reason", false),
    ];
    let (paths, reasons): (Vec<String>, Vec<String>) = errors.iter().map(|e| (*e).clone()).unzip();
    let mut stream = ProfileStream::new(Vec::new(), columns, 0).map_err(pq)?;
    stream
        .write_group(
            &[ColumnData::Strings(&paths), ColumnData::Strings(&reasons)],
            &[],
        )
        .map_err(pq)?;
    let bytes = stream.finish().map_err(pq)?;
    scdino_base::fs::write_atomic(path, &bytes).map_err(io(path))
}
