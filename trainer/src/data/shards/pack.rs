//! `trainer data pack`: write any [`ImageSource`] as shards, resumably.
//!
//! Each shard is written to a temporary name, fsynced and renamed, and only then recorded in
//! the journal (itself replaced atomically), so an interrupted run leaves complete shards and
//! at most one stray temporary file. The assignment of samples to shards is a pure function of
//! the settings and the sample list (the "plan"), and the bytes are reproducible, so a rerun
//! verifies recorded shards by sha256, keeps the good ones and rewrites from the first bad or
//! missing one. A directory packed with another plan is refused rather than mixed.
use super::tar::{member_span, TarWriter, END_SPAN};
use super::{
    hex, join_root, sample_key, shard_file_name, MemberMeta, PackSettings, SampleEntry, ShardEntry,
    ShardIndexFile, FORMAT, INDEX_FILE, JOURNAL_FILE,
};
use crate::data::data_error::DataError;
use crate::data::image_source::ImageSource;
use scdino_base::fs::write_atomic;
use scdino_base::rng::SplitMix64;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct PackOptions {
    pub out: PathBuf,
    /// A shard is closed before it would exceed this size (it always takes one sample).
    pub max_shard_bytes: u64,
    /// And after this many samples (0 = no limit).
    pub max_shard_samples: usize,
    /// Shuffle samples across shards (seeded) so sequential reads mix classes.
    pub shuffle: bool,
    pub seed: u64,
}

/// What `pack` reports as it goes.
#[derive(Debug, Clone)]
pub enum PackEvent {
    /// A shard from an earlier run verified and kept.
    Verified {
        shard: usize,
        samples: usize,
        bytes: u64,
    },
    /// A shard written now.
    Written {
        shard: usize,
        samples: usize,
        bytes: u64,
        done: usize,
        total: usize,
    },
    /// A recorded shard was missing or damaged and is rewritten from here on.
    Damaged { shard: usize, reason: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct PackSummary {
    pub shards: usize,
    pub samples: usize,
    pub bytes: u64,
    pub written_shards: usize,
    pub verified_shards: usize,
    /// Samples read from the source in this run.
    pub written_samples: usize,
    pub seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Journal {
    format: String,
    plan: String,
    shards: Vec<JournalShard>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JournalShard {
    entry: ShardEntry,
    /// (position, offset, length, crc32) in member order.
    members: Vec<(usize, u64, u64, u32)>,
}

/// sha256 over everything that decides the shards' content.
fn plan_hash(
    opts: &PackOptions,
    root: &str,
    depth: usize,
    rel: &[String],
    src: &dyn ImageSource,
) -> String {
    let index = src.index();
    let mut h = Sha256::new();
    let mut put = |s: &str| {
        h.update((s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    put(FORMAT);
    put(&format!(
        "{} {} {} {} {depth}",
        opts.seed, opts.shuffle, opts.max_shard_bytes, opts.max_shard_samples
    ));
    put(root);
    for c in &index.classes {
        put(c);
    }
    for (s, r) in index.samples.iter().zip(rel) {
        put(r);
        put(&s.label);
        put(&s.class_index.to_string());
    }
    hex(&h.finalize())
}

fn path_str<'a>(p: &'a Path, what: &str) -> Result<&'a str, DataError> {
    p.to_str().ok_or_else(|| {
        DataError::InvalidArgument(format!(
            "{what} {} is not valid UTF-8; shards store paths as JSON strings",
            p.display()
        ))
    })
}

/// Paths relative to the root, exactly invertible by [`join_root`].
fn relative_paths(src: &dyn ImageSource) -> Result<(String, Vec<String>), DataError> {
    let index = src.index();
    let root = path_str(&index.root, "dataset root")?.to_string();
    let rel = index
        .samples
        .iter()
        .map(|s| {
            let p = path_str(&s.path, "image path")?;
            let r = p
                .strip_prefix(&root)
                .map(|r| {
                    if root.is_empty() || root.ends_with('/') {
                        r
                    } else {
                        r.strip_prefix('/').unwrap_or("\0")
                    }
                })
                .filter(|r| join_root(&root, r) == p)
                .ok_or_else(|| {
                    DataError::InvalidArgument(format!("image {p} is not under the root {root}"))
                })?;
            Ok(r.to_string())
        })
        .collect::<Result<Vec<_>, DataError>>()?;
    Ok((root, rel))
}

/// Passes bytes through while hashing them, so a shard's checksum costs no second read.
struct HashWriter<W: Write> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Size and sha256 (hex) of a file, read in 1 MiB pieces.
pub(crate) fn sha256_file(path: &Path) -> std::io::Result<(u64, String)> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            return Ok((n, hex(&h.finalize())));
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
}

fn tmp_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("index types serialise")
}

/// Recorded shards of an earlier run with this plan (from the index or the journal).
fn previous_shards(out: &Path, plan: &str) -> Result<Vec<JournalShard>, DataError> {
    let refuse = |path: &Path, other: &str| DataError::ShardIndex {
        path: path.to_path_buf(),
        reason: format!(
            "{} was packed with other settings or from another dataset (plan {}…, now {}…); \
             pack into an empty directory or delete it",
            out.display(),
            &other[..other.len().min(12)],
            &plan[..12]
        ),
    };
    let index_path = out.join(INDEX_FILE);
    if index_path.is_file() {
        let raw =
            std::fs::read(&index_path).map_err(|e| DataError::io(&index_path, "reading", e))?;
        let idx: ShardIndexFile =
            serde_json::from_slice(&raw).map_err(|e| DataError::ShardIndex {
                path: index_path.clone(),
                reason: format!("not a shard index: {e}"),
            })?;
        if idx.pack.plan != plan {
            return Err(refuse(&index_path, &idx.pack.plan));
        }
        let mut shards: Vec<JournalShard> = idx
            .shards
            .iter()
            .map(|e| JournalShard {
                entry: e.clone(),
                members: Vec::new(),
            })
            .collect();
        for s in &idx.samples {
            shards[s.shard]
                .members
                .push((s.position, s.offset, s.length, s.crc32));
        }
        for s in &mut shards {
            s.members.sort_by_key(|m| m.1);
        }
        return Ok(shards);
    }
    let journal_path = out.join(JOURNAL_FILE);
    if journal_path.is_file() {
        let raw =
            std::fs::read(&journal_path).map_err(|e| DataError::io(&journal_path, "reading", e))?;
        let j: Journal = serde_json::from_slice(&raw).map_err(|e| DataError::ShardIndex {
            path: journal_path.clone(),
            reason: format!("not a pack journal: {e}"),
        })?;
        if j.plan != plan {
            return Err(refuse(&journal_path, &j.plan));
        }
        return Ok(j.shards);
    }
    Ok(Vec::new())
}

/// Packs `src` into `opts.out`. `label_folder_depth` is recorded so a reader with another
/// depth can re-cut labels.
pub fn pack(
    src: &dyn ImageSource,
    label_folder_depth: usize,
    opts: &PackOptions,
    progress: &mut dyn FnMut(PackEvent),
) -> Result<PackSummary, DataError> {
    let start = Instant::now();
    if opts.max_shard_bytes == 0 {
        return Err(DataError::InvalidArgument(
            "the shard size must be positive".into(),
        ));
    }
    let n = src.index().len();
    if n > 0 && src.cell_channels(0).is_some() {
        // A shard's TIFF records no channel names: cells of different channels would come
        // back as images with the first channels of `data.channel_names`.
        return Err(DataError::InvalidArgument(format!(
            "{}: its cells bring their own channels (data.screen.cell_channels: own), which \
             packed shards cannot record; train and embed from the table itself, or pack one \
             channel set at a time (data.screen.datasets) with cell_channels: shared",
            src.index().root.display()
        )));
    }
    let (root, rel) = relative_paths(src)?;
    let plan = plan_hash(opts, &root, label_folder_depth, &rel, src);
    std::fs::create_dir_all(&opts.out).map_err(|e| DataError::io(&opts.out, "creating", e))?;
    let packer = Packer {
        src,
        opts,
        order: shuffled_order(opts, n),
        plan,
        rel,
    };

    let mut done = packer.verified_prefix(progress)?;
    let verified = done.len();
    let mut next: usize = done.iter().map(|s| s.members.len()).sum();
    let index_path = opts.out.join(INDEX_FILE);
    if next < n && index_path.exists() {
        // The index no longer describes the directory: hand over to the journal first, so
        // neither a reader nor an interrupted rerun trusts it.
        packer.write_journal(&done)?;
        std::fs::remove_file(&index_path).map_err(|e| DataError::io(&index_path, "removing", e))?;
    }
    let mut written = 0usize;
    let mut written_samples = 0usize;
    let mut pending: Option<(usize, Vec<u8>)> = None;
    while next < n {
        let k = done.len();
        let shard = packer.write_shard(k, &mut next, &mut pending)?;
        let (samples, bytes) = (shard.members.len(), shard.entry.bytes);
        done.push(shard);
        written += 1;
        written_samples += samples;
        packer.write_journal(&done)?;
        progress(PackEvent::Written {
            shard: k,
            samples,
            bytes,
            done: next,
            total: n,
        });
    }

    let file = packer.index_file(root, label_folder_depth, &done)?;
    let json = serde_json::to_vec_pretty(&file).expect("index types serialise");
    let unchanged = written == 0 && std::fs::read(&index_path).is_ok_and(|old| old == json);
    if !unchanged {
        write_atomic(&index_path, &json).map_err(DataError::writing(&index_path))?;
    }
    let journal = opts.out.join(JOURNAL_FILE);
    if journal.exists() {
        std::fs::remove_file(&journal).map_err(|e| DataError::io(&journal, "removing", e))?;
    }
    Ok(PackSummary {
        shards: done.len(),
        samples: n,
        bytes: file.shards.iter().map(|s| s.bytes).sum(),
        written_shards: written,
        verified_shards: verified,
        written_samples,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The positions in packing order: as indexed, or shuffled by the seed.
fn shuffled_order(opts: &PackOptions, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if opts.shuffle {
        let mut rng = SplitMix64::new(opts.seed ^ 0x9ACC_5EED_0000_0001);
        for i in (1..n).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
    }
    order
}

/// What the steps of one [`pack`] share: the source, the settings, the plan and the order.
struct Packer<'a> {
    src: &'a dyn ImageSource,
    opts: &'a PackOptions,
    /// Packing order: `order[i]` is the position of the i-th sample written.
    order: Vec<usize>,
    plan: String,
    /// Each sample's path relative to the root.
    rel: Vec<String>,
}

impl Packer<'_> {
    /// The shards of an earlier run that hold the plan's samples and verify by sha256, up to
    /// the first that does not; the plan fixes where each shard starts.
    fn verified_prefix(
        &self,
        progress: &mut dyn FnMut(PackEvent),
    ) -> Result<Vec<JournalShard>, DataError> {
        let n = self.order.len();
        let mut done: Vec<JournalShard> = Vec::new();
        let mut next = 0usize;
        for (k, s) in previous_shards(&self.opts.out, &self.plan)?
            .into_iter()
            .enumerate()
        {
            let path = self.opts.out.join(&s.entry.file);
            let expected: Vec<usize> = self.order[next..(next + s.members.len()).min(n)].to_vec();
            let got: Vec<usize> = s.members.iter().map(|m| m.0).collect();
            let check = if s.entry.file != shard_file_name(k) || got != expected {
                Err("its members are not the plan's".to_string())
            } else {
                match sha256_file(&path) {
                    Ok((bytes, sha)) if bytes == s.entry.bytes && sha == s.entry.sha256 => Ok(()),
                    Ok((bytes, _)) => Err(format!(
                        "checksum mismatch ({bytes} bytes, {} recorded)",
                        s.entry.bytes
                    )),
                    Err(e) => Err(e.to_string()),
                }
            };
            if let Err(reason) = check {
                progress(PackEvent::Damaged { shard: k, reason });
                break;
            }
            progress(PackEvent::Verified {
                shard: k,
                samples: s.members.len(),
                bytes: s.entry.bytes,
            });
            next += s.members.len();
            done.push(s);
        }
        Ok(done)
    }

    /// Records the shards written so far (replaced atomically).
    fn write_journal(&self, done: &[JournalShard]) -> Result<(), DataError> {
        let path = self.opts.out.join(JOURNAL_FILE);
        let journal = to_json(&Journal {
            format: FORMAT.into(),
            plan: self.plan.clone(),
            shards: done.to_vec(),
        });
        write_atomic(&path, &journal).map_err(DataError::writing(&path))
    }

    /// A sample's JSON member.
    fn member_meta(&self, p: usize) -> Vec<u8> {
        let index = self.src.index();
        to_json(&MemberMeta {
            path: self.rel[p].clone(),
            label: index.samples[p].label.clone(),
            class_index: index.samples[p].class_index,
            position: p,
        })
    }

    /// Writes shard `k` from the sample at `*next` on, until it is full or the samples run
    /// out: to a temporary name, fsynced, then renamed. A sample read but left for the next
    /// shard waits in `pending`.
    fn write_shard(
        &self,
        k: usize,
        next: &mut usize,
        pending: &mut Option<(usize, Vec<u8>)>,
    ) -> Result<JournalShard, DataError> {
        let (n, opts) = (self.order.len(), self.opts);
        let file = shard_file_name(k);
        let path = opts.out.join(&file);
        let tmp = tmp_name(&path);
        let f = File::create(&tmp).map_err(|e| DataError::io(&tmp, "creating shard", e))?;
        let mut tar = TarWriter::new(HashWriter {
            inner: BufWriter::with_capacity(1 << 20, f),
            hash: Sha256::new(),
        });
        let mut members = Vec::new();
        while *next < n {
            if opts.max_shard_samples > 0 && members.len() >= opts.max_shard_samples {
                break;
            }
            let p = self.order[*next];
            let bytes = match pending.take() {
                Some((q, b)) if q == p => b,
                _ => self.src.read_bytes(p)?,
            };
            let meta = self.member_meta(p);
            let span = member_span(bytes.len() as u64) + member_span(meta.len() as u64);
            let full_bytes = tar.position() + span + END_SPAN > opts.max_shard_bytes;
            if !members.is_empty() && full_bytes {
                *pending = Some((p, bytes));
                break;
            }
            let key = sample_key(p, n);
            let werr = |e| DataError::io(&tmp, "writing shard", e);
            let offset = tar.append(&format!("{key}.tiff"), &bytes).map_err(werr)?;
            tar.append(&format!("{key}.json"), &meta).map_err(werr)?;
            members.push((p, offset, bytes.len() as u64, crc32fast::hash(&bytes)));
            *next += 1;
        }
        let (hw, bytes) = tar
            .finish()
            .map_err(|e| DataError::io(&tmp, "writing shard", e))?;
        let sha = hex(&hw.hash.finalize());
        let f = hw
            .inner
            .into_inner()
            .map_err(|e| DataError::io(&tmp, "writing shard", e.into_error()))?;
        f.sync_all()
            .map_err(|e| DataError::io(&tmp, "syncing shard", e))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(|e| DataError::io(&path, "renaming shard", e))?;
        if let Some(dir) = path.parent() {
            scdino_base::fs::sync_dir(dir);
        }
        Ok(JournalShard {
            entry: ShardEntry {
                file,
                bytes,
                sha256: sha,
                samples: members.len(),
            },
            members,
        })
    }

    /// The index of the finished shards: every sample, in position order.
    fn index_file(
        &self,
        root: String,
        label_folder_depth: usize,
        done: &[JournalShard],
    ) -> Result<ShardIndexFile, DataError> {
        let (index, opts, n) = (self.src.index(), self.opts, self.order.len());
        let mut samples: Vec<Option<SampleEntry>> = vec![None; n];
        for (k, s) in done.iter().enumerate() {
            for &(p, offset, length, crc32) in &s.members {
                samples[p] = Some(SampleEntry {
                    position: p,
                    path: self.rel[p].clone(),
                    label: index.samples[p].label.clone(),
                    class_index: index.samples[p].class_index,
                    shard: k,
                    key: sample_key(p, n),
                    offset,
                    length,
                    crc32,
                });
            }
        }
        let samples: Vec<SampleEntry> = samples
            .into_iter()
            .enumerate()
            .map(|(p, s)| {
                s.ok_or_else(|| DataError::ShardIndex {
                    path: opts.out.join(JOURNAL_FILE),
                    reason: format!("sample {p} is in no shard"),
                })
            })
            .collect::<Result<_, _>>()?;
        let skipped = index
            .skipped_other_images
            .iter()
            .map(|p| path_str(p, "skipped image").map(str::to_string))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ShardIndexFile {
            format: FORMAT.into(),
            root,
            label_folder_depth,
            classes: index.classes.clone(),
            skipped_other_images: skipped,
            pack: PackSettings {
                seed: opts.seed,
                shuffle: opts.shuffle,
                max_shard_bytes: opts.max_shard_bytes,
                max_shard_samples: opts.max_shard_samples,
                plan: self.plan.clone(),
            },
            shards: done.iter().map(|s| s.entry.clone()).collect(),
            samples,
        })
    }
}
