//! `model.init`: a new run's student starts from pretrained weights (a timm folder, another
//! run's checkpoint, a scDINO/DINO `.pth`) and the teacher from the student, once, before the
//! first step; a resumed run continues from its own checkpoint instead.
//!
//! Nothing loads partly by accident: every student tensor must come from the source with its
//! shape, every source tensor must be used, and the source's layout must be the configured
//! one (naming the key to set), unless `strict: false`, which lists what it skipped. The patch
//! embedding is the one tensor adapted, when the source has another channel count
//! ([`adapt_patch_embed`]). Position embeddings load as they are: the model keeps the source's
//! grid (`model.img_size`) and resamples them once, to each input's grid, with the source's
//! method, so it computes what the source computed; resampling them here too would resample
//! twice, and an export at the source's size would not give its positions back.
use super::step::Networks;
use crate::checkpoint;
use crate::config::{ChannelAdapt, CheckpointKey, Config, InitFormat, ModelInit};
use crate::model::backbone::BackboneWeights;
use crate::model::{timm, VitConfig, TRAINING_ONLY};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

#[derive(Debug, thiserror::Error)]
#[error("model.init.from {path}: {what}")]
pub struct InitError {
    pub path: PathBuf,
    pub what: String,
}

/// What a source offers: backbone tensors under our names, the head's (`run` with
/// `head: true`), the file they came from and, for timm, its layout.
struct SourceWeights {
    file: PathBuf,
    backbone: BTreeMap<String, Tensor>,
    head: BTreeMap<String, Tensor>,
    layout: Option<VitConfig>,
}

/// What was loaded, and (with `strict: false`) what was not.
#[derive(Debug, Default)]
pub struct InitReport {
    pub loaded: usize,
    pub skipped: Vec<String>,
    /// How the patch embedding took the source's channels, when it had to adapt them
    /// (`3 → 4 channels with model.init.channels: repeat`).
    pub channels: Option<String>,
}

/// The patch-embedding kernel `w` (`[D, S, P, P]`) of a source with S channels for a model
/// with `c` input channels. Every input channel contributes to each patch feature, so the
/// kernels are scaled by S/C to keep the activations at the scale the rest of the network was
/// trained on (for an image whose channels are all alike: exactly with `mean`, and with
/// `repeat` when C is a multiple of S).
/// - `repeat` (timm's `adapt_input_conv`): channel i takes source kernel i mod S; C = 1 sums
///   them. Channels that correspond (DAPI first in both) keep their kernel.
/// - `mean`: every channel takes the mean kernel: no channel is favoured when the run's
///   channels have nothing to do with the source's (RGB to fluorescence).
pub fn adapt_patch_embed(w: &Tensor, c: i64, how: ChannelAdapt) -> Tensor {
    let s = w.size()[1];
    if s == c {
        return w.shallow_clone();
    }
    let w = w.to_kind(Kind::Float);
    if c == 1 {
        return w.sum_dim_intlist(1, true, Kind::Float);
    }
    let scale = s as f64 / c as f64;
    match how {
        ChannelAdapt::Repeat => {
            let times = (c + s - 1) / s;
            w.repeat([1, times, 1, 1]).narrow(1, 0, c) * scale
        }
        ChannelAdapt::Mean => w.mean_dim(1, true, Kind::Float).repeat([1, c, 1, 1]) * scale,
    }
}

/// Loads `init` into the student of `nets` and copies it to the teacher (nothing without
/// `init.from`).
pub fn apply(cfg: &Config, init: &ModelInit, nets: &Networks) -> Result<InitReport, InitError> {
    let Some(from) = &init.from else {
        return Ok(InitReport::default());
    };
    let path = PathBuf::from(from);
    let src = read_source(init, &path)?;
    // A user's file got the source's layout when it was read (`init_layout`); a config built
    // in code may still differ. Under `strict: false` the tensors that do not fit are skipped.
    if let (Some(layout), true) = (&src.layout, init.strict) {
        let err = |what: String| InitError {
            path: path.clone(),
            what,
        };
        let layout = super::init_layout::of_timm(layout).map_err(err)?;
        layout.check(&cfg.model).map_err(|e| {
            err(format!(
                "{e}: the config must give the source's layout (a file read by the trainer takes it from the source where it does not write the key)"
            ))
        })?;
    }
    let report = load_student(init, &src, nets)?;
    tch::no_grad(|| {
        let mut teacher = nets.teacher_vs.variables();
        for (name, t) in nets.student_vs.variables() {
            if let Some(dst) = teacher.get_mut(&name) {
                dst.copy_(&t);
            }
        }
    });
    tracing::info!(
        "model.init: {} tensors from {} ({:?}){}; the teacher starts equal to the student{}",
        report.loaded,
        src.file.display(),
        init.format,
        report
            .channels
            .as_ref()
            .map(|c| format!("; patch embedding {c}"))
            .unwrap_or_default(),
        if report.skipped.is_empty() {
            String::new()
        } else {
            format!(
                "; skipped (model.init.strict: false): {}",
                report.skipped.join("; ")
            )
        }
    );
    Ok(report)
}

fn read_source(init: &ModelInit, path: &Path) -> Result<SourceWeights, InitError> {
    let err = |what: String| InitError {
        path: path.to_path_buf(),
        what,
    };
    match init.format {
        InitFormat::Timm => {
            let m = timm::read(path).map_err(|e| err(e.to_string()))?;
            Ok(SourceWeights {
                file: path.join("model.safetensors"),
                backbone: m.tensors,
                head: BTreeMap::new(),
                layout: Some(m.cfg),
            })
        }
        InitFormat::Run | InitFormat::Pth => {
            let w = BackboneWeights::load(path, CheckpointKey::Teacher)
                .map_err(|e| err(e.to_string()))?;
            let head = if init.head {
                let ck = checkpoint::load(path).map_err(|e| err(e.to_string()))?;
                ck.tensors
                    .iter()
                    .filter_map(|(n, t)| {
                        n.strip_prefix("teacher.")
                            .filter(|n| n.starts_with("head."))
                            .map(|n| (n.to_string(), t.shallow_clone()))
                    })
                    .collect()
            } else {
                BTreeMap::new()
            };
            Ok(SourceWeights {
                file: path.to_path_buf(),
                backbone: w.tensors.into_iter().collect(),
                head,
                layout: None,
            })
        }
    }
}

/// Copies the source into the student (the patch embedding adapted).
fn load_student(
    init: &ModelInit,
    src: &SourceWeights,
    nets: &Networks,
) -> Result<InitReport, InitError> {
    let file = src.file.display().to_string();
    let mut report = InitReport::default();
    let mut used = std::collections::BTreeSet::new();
    let refuse = |report: &mut InitReport, what: String| -> Result<(), InitError> {
        if init.strict {
            Err(InitError {
                path: src.file.clone(),
                what: format!("{what} (model.init.strict: false skips it)"),
            })
        } else {
            report.skipped.push(what);
            Ok(())
        }
    };
    let mut vars: Vec<(String, Tensor)> = nets.student_vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, var) in vars {
        let (short, pool) = match name.strip_prefix("backbone.") {
            Some(s) => (s, &src.backbone),
            None if init.head && name.starts_with("head.") => (name.as_str(), &src.head),
            None => continue,
        };
        let Some(t) = pool.get(short) else {
            // Tensors a source cannot have: iBOT's mask token, ChannelViT's channel embedding
            // (a fixed-channel source), both kept at their init.
            if short == "patch_embed.channel_embed" || TRAINING_ONLY.contains(&short) {
                continue;
            }
            refuse(
                &mut report,
                format!("{file} has no tensor {short} for the model's {name}"),
            )?;
            continue;
        };
        used.insert(short.to_string());
        let value = match short {
            "patch_embed.proj.weight" => {
                let adapted = adapt_for(t, &var.size(), init.channels);
                report.channels = channel_adaptation(t, &var.size(), init.channels);
                adapted
            }
            _ => t.to_kind(Kind::Float),
        };
        if value.size() != var.size() {
            let hint = if short == "pos_embed" {
                grid_hint(t, nets.student.backbone.config())
            } else {
                String::new()
            };
            refuse(
                &mut report,
                format!(
                    "{file}: {short} has shape {:?}, the model's {name} needs {:?}{hint}",
                    t.size(),
                    var.size()
                ),
            )?;
            continue;
        }
        tch::no_grad(|| var.shallow_clone().copy_(&value));
        report.loaded += 1;
    }
    // iBOT's mask token only ever replaces masked patches in training.
    let left = src.backbone.keys().chain(src.head.keys());
    for name in left.filter(|n| !used.contains(*n) && !TRAINING_ONLY.contains(&n.as_str())) {
        refuse(
            &mut report,
            format!("{file}: tensor {name} has no place in the model"),
        )?;
    }
    Ok(report)
}

/// What [`adapt_for`] does to the source's channels, in words, when it changes them.
fn channel_adaptation(w: &Tensor, dst: &[i64], how: ChannelAdapt) -> Option<String> {
    if w.dim() != 4 {
        return None;
    }
    let from = w.size()[1];
    let (to, per) = match dst.len() {
        5 => (
            1,
            " (one kernel shared by every channel's tokens: model.channels: tokens)",
        ),
        _ if dst.get(1) == Some(&1) && from != 1 => {
            (1, " (model.channels: bag takes each channel alone)")
        }
        _ => (dst.get(1).copied().unwrap_or(from), ""),
    };
    (to != from).then(|| {
        let name = serde_json::to_value(how)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{how:?}"));
        format!("{from} → {to} channels with model.init.channels: {name}{per}")
    })
}

/// The source's patch kernel for a student patch embedding of shape `dst`: `[D, C, P, P]`
/// (fixed channels), `[D, 1, P, P]` (bag) or ChannelViT's `[D, 1, 1, P, P]` (tokens), whose
/// single-channel projection is the sum over the source's channels.
fn adapt_for(w: &Tensor, dst: &[i64], how: ChannelAdapt) -> Tensor {
    if w.dim() != 4 {
        return w.to_kind(Kind::Float);
    }
    match dst.len() {
        5 => adapt_patch_embed(w, 1, how).unsqueeze(1),
        _ => adapt_patch_embed(w, dst[1], how),
    }
}

/// Why a source's `pos_embed` may not fit: the model's grid is not the source's (a config built
/// in code at the default `model.img_size`, or `strict: false` keeping a written one).
fn grid_hint(t: &Tensor, model: &VitConfig) -> String {
    let n = t.size().get(1).copied().unwrap_or(0) - i64::from(!model.no_embed_class);
    let side = (n.max(0) as f64).sqrt() as i64;
    if side * side != n || side == model.grid() {
        return String::new();
    }
    format!(
        " (the source's positions are a {side}×{side} grid, the model's {g}×{g}: `model.img_size` {img} px, the source's {src} px)",
        g = model.grid(),
        img = model.img_size,
        src = side * model.patch_size
    )
}
