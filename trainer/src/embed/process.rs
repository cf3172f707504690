//! One `trainer embed` process: lists the images, works through its share of the parts (the
//! parts of its rank in its shard), and merges them when it is the one to (rank 0 of an
//! unsharded job once every rank is done, or `--merge`).
use super::images::{ImageList, ImagesError, Root};
use super::metadata::{
    Metadata, MetadataCsv, MetadataError, PathPattern, CHANNELS, CHECKPOINT, EPOCH, IMAGE_PATH,
};
use super::model::{Model, ModelError};
use super::parts::{self, JobManifest, PartEntry, Parts, PartsError};
use crate::analysis::profiles::{
    ColumnData, ColumnSpec, OwnedColumn, ProfileStream, StreamedTable,
};
use crate::distributed::env::DistEnv;
use crate::distributed::group::ProcessGroup;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tch::{Device, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error(transparent)]
    Images(#[from] ImagesError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Parts(#[from] PartsError),
    #[error(transparent)]
    Dist(#[from] crate::distributed::group::DistError),
    #[error(transparent)]
    DistEnv(#[from] crate::distributed::env::DistEnvError),
    #[error("{path}: {reason} (--on-error fail; --on-error skip records such images in the errors table and goes on)")]
    Image { path: String, reason: String },
    #[error("--shard-index {index} is not below --shard-count {count}")]
    Shard { index: usize, count: usize },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing a part: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
}

/// Where the config naming a screen comes from.
#[derive(Debug, Clone)]
pub enum ScreenOf {
    /// A config file (`trainer embed --screen FILE`).
    File(PathBuf),
    /// A config already loaded (the pipeline's own run); the text names it in errors.
    Config(crate::config::Config, String),
}

/// What to do with an image that cannot be embedded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnError {
    /// Record it in the errors table and go on.
    Skip,
    /// Stop the job with the error.
    Fail,
}

pub struct EmbedOptions {
    pub checkpoint: PathBuf,
    pub images: String,
    /// A config whose `data.screen` names a screen to embed instead of `images`.
    pub screen: Option<ScreenOf>,
    pub out: PathBuf,
    pub list: Option<PathBuf>,
    pub metadata: Option<PathBuf>,
    pub path_pattern: Option<String>,
    pub channels: Option<Vec<String>>,
    pub on_error: OnError,
    /// None: the run's `downstream.features.batch_size_per_gpu`.
    pub batch_size: Option<usize>,
    pub device: Device,
    pub bf16: bool,
    /// `(index, count)` of a Slurm array task.
    pub shard: Option<(usize, usize)>,
    pub merge_only: bool,
    pub part_size: usize,
    /// Threads reading and preparing images ahead of the forward passes.
    pub readers: usize,
}

/// What one process did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EmbedSummary {
    pub images: usize,
    /// Parts this process embedded, and found already finished.
    pub parts_embedded: usize,
    pub parts_kept: usize,
    /// Images of its parts it could not embed.
    pub errors: usize,
    /// Rows and errors of the merged table, when this process merged.
    pub merged: Option<(usize, usize)>,
    /// The metadata report (empty when everything lined up).
    pub metadata_report: Vec<String>,
}

/// How long ranks wait for each other at the end (the slowest rank's share).
const RANK_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

pub fn run(opts: &EmbedOptions) -> Result<EmbedSummary, EmbedError> {
    let env = DistEnv::from_process_env()?;
    let (shard, shards) = opts.shard.unwrap_or((0, 1));
    if shard >= shards {
        return Err(EmbedError::Shard {
            index: shard,
            count: shards,
        });
    }
    // Ranks meet first, so a rank that cannot start is known at once, not after the work.
    let mut group = (env.world > 1 && !opts.merge_only)
        .then(|| {
            ProcessGroup::new(
                &env.master_addr,
                env.master_port,
                env.rank,
                env.world,
                RANK_WAIT,
                false,
            )
        })
        .transpose()?;
    let root = match &opts.screen {
        Some(ScreenOf::File(config)) => Root::screen(config)?,
        Some(ScreenOf::Config(cfg, origin)) => Root::screen_of(cfg, origin)?,
        None => Root::open(&opts.images)?,
    };
    let list = ImageList::open(root, opts.list.as_deref())?;
    let metadata = Metadata {
        screen: list
            .root
            .screen_source()
            .map(super::metadata::ScreenMetadata::new),
        pattern: opts
            .path_pattern
            .as_deref()
            .map(PathPattern::parse)
            .transpose()?,
        csv: opts
            .metadata
            .as_deref()
            .map(MetadataCsv::read)
            .transpose()?,
    };
    let columns = metadata.columns()?;
    let report = metadata.report(list.rels());
    let lines = report.lines(opts.path_pattern.as_deref(), opts.metadata.as_deref());
    let leader = env.rank == 0 && (shard == 0 || opts.merge_only);
    if leader {
        for l in &lines {
            tracing::warn!("metadata: {l}");
        }
    }
    let model = (!opts.merge_only)
        .then(|| {
            Model::load(
                &opts.checkpoint,
                opts.channels.as_deref(),
                opts.device,
                opts.bf16,
            )
        })
        .transpose()?;
    let job = job_manifest(opts, &list, &metadata, &columns, model.as_ref())?;
    let parts = open_parts(opts, job, model.as_ref())?;
    let mut summary = EmbedSummary {
        images: list.len(),
        metadata_report: lines,
        ..Default::default()
    };
    if let Some(model) = &model {
        let workers = shards * env.world;
        let worker = shard * env.world + env.rank;
        let total = parts.job.parts();
        let mine = total * worker / workers..total * (worker + 1) / workers;
        let ctx = Context {
            opts,
            reader: Reader {
                list: &list,
                preparer: &model.preparer,
                wanted: &model.channel_names,
                threads: opts.readers,
            },
            metadata: &metadata,
            columns: &columns,
            model,
        };
        ctx.embed_parts(&parts, mine, &mut summary)?;
    }
    if opts.shard.is_some() && !opts.merge_only {
        return Ok(summary);
    }
    if let Some(g) = group.as_mut() {
        g.barrier()?;
    }
    if env.rank == 0 {
        let errors_out = parts::errors_path(&opts.out);
        let rejoin = |e: &PartEntry, part: &mut StreamedTable| {
            rejoin_metadata(&list, &metadata, &columns, e, part)
        };
        let (rows, errors) = parts.merge(&opts.out, &errors_out, &rejoin)?;
        summary.merged = Some((rows, errors));
    }
    Ok(summary)
}

/// What a part's outputs depend on, recorded with the parts so a rerun with other inputs is
/// refused or re-joined rather than mixed.
fn job_manifest(
    opts: &EmbedOptions,
    list: &ImageList,
    metadata: &Metadata,
    columns: &[String],
    model: Option<&Model>,
) -> Result<JobManifest, EmbedError> {
    Ok(JobManifest {
        images: list.root.describe(),
        image_count: list.len(),
        image_list_sha256: list_sha256(list),
        part_size: opts.part_size.max(1),
        checkpoint_sha256: crate::analysis::pretrained::checkpoint_sha256(&opts.checkpoint)
            .map_err(|source| EmbedError::Io {
                path: opts.checkpoint.clone(),
                source,
            })?,
        channels: model
            .map(|m| m.channel_names.clone())
            .or_else(|| opts.channels.clone())
            .unwrap_or_default(),
        columns: columns.to_vec(),
        precision: if opts.bf16 { "bf16" } else { "fp32" }.into(),
        metadata: metadata.fingerprint(),
    })
}

/// The parts folder; without a model (`--merge`) the channels are those the parts were made
/// with, read from the manifest on disk.
fn open_parts(
    opts: &EmbedOptions,
    mut job: JobManifest,
    model: Option<&Model>,
) -> Result<Parts, EmbedError> {
    let dir = parts::parts_dir(&opts.out);
    if model.is_none() && opts.channels.is_none() {
        if let Ok(bytes) = std::fs::read(dir.join("manifest.json")) {
            if let Ok(found) = serde_json::from_slice::<JobManifest>(&bytes) {
                job.channels = found.channels;
            }
        }
    }
    Ok(Parts::open(&dir, job)?)
}

/// Replaces the metadata columns of part `e` (read back as `part`) by this run's: its rows
/// are the images of its range less its errors, in order.
fn rejoin_metadata(
    list: &ImageList,
    metadata: &Metadata,
    columns: &[String],
    e: &PartEntry,
    part: &mut StreamedTable,
) -> Result<(), PartsError> {
    let invalid = |what: String| PartsError::Invalid {
        path: PathBuf::from(format!("part {}", e.part)),
        what,
    };
    let failed: std::collections::HashSet<&str> =
        e.errors.iter().map(|(p, _)| p.as_str()).collect();
    // Its rows: each image of its range with its path as this run spells `--images` (the
    // image list is the parts' own: the manifest holds its SHA-256), less its errors.
    if e.first + e.images > list.len() {
        return Err(invalid("its images are beyond the image list".into()));
    }
    let (kept, paths): (Vec<usize>, Vec<String>) = (e.first..e.first + e.images)
        .map(|i| (i, list.root.full_path(&list.rel(i))))
        .filter(|(_, path)| !failed.contains(path.as_str()))
        .unzip();
    let find = |name: &str| part.columns.iter().position(|c| c.name() == name);
    if kept.len() != part.rows {
        return Err(invalid(format!(
            "{} rows for {} images without errors",
            part.rows,
            kept.len()
        )));
    }
    let mut values: Vec<Vec<String>> = vec![Vec::with_capacity(kept.len()); columns.len()];
    for &i in &kept {
        for (c, v) in metadata
            .values(&list.rel(i), list.cell(i))
            .into_iter()
            .enumerate()
        {
            values[c].push(v);
        }
    }
    let mut specs = vec![ColumnSpec::string(IMAGE_PATH, false)];
    let mut data = vec![OwnedColumn::Strings(paths)];
    for (name, v) in columns.iter().zip(values) {
        specs.push(ColumnSpec::string(name, true));
        data.push(OwnedColumn::Strings(v));
    }
    for name in [CHECKPOINT, EPOCH, CHANNELS] {
        let i = find(name).ok_or_else(|| invalid(format!("no {name} column")))?;
        specs.push(part.columns[i].clone());
        data.push(std::mem::replace(
            &mut part.data[i],
            OwnedColumn::Strings(vec![]),
        ));
    }
    part.columns = specs;
    part.data = data;
    Ok(())
}

fn list_sha256(list: &ImageList) -> String {
    let mut h = Sha256::new();
    for rel in list.rels() {
        h.update(rel.as_bytes());
        h.update(b"\n");
    }
    format!("{:x}", h.finalize())
}

/// One batch read and prepared: the image indices embedded, their inputs, and the failures.
struct Prepared {
    ok: Vec<usize>,
    inputs: Vec<Tensor>,
    failed: Vec<(usize, String)>,
}

struct Context<'a> {
    opts: &'a EmbedOptions,
    reader: Reader<'a>,
    metadata: &'a Metadata,
    columns: &'a [String],
    model: &'a Model,
}

impl Context<'_> {
    /// Embeds the unfinished parts of `mine`, logging progress with images/s.
    fn embed_parts(
        &self,
        parts: &Parts,
        mine: std::ops::Range<usize>,
        summary: &mut EmbedSummary,
    ) -> Result<(), EmbedError> {
        let mut todo = vec![];
        for k in mine {
            match parts.finished(k)? {
                Some(_) => summary.parts_kept += 1,
                None => todo.push(k),
            }
        }
        let images: usize = todo.iter().map(|&k| parts.job.range(k).len()).sum();
        if summary.parts_kept > 0 {
            tracing::info!(
                "embed: {} parts already finished, kept; {} to do ({images} images)",
                summary.parts_kept,
                todo.len()
            );
        }
        let start = Instant::now();
        let mut last = Instant::now();
        let mut done = 0;
        for k in todo {
            let entry = self.embed_part(parts, k)?;
            done += entry.images;
            summary.errors += entry.errors.len();
            summary.parts_embedded += 1;
            if last.elapsed() >= Duration::from_secs(5) || done == images {
                last = Instant::now();
                let rate = done as f64 / start.elapsed().as_secs_f64().max(1e-9);
                tracing::info!(
                    "embed: {done}/{images} images, {rate:.1} images/s, {} errors",
                    summary.errors
                );
            }
        }
        Ok(())
    }

    /// Embeds part `k` and commits it.
    fn embed_part(&self, parts: &Parts, k: usize) -> Result<PartEntry, EmbedError> {
        let range = parts.job.range(k);
        let batch = self.opts.batch_size.unwrap_or(self.model.batch_size).max(1);
        let idx: Vec<usize> = range.clone().collect();
        let mut rows = Vec::new();
        let mut values: Vec<f32> = Vec::with_capacity(range.len() * self.model.dim);
        let mut errors = vec![];
        // The next batch is read and prepared while this one runs through the backbone.
        std::thread::scope(|s| -> Result<(), EmbedError> {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Prepared>(1);
            let chunks: Vec<&[usize]> = idx.chunks(batch).collect();
            let n = chunks.len();
            let reader = &self.reader;
            s.spawn(move || {
                for chunk in chunks {
                    if tx.send(reader.prepare(chunk)).is_err() {
                        return;
                    }
                }
            });
            for prepared in rx.iter().take(n) {
                for (i, reason) in prepared.failed {
                    self.failed(i, reason, &mut errors)?;
                }
                if prepared.inputs.is_empty() {
                    continue;
                }
                match self.model.embed(&prepared.inputs) {
                    Ok(f) => {
                        values.extend(features_of(&f));
                        rows.extend(prepared.ok);
                    }
                    // One image the backbone cannot take must not cost the batch: each is
                    // run alone, and the ones that still fail are errors naming the file.
                    Err(_) => {
                        for (x, i) in prepared.inputs.iter().zip(prepared.ok) {
                            match self.model.embed(std::slice::from_ref(x)) {
                                Ok(f) => {
                                    values.extend(features_of(&f));
                                    rows.push(i);
                                }
                                Err(reason) => self.failed(
                                    i,
                                    format!("part {k}: the backbone failed on it: {reason}"),
                                    &mut errors,
                                )?,
                            }
                        }
                    }
                }
            }
            Ok(())
        })?;
        let table = self.part_table(&rows, &values)?;
        let entry = PartEntry {
            part: k,
            first: range.start,
            images: range.len(),
            first_path: self.reader.list.rel(range.start).into_owned(),
            last_path: self.reader.list.rel(range.end - 1).into_owned(),
            rows: rows.len(),
            sha256: String::new(),
            errors,
        };
        parts.commit(k, &table, entry.clone())?;
        Ok(entry)
    }

    /// Image `i` could not be embedded: the job stops with `reason` (`--on-error fail`) or
    /// the image goes to the errors table.
    fn failed(
        &self,
        i: usize,
        reason: String,
        errors: &mut Vec<(String, String)>,
    ) -> Result<(), EmbedError> {
        let path = self.reader.list.root.full_path(&self.reader.list.rel(i));
        if self.opts.on_error == OnError::Fail {
            return Err(EmbedError::Image { path, reason });
        }
        errors.push((path, reason));
        Ok(())
    }

    /// The part's table: `Metadata_ImagePath`, the metadata columns, `Metadata_Checkpoint`,
    /// `Metadata_Epoch`, `Metadata_Channels`, then the features.
    fn part_table(&self, rows: &[usize], values: &[f32]) -> Result<Vec<u8>, EmbedError> {
        let mut specs = vec![ColumnSpec::string(IMAGE_PATH, false)];
        specs.extend(self.columns.iter().map(|c| ColumnSpec::string(c, true)));
        specs.push(ColumnSpec::string(CHECKPOINT, false));
        specs.push(ColumnSpec::Int { name: EPOCH.into() });
        specs.push(ColumnSpec::string(CHANNELS, false));
        let n = rows.len();
        let mut strings: Vec<Vec<String>> = vec![Vec::with_capacity(n); self.columns.len() + 1];
        for &i in rows {
            let list = self.reader.list;
            let rel = list.rel(i);
            strings[0].push(list.root.full_path(&rel));
            for (c, v) in self
                .metadata
                .values(&rel, list.cell(i))
                .into_iter()
                .enumerate()
            {
                strings[c + 1].push(v);
            }
        }
        let checkpoint = vec![self.model.checkpoint.clone(); n];
        let epochs = vec![self.model.epoch.map(|e| e as i64); n];
        let channels = vec![self.model.channel_names.join("+"); n];
        let mut data: Vec<ColumnData> = strings.iter().map(|v| ColumnData::Strings(v)).collect();
        data.push(ColumnData::Strings(&checkpoint));
        data.push(ColumnData::Ints(&epochs));
        data.push(ColumnData::Strings(&channels));
        let mut stream = ProfileStream::new(Vec::new(), specs, self.model.dim)?;
        stream.write_group(&data, values)?;
        Ok(stream.finish()?)
    }
}

/// The values of a float `[B, D]` CPU tensor, row-major.
fn features_of(f: &Tensor) -> Vec<f32> {
    let flat = f.flatten(0, -1);
    let n = flat.numel();
    let mut out = vec![0f32; n];
    flat.copy_data(&mut out, n);
    out
}

/// Reads and prepares images; shared by the reading threads (no tensors of its own).
struct Reader<'a> {
    list: &'a ImageList,
    preparer: &'a crate::analysis::features::Preparer,
    /// The channels embedded, by name (a cell with its own channels must hold them all).
    wanted: &'a [String],
    threads: usize,
}

impl Reader<'_> {
    /// Reads and prepares `chunk` on [`EmbedOptions::readers`] threads.
    fn prepare(&self, chunk: &[usize]) -> Prepared {
        let threads = self.threads.clamp(1, chunk.len().max(1));
        let per = chunk.len().div_ceil(threads).max(1);
        let results: Vec<(usize, Result<Tensor, String>)> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .chunks(per)
                .map(|part| {
                    s.spawn(move || {
                        let mut bytes = vec![];
                        part.iter()
                            .map(|&i| {
                                // A panic while decoding or preparing one image (a defect,
                                // but one a strange file can reach) is that image's error.
                                let r =
                                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                        self.prepare_one(i, &mut bytes)
                                    }))
                                    .unwrap_or_else(|p| {
                                        Err(format!(
                                            "reading it panicked: {}",
                                            crate::analysis::features::panic_message(p.as_ref())
                                        ))
                                    });
                                (i, r)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("an image reader panicked"))
                .collect()
        });
        let mut out = Prepared {
            ok: vec![],
            inputs: vec![],
            failed: vec![],
        };
        for (i, r) in results {
            match r {
                Ok(t) => {
                    out.ok.push(i);
                    out.inputs.push(t);
                }
                Err(reason) => out.failed.push((i, reason)),
            }
        }
        out
    }

    fn prepare_one(&self, i: usize, bytes: &mut Vec<u8>) -> Result<Tensor, String> {
        let path = PathBuf::from(self.list.root.full_path(&self.list.rel(i)));
        let raw = self.list.read(i, bytes).map_err(|e| e.to_string())?;
        // A cell with its own channels (`cell_channels: own`): the wanted ones among them.
        let within = match self.list.cell_channel_names(i) {
            None => None,
            Some(held) => Some(
                self.wanted
                    .iter()
                    .map(|w| held.iter().position(|h| h == w))
                    .collect::<Option<Vec<usize>>>()
                    .ok_or_else(|| {
                        format!(
                            "{}: holds the channels [{}], not every one of [{}] \
                             (data.screen.cell_channels: own)",
                            path.display(),
                            held.join(", "),
                            self.wanted.join(", ")
                        )
                    })?,
            ),
        };
        self.preparer
            .prepare(&raw, within.as_deref(), &path)
            .map_err(|e| e.to_string())
    }
}
