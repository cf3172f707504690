//! Attention maps (scDINO `visualise_attention.py`): for a few held-out images per class, the
//! last block's CLS→patch attention of every head, upsampled ×P (nearest) to the image, saved
//! as viridis PNGs next to each selected channel of the image. A channel-adaptive model
//! (`model.channels: tokens | bag`) gets one map per channel instead (see
//! [`attention_maps`]).
//!
//! Differences from scDINO, on purpose: images are picked with a seeded shuffle (`run.seed`)
//! instead of Python's unseeded `random.sample`, so reruns and reports are reproducible; and
//! `attention_images.json` lists what was written, for the report.
use crate::analysis::features::{self, resized_hw, to_tensor, Embedder, FeaturesError};
use crate::config::Config;
use crate::data::mean_std::MeanStd;
use crate::data::preprocess::preprocess;
use crate::data::{self, PreprocessOptions};
use crate::model::backbone::BackboneWeights;
use crate::plot::{self, PlotError};
use scdino_base::rng::SplitMix64;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum AttentionError {
    #[error(transparent)]
    Features(#[from] FeaturesError),
    #[error(transparent)]
    Data(#[from] data::DataError),
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    #[error("channel combination {index} does not exist")]
    NoCombination { index: usize },
}

/// One image's outputs, for the report.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AttentionImage {
    pub class: String,
    pub file: String,
    /// Side length of the shorter side the image was resized to.
    pub size: usize,
    /// Channel PNGs then head PNGs, relative to the attention output directory.
    pub channel_pngs: Vec<String>,
    pub head_pngs: Vec<String>,
    /// For each of `head_pngs`, the share of the CLS token's attention its patches receive
    /// (for a channel map, averaged over the heads). The PNGs are each scaled to their own
    /// range, so they say where a model looks; these say how much: in a `tokens` map set the
    /// channels' shares of one softmax (with the CLS's attention to itself and to any registers
    /// they sum to 1), in
    /// a `bag` set each channel's share of its own pass. Empty in manifests written before.
    #[serde(default)]
    pub map_shares: Vec<f64>,
}

/// Picks up to `per_class` held-out images of every label, reproducibly.
pub fn pick_images(labels_of: &[(usize, String)], per_class: usize, seed: u64) -> Vec<usize> {
    let mut by_class: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, label) in labels_of {
        by_class.entry(label.as_str()).or_default().push(*i);
    }
    let mut rng = SplitMix64::new(seed);
    let mut picked = Vec::new();
    for (_, mut members) in by_class {
        for i in (1..members.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            members.swap(i, j);
        }
        members.truncate(per_class);
        members.sort_unstable();
        picked.extend(members);
    }
    picked
}

/// The maps one image gets, named: scDINO's one per head of a `fixed` model
/// (`attn-head{j}`), or, for `tokens` and `bag`, one per channel of the combination, the
/// CLS attention to that channel's patches averaged over the heads (`attn-channel_{name}`):
/// which stain the model looks at, and where. `x`: `[k, h, w]`, normalised.
pub fn attention_maps(
    embedder: &Embedder,
    x: &Tensor,
    channel_names: &[&str],
) -> Vec<(String, Tensor)> {
    embedder.attention_maps(x, channel_names)
}

/// Min–max scales a `[h, w]` map to [0, 1] (matplotlib `imsave`'s default normalisation and
/// torchvision `make_grid(normalize=True, scale_each=True)`).
fn unit_range(m: &Tensor) -> Vec<f32> {
    let v = Vec::<f32>::try_from(m.to_kind(Kind::Float).flatten(0, -1)).expect("f32 map");
    let lo = v.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let span = hi - lo;
    v.iter()
        .map(|&x| if span > 0.0 { (x - lo) / span } else { 0.0 })
        .collect()
}

fn save_viridis(path: &Path, m: &Tensor) -> Result<(), PlotError> {
    let (h, w) = (m.size()[0] as u32, m.size()[1] as u32);
    let rgb: Vec<u8> = unit_range(m).into_iter().flat_map(plot::viridis).collect();
    plot::write_png(path, &rgb, w, h)
}

fn save_grey(path: &Path, m: &Tensor) -> Result<(), PlotError> {
    let (h, w) = (m.size()[0] as u32, m.size()[1] as u32);
    let rgb: Vec<u8> = unit_range(m)
        .into_iter()
        .flat_map(|v| {
            let g = (v * 255.0).round() as u8;
            [g, g, g]
        })
        .collect();
    plot::write_png(path, &rgb, w, h)
}

/// Written last into the output folder: its presence means every map of the set is there.
pub use crate::layout::ATTENTION_MANIFEST as MANIFEST;

/// Writes `{out}/{class}/{file}/image_size_{S}/attn-head{j}.png` and
/// `original_img_channel_{name}.png` for the picked held-out images, for each size in
/// `sizes` (scDINO: the features' resize length, and the attention image size when
/// `resize_attention_image`). Returns what was written, in order.
pub fn write_attention_maps(
    cfg: &Config,
    combination: usize,
    checkpoint_path: &Path,
    mean_std: &MeanStd,
    out: &Path,
) -> Result<Vec<AttentionImage>, AttentionError> {
    let channels = cfg
        .channel_sets
        .get(combination)
        .cloned()
        .ok_or(AttentionError::NoCombination { index: combination })?;
    let weights = BackboneWeights::load(checkpoint_path, cfg.downstream.features.checkpoint_key)
        .map_err(FeaturesError::from)?;
    let device = crate::device::resolve_for_this_process(cfg.train.device)?;
    let (_vs, embedder) = features::load_embedder(cfg, &weights, &channels, device)?;
    let names: Vec<&str> = channels
        .iter()
        .map(|&c| cfg.data.channel_names[c].as_str())
        .collect();
    let source = data::open_source(&cfg.data)?;
    let index = source.index();
    let split = data::cell_channels::combination_split(
        source.as_ref(),
        &cfg.data,
        cfg.run.seed as u32,
        &channels,
    )?;
    let labelled: Vec<(usize, String)> = split
        .held_out
        .iter()
        .map(|&i| (i, index.samples[i].label.clone()))
        .collect();
    let picked = pick_images(
        &labelled,
        cfg.downstream.attention.images_per_class,
        cfg.run.seed,
    );
    let mut sizes = vec![cfg.downstream.features.resize_length];
    if cfg.downstream.attention.resize && !sizes.contains(&cfg.downstream.attention.image_size) {
        sizes.push(cfg.downstream.attention.image_size);
    }
    let (mean, std) = mean_std.select(&channels, &cfg.data.channel_names);
    let m = Tensor::from_slice(&mean).reshape([-1, 1, 1]);
    let s = Tensor::from_slice(&std).reshape([-1, 1, 1]);
    let opts = PreprocessOptions {
        selected_channels: Some(channels.clone()),
        center_crop: cfg.data.center_crop,
    };
    let mut written = Vec::new();
    for i in picked {
        let sample = &index.samples[i];
        // A cell with its own channels holds the combination's (the split kept only those).
        let opts = match data::cell_channels::selection_in_cell(source.as_ref(), i, &channels) {
            Ok(Some(within)) => PreprocessOptions {
                selected_channels: Some(within),
                ..opts.clone()
            },
            _ => opts.clone(),
        };
        let (img, _) = preprocess(&source.read(i)?, &opts)?;
        let file = sample
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| i.to_string());
        for &size in &sizes {
            let (h, w) = resized_hw(img.height, img.width, size);
            let x = to_tensor(&img)
                .unsqueeze(0)
                .upsample_bilinear2d([h, w], false, None, None)
                .squeeze_dim(0);
            let rel = PathBuf::from(&sample.label)
                .join(&file)
                .join(format!("image_size_{size}"));
            let dir = out.join(&rel);
            let mut entry = AttentionImage {
                class: sample.label.clone(),
                file: file.clone(),
                size,
                channel_pngs: vec![],
                head_pngs: vec![],
                map_shares: vec![],
            };
            for (c, &ch) in channels.iter().enumerate() {
                let name = format!("original_img_channel_{}.png", cfg.data.channel_names[ch]);
                save_grey(&dir.join(&name), &x.get(c as i64))?;
                entry
                    .channel_pngs
                    .push(rel.join(name).display().to_string());
            }
            let normalized = if cfg.downstream.features.normalize {
                (&x - &m) / &s
            } else {
                x.shallow_clone()
            };
            let patch_pixels = (embedder.patch_size() * embedder.patch_size()) as f64;
            for (stem, map) in attention_maps(&embedder, &normalized.to_device(device), &names) {
                let name = format!("{stem}.png");
                let map = map.to_device(Device::Cpu);
                entry
                    .map_shares
                    .push(map.sum(Kind::Double).double_value(&[]) / patch_pixels);
                save_viridis(&dir.join(&name), &map)?;
                entry.head_pngs.push(rel.join(name).display().to_string());
            }
            written.push(entry);
        }
    }
    let manifest = serde_json::to_string_pretty(&written).expect("serialisable");
    let path = out.join(MANIFEST);
    scdino_base::fs::write_atomic(&path, manifest.as_bytes())
        .map_err(data::DataError::writing(&path))?;
    Ok(written)
}
