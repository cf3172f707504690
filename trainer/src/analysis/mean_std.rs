//! Per-channel mean and population std of the min–max scaled pixels of a seeded subset of the
//! dataset (scDINO `mean_std_dataset.py`), written as `mean_and_std_of_dataset.txt`, whose
//! content is JSON `{"mean": [...], "std": [...]}` with one value per file channel.
//!
//! Differences from scDINO, both deliberate: the configured centre crop is applied (scDINO
//! computed it and threw it away), and every image of the subset counts (scDINO's loader
//! dropped a random remainder of up to 9 images through `drop_last`).
use crate::config::OnCorrupt;
use crate::data::preprocess::preprocess;
use crate::data::{self, ImageSource, NanAction, NanPolicy, PreprocessOptions};
use std::path::Path;

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
    #[error("no usable image in the mean/std subset ({dropped} dropped as constant/NaN)")]
    Empty { dropped: usize },
}

impl MeanStd {
    /// The statistics of the selected channels, for normalising crops.
    pub fn select(&self, channels: &[usize]) -> (Vec<f32>, Vec<f32>) {
        (
            channels.iter().map(|&c| self.mean[c] as f32).collect(),
            channels.iter().map(|&c| self.std[c] as f32).collect(),
        )
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
        if m.std.iter().any(|s| !s.is_finite() || *s <= 0.0) {
            return Err(err(format!(
                "std {:?} has a zero or invalid channel",
                m.std
            )));
        }
        Ok(m)
    }

    /// Atomic write (temp file + rename) so a crash never leaves half a file.
    pub fn write(&self, path: &Path) -> Result<(), MeanStdError> {
        let json = serde_json::to_string(self).expect("floats serialize");
        data::tiff_reader::write_atomic(path, json.as_bytes())?;
        Ok(())
    }
}

/// Computes the statistics over the source's mean/std subset with `threads` readers.
pub fn compute(
    source: &dyn ImageSource,
    fraction: f64,
    center_crop: usize,
    threads: usize,
) -> Result<MeanStd, MeanStdError> {
    compute_with(source, fraction, center_crop, threads, OnCorrupt::Fail)
}

/// [`compute`], leaving out undecodable images when `on_corrupt` is `skip` (each is named
/// in a warning).
pub fn compute_with(
    source: &dyn ImageSource,
    fraction: f64,
    center_crop: usize,
    threads: usize,
    on_corrupt: OnCorrupt,
) -> Result<MeanStd, MeanStdError> {
    let index = source.index();
    let subset = data::mean_std_subset(index.len(), fraction)?;
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
    // Per thread: (Σx, Σx², pixel count per channel, dropped images).
    type Partial = (Vec<f64>, Vec<f64>, u64, usize);
    let partials: Vec<Result<Partial, MeanStdError>> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|chunk| {
                let opts = &opts;
                s.spawn(move || {
                    let mut acc: Partial = (vec![], vec![], 0, 0);
                    for &i in *chunk {
                        let raw = match source.read(i) {
                            Err(e) if on_corrupt == OnCorrupt::Skip && e.is_corrupt_image() => {
                                eprintln!(
                                    "warning: skipping corrupt image (data.on_corrupt: skip): {e}"
                                );
                                acc.3 += 1;
                                continue;
                            }
                            r => r?,
                        };
                        let (img, outcome) = preprocess(&raw, opts)?;
                        if NanPolicy::DropImage.action(&outcome) != NanAction::Keep {
                            acc.3 += 1;
                            continue;
                        }
                        if acc.0.is_empty() {
                            acc.0 = vec![0.0; img.channels];
                            acc.1 = vec![0.0; img.channels];
                        } else if acc.0.len() != img.channels {
                            return Err(MeanStdError::File {
                                path: index.samples[i].path.display().to_string(),
                                reason: format!(
                                    "has {} channels, other images have {}",
                                    img.channels,
                                    acc.0.len()
                                ),
                            });
                        }
                        for c in 0..img.channels {
                            for &v in img.channel(c) {
                                let v = f64::from(v);
                                acc.0[c] += v;
                                acc.1[c] += v * v;
                            }
                        }
                        acc.2 += (img.height * img.width) as u64;
                    }
                    Ok(acc)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("mean/std worker panicked"))
            .collect()
    });
    let (mut sum, mut sumsq, mut count, mut dropped) = (Vec::new(), Vec::new(), 0u64, 0usize);
    for p in partials {
        let (s, q, n, d) = p?;
        dropped += d;
        if s.is_empty() {
            continue;
        }
        if sum.is_empty() {
            sum = vec![0.0; s.len()];
            sumsq = vec![0.0; s.len()];
        }
        for c in 0..s.len() {
            sum[c] += s[c];
            sumsq[c] += q[c];
        }
        count += n;
    }
    if count == 0 {
        return Err(MeanStdError::Empty { dropped });
    }
    let n = count as f64;
    let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
    let std = sumsq
        .iter()
        .zip(&mean)
        .map(|(q, m)| (q / n - m * m).max(0.0).sqrt())
        .collect();
    Ok(MeanStd { mean, std })
}
