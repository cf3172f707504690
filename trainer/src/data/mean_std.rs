//! Per-channel mean and population std of the min–max scaled pixels of a seeded subset of the
//! dataset (scDINO `mean_std_dataset.py`), written as `mean_and_std_of_dataset.txt`, whose
//! content is JSON `{"mean": [...], "std": [...]}` with one value per file channel.
//!
//! Differences from scDINO, all deliberate: the configured centre crop is applied (scDINO
//! computed it and threw it away); every image of the subset counts (scDINO's loader
//! dropped a random remainder of up to 9 images through `drop_last`); an image with a
//! constant channel or a NaN pixel counts with the guarded scaling of
//! [`crate::data::preprocess`] (scDINO dropped it, and a padded stain emptied the subset);
//! a channel with std 0 is kept in the file as 0 and normalised with std 1 by
//! [`MeanStd::select`], with a warning, only when a run selects it.
use crate::config::{Config, OnCorrupt};
use crate::data::preprocess::preprocess;
use crate::data::{self, quality, ImageSource, PreprocessOptions};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MeanStd {
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum MeanStdError {
    #[error(transparent)]
    Data(#[from] data::DataError),
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("no usable image in the mean/std subset ({dropped} skipped as corrupt)")]
    Empty { dropped: usize },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the mean/std subset held besides the statistics: what scaling had to guard against.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubsetQuality {
    /// Images that entered the statistics.
    pub images: usize,
    /// Per file channel: images of the subset in which it was constant.
    pub constant_images: Vec<usize>,
    /// NaN or infinite pixels over the subset.
    pub nonfinite_pixels: u64,
}

impl SubsetQuality {
    /// Warns about every channel in `used` (the channels some combination selects) that was
    /// constant in some images; channels no combination uses never matter.
    pub fn warn(&self, names: &[String], used: &[usize]) {
        for &c in used {
            let n = self.constant_images.get(c).copied().unwrap_or(0);
            if n > 0 {
                quality::warn_once(&format!("subset-constant/{c}"), || {
                    format!(
                        "channel {} is constant in {n} of the {} images of the mean/std subset                          (scaled to 0 in them instead of scDINO's NaN)",
                        quality::channel_label(c, names),
                        self.images
                    )
                });
            }
        }
        if self.nonfinite_pixels > 0 {
            quality::warn_once("subset-nonfinite", || {
                format!(
                    "the mean/std subset has {} NaN or infinite pixels (left out of each                      image's min–max range and scaled to 0)",
                    self.nonfinite_pixels
                )
            });
        }
    }
}

impl MeanStd {
    /// The statistics of the selected channels, for normalising crops. A channel with std 0
    /// gets std 1 (named in a warning once per process) so normalising never divides by 0.
    pub fn select(&self, channels: &[usize], names: &[String]) -> (Vec<f32>, Vec<f32>) {
        let std = channels
            .iter()
            .map(|&c| {
                if self.std[c] > 0.0 {
                    self.std[c] as f32
                } else {
                    quality::zero_std_channel(c, names);
                    1.0
                }
            })
            .collect();
        (channels.iter().map(|&c| self.mean[c] as f32).collect(), std)
    }

    pub fn read(path: &Path) -> Result<Self, MeanStdError> {
        let err = |reason: String| MeanStdError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let m: MeanStd =
            serde_json::from_str(&text).map_err(|e| err(format!("not mean/std JSON: {e}")))?;
        if m.mean.len() != m.std.len() || m.mean.is_empty() {
            return Err(err(
                "mean and std must list the same, non-zero number of channels".into(),
            ));
        }
        if m.mean.iter().chain(&m.std).any(|v| !v.is_finite()) || m.std.iter().any(|s| *s < 0.0) {
            return Err(err(format!(
                "mean {:?} / std {:?}: every value must be finite and every std ≥ 0",
                m.mean, m.std
            )));
        }
        Ok(m)
    }

    /// Atomic write (temp file + rename) so a crash never leaves half a file.
    pub fn write(&self, path: &Path) -> Result<(), MeanStdError> {
        let json = serde_json::to_string(self).expect("floats serialize");
        scdino_base::fs::write_atomic(path, json.as_bytes())
            .map_err(data::DataError::writing(path))?;
        Ok(())
    }
}

/// The run's statistics at `path` (`mean_and_std_of_dataset.txt` in the run folder, shared by
/// every channel combination): read when the file exists, else computed with the config's
/// settings (warning about channels constant in the subset) and written.
pub fn load_or_compute(
    cfg: &Config,
    source: &dyn ImageSource,
    path: &Path,
) -> Result<MeanStd, MeanStdError> {
    if path.exists() {
        return MeanStd::read(path);
    }
    tracing::info!("computing dataset mean/std -> {}", path.display());
    let threads = cfg.data.num_workers.max(1);
    let (ms, quality) = compute_with(
        source,
        cfg.data.mean_std_fraction,
        cfg.data.center_crop,
        threads,
        cfg.data.on_corrupt,
    )?;
    if let Some(missing) = cfg.data.channel_names.get(ms.mean.len()) {
        return Err(no_cell_holds(&source.index().root, missing));
    }
    quality.warn(&cfg.data.channel_names, &cfg.used_channels());
    std::fs::create_dir_all(cfg.run_dir()).map_err(|source| MeanStdError::Io {
        path: cfg.run_dir(),
        source,
    })?;
    ms.write(path)?;
    Ok(ms)
}

/// Computes the statistics over the source's mean/std subset with `threads` readers.
pub fn compute(
    source: &dyn ImageSource,
    fraction: f64,
    center_crop: usize,
    threads: usize,
) -> Result<MeanStd, MeanStdError> {
    Ok(compute_with(source, fraction, center_crop, threads, OnCorrupt::Fail)?.0)
}

/// [`compute`], leaving out undecodable images when `on_corrupt` is `skip` (each is named
/// in a warning), and reporting what scaling guarded against.
pub fn compute_with(
    source: &dyn ImageSource,
    fraction: f64,
    center_crop: usize,
    threads: usize,
    on_corrupt: OnCorrupt,
) -> Result<(MeanStd, SubsetQuality), MeanStdError> {
    let index = source.index();
    let mut subset = data::mean_std_subset(index.len(), fraction)?;
    if source.site_layout().is_some() {
        // A screen's cells are listed site by site: the same cells in index order read each
        // site once, not once per sampled cell (the sums differ only in rounding).
        subset.sort_unstable();
    }
    let opts = PreprocessOptions {
        selected_channels: None,
        center_crop,
    };
    let chunks: Vec<&[usize]> = subset
        .chunks(subset.len().div_ceil(threads.max(1)).max(1))
        .collect();
    // The readers advance through their chunks side by side: announce that interleaving so
    // a streaming source prefetches what each of them needs next.
    let longest = chunks.iter().map(|c| c.len()).max().unwrap_or(0);
    let interleaved: Vec<usize> = (0..longest)
        .flat_map(|k| chunks.iter().filter_map(move |c| c.get(k).copied()))
        .collect();
    source.will_read(&interleaved);
    let partials: Vec<Result<Partial, MeanStdError>> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|chunk| {
                let opts = &opts;
                s.spawn(move || accumulate(source, chunk, opts, on_corrupt))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("mean/std worker panicked"))
            .collect()
    });
    let own = subset
        .first()
        .is_some_and(|&i| source.cell_channels(i).is_some());
    let (sum, sumsq, count, dropped, quality) = combine(partials, &index.root, own)?;
    if count.iter().all(|&n| n == 0) {
        return Err(MeanStdError::Empty { dropped });
    }
    if let Some(c) = count.iter().position(|&n| n == 0) {
        return Err(no_cell_holds(&index.root, &c.to_string()));
    }
    let mean: Vec<f64> = sum.iter().zip(&count).map(|(s, &n)| s / n as f64).collect();
    let std = sumsq
        .iter()
        .zip(&mean)
        .zip(&count)
        .map(|((q, m), &n)| (q / n as f64 - m * m).max(0.0).sqrt())
        .collect();
    Ok((MeanStd { mean, std }, quality))
}

/// A channel (its name, or its position in `data.channel_names`) in no cell of the mean/std
/// subset: with cells that bring their own channels (`data.screen.cell_channels: own`), a
/// dataset can be missing from a small subset.
fn no_cell_holds(root: &Path, channel: &str) -> MeanStdError {
    MeanStdError::File {
        path: root.display().to_string(),
        reason: format!(
            "no cell of the mean/std subset holds channel {channel} of data.channel_names \
             (cells bring their own channels): raise data.mean_std_fraction"
        ),
    }
}

/// One reader's sums: (Σx, Σx² per channel, pixel count per channel, skipped images, what
/// was guarded).
type Partial = (Vec<f64>, Vec<f64>, Vec<u64>, usize, SubsetQuality);

/// The sums over the images `chunk` of `source`, leaving out undecodable ones when
/// `on_corrupt` is `skip`. A cell with its own channels adds to those channels only.
fn accumulate(
    source: &dyn ImageSource,
    chunk: &[usize],
    opts: &PreprocessOptions,
    on_corrupt: OnCorrupt,
) -> Result<Partial, MeanStdError> {
    let index = source.index();
    let mut acc: Partial = (vec![], vec![], vec![], 0, SubsetQuality::default());
    for &i in chunk {
        let raw = match source.read(i) {
            Err(e) if on_corrupt == OnCorrupt::Skip && e.is_corrupt_image() => {
                tracing::warn!("skipping corrupt image (data.on_corrupt: skip): {e}");
                acc.3 += 1;
                continue;
            }
            r => r?,
        };
        let (img, outcome) = preprocess(&raw, opts)?;
        let own = source.cell_channels(i);
        let slots: Vec<usize> = match own {
            Some(own) => own.to_vec(),
            None => (0..img.channels).collect(),
        };
        if own.is_none() && !acc.0.is_empty() && acc.0.len() != img.channels {
            return Err(MeanStdError::File {
                path: index.samples[i].path.display().to_string(),
                reason: format!(
                    "has {} channels, other images have {}",
                    img.channels,
                    acc.0.len()
                ),
            });
        }
        let needed = slots.iter().max().map_or(0, |m| m + 1);
        if acc.0.len() < needed {
            acc.0.resize(needed, 0.0);
            acc.1.resize(needed, 0.0);
            acc.2.resize(needed, 0);
            acc.4.constant_images.resize(needed, 0);
        }
        acc.4.images += 1;
        acc.4.nonfinite_pixels += outcome.nonfinite_pixels as u64;
        for &c in &outcome.constant_channels {
            acc.4.constant_images[slots[c]] += 1;
        }
        for (c, &slot) in slots.iter().enumerate() {
            for &v in img.channel(c) {
                let v = f64::from(v);
                acc.0[slot] += v;
                acc.1[slot] += v * v;
            }
            acc.2[slot] += (img.height * img.width) as u64;
        }
    }
    Ok(acc)
}

/// The readers' sums added up, in reader order (so the result does not depend on which
/// reader finished first); `root` names the dataset when two readers saw other channel counts
/// (which readers of cells with their `own` channels may: their sums cover what they saw).
fn combine(
    partials: Vec<Result<Partial, MeanStdError>>,
    root: &Path,
    own: bool,
) -> Result<Partial, MeanStdError> {
    let (mut sum, mut sumsq, mut count, mut dropped) = (Vec::new(), Vec::new(), Vec::new(), 0usize);
    let mut quality = SubsetQuality::default();
    for p in partials {
        let (s, q, n, d, part) = p?;
        dropped += d;
        if s.is_empty() {
            continue;
        }
        if !own && !sum.is_empty() && s.len() != sum.len() {
            return Err(MeanStdError::File {
                path: root.display().to_string(),
                reason: format!(
                    "images with {} and with {} channels in the mean/std subset",
                    s.len(),
                    sum.len()
                ),
            });
        }
        if sum.len() < s.len() {
            sum.resize(s.len(), 0.0);
            sumsq.resize(s.len(), 0.0);
            count.resize(s.len(), 0);
            quality.constant_images.resize(s.len(), 0);
        }
        for c in 0..s.len() {
            sum[c] += s[c];
            sumsq[c] += q[c];
            count[c] += n[c];
            quality.constant_images[c] += part.constant_images[c];
        }
        quality.images += part.images;
        quality.nonfinite_pixels += part.nonfinite_pixels;
    }
    Ok((sum, sumsq, count, dropped, quality))
}
