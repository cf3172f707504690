//! Reading a timm `VisionTransformer` folder (`config.json` + `model.safetensors`, as timm's
//! `save_for_hf`/`push_to_hf_hub` write it, as the Hugging Face hub's `timm/*` repositories
//! hold it, and as `trainer export --format timm` writes it) into our ViT.
//!
//! The layout is taken from the tensors themselves (width, depth, patch size, channels,
//! registers, LayerScale, whether the class token has a position), and `model_args`, where
//! `config.json` has them, must agree; the head count, which no tensor shows, comes from
//! `model_args.num_heads` or the standard width table. Any `model_args` key that changes the
//! network in a way our ViT does not compute (another norm, activation, pooling of the
//! features, no class token...) is refused rather than loaded into a different network.
use super::{PosResample, VitConfig, TRAINING_ONLY};
use crate::config::Arch;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use tch::{nn, Kind, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum TimmError {
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read weights {path}: {source}")]
    Weights {
        path: PathBuf,
        #[source]
        source: tch::TchError,
    },
}

/// A timm ViT read from a folder: its architecture under our names.
#[derive(Debug)]
pub struct TimmModel {
    pub dir: PathBuf,
    /// `config.json`'s `architecture` (e.g. `vit_small_patch14_reg4_dinov2`).
    pub architecture: String,
    /// The network, at the trained resolution, resampling positions as timm does.
    pub cfg: VitConfig,
    /// The backbone tensors under our names (timm's `reg_token` is our `register_tokens`).
    pub tensors: BTreeMap<String, Tensor>,
    /// `pretrained_cfg.mean`/`std` (per input channel), when the folder gives them.
    pub mean: Option<Vec<f32>>,
    pub std: Option<Vec<f32>>,
    /// `pretrained_cfg.input_size` (`[C, H, W]`): the `H × W` images are resized to for
    /// embedding, when the folder gives it.
    pub input_size: Option<(i64, i64)>,
    /// `pretrained_cfg.interpolation` (`bicubic`, `bilinear`...), when the folder gives it.
    pub interpolation: Option<String>,
    /// Channel names, where the folder records them (our exports do).
    pub channel_names: Option<Vec<String>>,
    /// timm tensors that are no part of the backbone (the classifier `head.*`), left out.
    pub skipped: Vec<String>,
}

/// `model_args` keys that change nothing our ViT computes for the CLS feature (sizes checked
/// against the tensors, regularisation, init, the classifier, input handling).
const HARMLESS_ARGS: [&str; 22] = [
    "img_size",
    "patch_size",
    "in_chans",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "init_values",
    "reg_tokens",
    "no_embed_class",
    "num_classes",
    "global_pool",
    "dynamic_img_size",
    "drop_rate",
    "pos_drop_rate",
    "patch_drop_rate",
    "proj_drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
    "weight_init",
    "fix_init",
    "strict_img_size",
];

/// `model_args` keys accepted only at the value our ViT computes.
const FIXED_ARGS: [(&str, &str); 8] = [
    ("qkv_bias", "true"),
    ("class_token", "true"),
    ("qk_norm", "false"),
    ("pre_norm", "false"),
    ("fc_norm", "false"),
    ("dynamic_img_pad", "false"),
    ("pos_embed", "\"learn\""),
    ("proj_bias", "true"),
];

/// timm's name of one of our backbone tensors.
pub fn timm_name(ours: &str) -> String {
    match ours {
        "register_tokens" => "reg_token".into(),
        other => other.into(),
    }
}

/// Our name of a timm tensor.
pub fn our_name(timm: &str) -> String {
    match timm {
        "reg_token" => "register_tokens".into(),
        other => other.into(),
    }
}

/// The usual head count of a ViT this wide (timm's and DINOv2's presets).
fn standard_heads(embed_dim: i64) -> Option<i64> {
    match embed_dim {
        192 => Some(3),
        384 => Some(6),
        768 => Some(12),
        1024 | 1280 => Some(16),
        1536 => Some(24),
        _ => None,
    }
}

/// Our preset of this width (the one a run config names), if any.
pub fn arch_of_width(embed_dim: i64) -> Option<Arch> {
    match embed_dim {
        192 => Some(Arch::VitTiny),
        384 => Some(Arch::VitSmall),
        768 => Some(Arch::VitBase),
        1024 => Some(Arch::VitLarge),
        _ => None,
    }
}

/// Whether `dir` looks like a timm folder (rather than a checkpoint file).
pub fn is_timm_folder(dir: &Path) -> bool {
    dir.is_dir() && dir.join("config.json").is_file() && dir.join("model.safetensors").is_file()
}

/// Reads the timm folder `dir`.
pub fn read(dir: &Path) -> Result<TimmModel, TimmError> {
    let (config_path, weights_path) = (dir.join("config.json"), dir.join("model.safetensors"));
    let config = read_config(&config_path)?;
    let raw = Tensor::read_safetensors(&weights_path).map_err(|source| TimmError::Weights {
        path: weights_path.clone(),
        source,
    })?;
    let mut tensors = BTreeMap::new();
    let mut skipped = Vec::new();
    for (name, t) in raw {
        if name.starts_with("head.") {
            skipped.push(name);
        } else {
            tensors.insert(our_name(&name), t);
        }
    }
    let shapes: Shapes = tensors.iter().map(|(n, t)| (n.clone(), t.size())).collect();
    let cfg = layout(&shapes, &config, &weights_path, &config_path)?;
    let pretrained = &config["pretrained_cfg"];
    let floats = |key: &str| -> Option<Vec<f32>> {
        pretrained[key].as_array().map(|a| {
            a.iter()
                .filter_map(|v| v.as_f64())
                .map(|v| v as f32)
                .collect()
        })
    };
    let channel_names = config["channel_names"].as_array().map(|a| {
        a.iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect()
    });
    Ok(TimmModel {
        dir: dir.to_path_buf(),
        architecture: config["architecture"].as_str().unwrap_or("").to_string(),
        cfg,
        tensors,
        mean: floats("mean"),
        std: floats("std"),
        input_size: pretrained["input_size"].as_array().and_then(|a| {
            let hw: Vec<i64> = a.iter().filter_map(|v| v.as_i64()).collect();
            match hw[..] {
                [_, h, w] => Some((h, w)),
                _ => None,
            }
        }),
        interpolation: pretrained["interpolation"].as_str().map(String::from),
        channel_names,
        skipped,
    })
}

/// Tensor shapes by our names: all a layout needs, so it can come from a file's header.
pub type Shapes = BTreeMap<String, Vec<i64>>;

/// The network of the timm folder `dir` from `config.json` and the header of
/// `model.safetensors` alone (no tensor data read): what a run config's `model.init` needs
/// before training starts.
pub fn read_layout(dir: &Path) -> Result<VitConfig, TimmError> {
    let (config_path, weights_path) = (dir.join("config.json"), dir.join("model.safetensors"));
    let config = read_config(&config_path)?;
    let shapes = safetensors_shapes(&weights_path)?
        .into_iter()
        .filter(|(n, _)| !n.starts_with("head."))
        .map(|(n, s)| (our_name(&n), s))
        .collect();
    layout(&shapes, &config, &weights_path, &config_path)
}

/// A folder's `config.json`.
fn read_config(path: &Path) -> Result<serde_json::Value, TimmError> {
    let text = std::fs::read_to_string(path).map_err(|source| TimmError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| TimmError::Invalid {
        path: path.to_path_buf(),
        what: format!("not JSON: {e}"),
    })
}

/// The tensor names and shapes of a `.safetensors` file, from its header alone.
fn safetensors_shapes(path: &Path) -> Result<Shapes, TimmError> {
    use crate::tensor_file::{header_shapes, read_header, HeaderError};
    read_header(path)
        .and_then(|h| header_shapes(&h))
        .map_err(|e| match e {
            HeaderError::Io(source) => TimmError::Io {
                path: path.to_path_buf(),
                source,
            },
            HeaderError::Invalid(what) => TimmError::Invalid {
                path: path.to_path_buf(),
                what,
            },
        })
}

/// The shape of tensor `name`, or an error naming it and the file.
fn shape(shapes: &Shapes, name: &str, path: &Path) -> Result<Vec<i64>, TimmError> {
    shapes.get(name).cloned().ok_or_else(|| TimmError::Invalid {
        path: path.to_path_buf(),
        what: format!(
            "no tensor {}: not a timm VisionTransformer with a class token",
            timm_name(name)
        ),
    })
}

/// The network the tensor shapes and `model_args` describe.
pub fn layout(
    shapes: &Shapes,
    config: &serde_json::Value,
    weights: &Path,
    config_path: &Path,
) -> Result<VitConfig, TimmError> {
    let invalid = |path: &Path, what: String| TimmError::Invalid {
        path: path.to_path_buf(),
        what,
    };
    let args = config["model_args"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (key, value) in &args {
        if let Some((_, want)) = FIXED_ARGS.iter().find(|(k, _)| k == key) {
            let fits = value.to_string().as_str() == *want || (value.is_null() && *want == "false");
            if !fits {
                return Err(invalid(config_path, format!("model_args.{key} is {value}; this project's ViT computes only {key} = {want}")));
            }
        } else if !HARMLESS_ARGS.contains(&key.as_str()) {
            return Err(invalid(config_path, format!("model_args.{key} ({value}) changes the network in a way this project's ViT does not compute (it reads timm VisionTransformers with {})", HARMLESS_ARGS.join(", "))));
        }
    }
    let proj = shape(shapes, "patch_embed.proj.weight", weights)?;
    let [embed_dim, in_chans, patch, patch_w] = proj[..] else {
        return Err(invalid(
            weights,
            format!("patch_embed.proj.weight has shape {proj:?}, not [D, C, P, P]"),
        ));
    };
    if patch != patch_w {
        return Err(invalid(
            weights,
            format!("patch_embed.proj.weight has non-square patches {patch}×{patch_w}"),
        ));
    }
    let depth = (0..)
        .take_while(|i| shapes.contains_key(&format!("blocks.{i}.norm1.weight")))
        .count() as i64;
    let registers = match shapes.get("register_tokens") {
        Some(t) => t[1],
        None => 0,
    };
    let pos = shape(shapes, "pos_embed", weights)?[1];
    let square = |n: i64| {
        let g = (n as f64).sqrt().round() as i64;
        (g * g == n).then_some(g)
    };
    let (grid, no_embed_class) = match (square(pos), square(pos - 1)) {
        (Some(g), _) if g > 0 => (g, true),
        (_, Some(g)) if g > 0 => (g, false),
        _ => {
            let extra = if registers > 0 {
                format!(" (the class token's and {registers} registers' positions, timm's `no_embed_class=False` with `reg_tokens`, which DINOv2 never has: registers without positions are supported)")
            } else {
                String::new()
            };
            return Err(invalid(weights, format!("pos_embed has {pos} positions: neither a square patch grid nor one plus the class token's{extra}")));
        }
    };
    let mlp_hidden = shape(shapes, "blocks.0.mlp.fc1.weight", weights)?[0];
    let num_heads = match args.get("num_heads").and_then(|v| v.as_i64()) {
        Some(h) => h,
        None => standard_heads(embed_dim).ok_or_else(|| invalid(config_path, format!("no model_args.num_heads, and width {embed_dim} is no standard ViT's (192, 384, 768, 1024, 1280, 1536), so the head count is unknown")))?,
    };
    let cfg = VitConfig {
        embed_dim,
        depth,
        num_heads,
        mlp_ratio: mlp_hidden as f64 / embed_dim as f64,
        patch_size: patch,
        in_chans,
        img_size: grid * patch,
        drop_path_rate: 0.0,
        channel_tokens: false,
        num_register_tokens: registers,
        mask_token: false,
        channel_proxies: false,
        // The initial value only matters for training from scratch; timm's DINOv2 uses 1e-5.
        layer_scale: shapes.contains_key("blocks.0.ls1.gamma").then(|| {
            args.get("init_values")
                .and_then(|v| v.as_f64())
                .unwrap_or(1e-5)
        }),
        no_embed_class,
        pos_resample: PosResample::Timm,
        channel_embed_std: 0.02,
        channel_separate_blocks: 0,
        channel_mixing_blocks: 0,
    };
    check_args(&cfg, &args, config_path)?;
    Ok(cfg)
}

/// `model_args` that contradict what the tensors show.
fn check_args(
    cfg: &VitConfig,
    args: &serde_json::Map<String, serde_json::Value>,
    path: &Path,
) -> Result<(), TimmError> {
    let shown = [
        ("embed_dim", cfg.embed_dim),
        ("depth", cfg.depth),
        ("patch_size", cfg.patch_size),
        ("in_chans", cfg.in_chans),
        ("reg_tokens", cfg.num_register_tokens),
    ];
    for (key, value) in shown {
        if let Some(arg) = args.get(key).and_then(|v| v.as_i64()) {
            if arg != value {
                return Err(TimmError::Invalid {
                    path: path.to_path_buf(),
                    what: format!("model_args.{key} is {arg} but model.safetensors holds a model with {key} = {value}"),
                });
            }
        }
    }
    let flag = |key: &str| args.get(key).and_then(|v| v.as_bool());
    if let Some(arg) = flag("no_embed_class") {
        if arg != cfg.no_embed_class {
            return Err(TimmError::Invalid {
                path: path.to_path_buf(),
                what: format!("model_args.no_embed_class is {arg} but model.safetensors' pos_embed has {} class position", if cfg.no_embed_class { "no" } else { "a" }),
            });
        }
    }
    Ok(())
}

impl TimmModel {
    /// Copies the weights into `vs`, whose variables `prefix` + our name (e.g. `backbone.`)
    /// must be exactly this model's, with the same shapes: a missing or unexpected tensor
    /// is an error naming it and the file. Our training-only tensors ([`TRAINING_ONLY`]: iBOT's
    /// mask token, DiChaViT's proxies), which timm's ViT does not have, keep their initial
    /// values.
    pub fn load_into(&self, vs: &nn::VarStore, prefix: &str) -> Result<(), TimmError> {
        let path = self.dir.join("model.safetensors");
        let invalid = |what: String| TimmError::Invalid {
            path: path.clone(),
            what,
        };
        let mut vars: BTreeMap<String, Tensor> = vs
            .variables()
            .into_iter()
            .filter_map(|(n, t)| n.strip_prefix(prefix).map(|s| (s.to_string(), t)))
            .filter(|(n, _)| !TRAINING_ONLY.contains(&n.as_str()))
            .collect();
        let ours: BTreeSet<&String> = vars.keys().collect();
        let theirs: BTreeSet<&String> = self.tensors.keys().collect();
        let missing: Vec<String> = ours.difference(&theirs).map(|n| timm_name(n)).collect();
        let unexpected: Vec<String> = theirs.difference(&ours).map(|n| timm_name(n)).collect();
        if !missing.is_empty() || !unexpected.is_empty() {
            return Err(invalid(format!(
                "does not fit the model: missing {missing:?}, unexpected {unexpected:?}"
            )));
        }
        tch::no_grad(|| {
            for (name, var) in vars.iter_mut() {
                let src = &self.tensors[name];
                if src.size() != var.size() {
                    return Err(invalid(format!(
                        "{} has shape {:?}, the model needs {:?}",
                        timm_name(name),
                        src.size(),
                        var.size()
                    )));
                }
                var.copy_(&src.to_kind(Kind::Float));
            }
            Ok(())
        })
    }
}
