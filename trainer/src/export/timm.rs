//! The backbone as timm's `VisionTransformer` (`timm/models/vision_transformer.py`):
//! `model.safetensors` under timm's parameter names and timm's `config.json` (`architecture`,
//! `model_args`, `pretrained_cfg`), so `timm.create_model("local-dir:DIR", pretrained=True)`
//! rebuilds it.
//!
//! Our ViT is DINO's, and DINO's names are timm's (`cls_token`, `pos_embed`,
//! `patch_embed.proj`, `blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}`, `norm`);
//! the rest of the match is in `model_args`: LayerNorm eps 1e-6 (timm's ViT default), qkv with
//! bias, exact-erf GELU, no layer scale, the CLS token after the final norm
//! (`global_pool="token"`, `num_classes=0`). Register tokens follow timm's own DINOv2
//! conversion (`_convert_dinov2`): `reg_tokens=R`, `no_embed_class=True`, the class token's
//! position folded into `cls_token` (registers have no position, as in our model).
use super::model_record::{arch_name, Source};
use super::{ExportError, Staging};
use crate::config::Arch;
use crate::model::channels;
use std::collections::HashMap;
use tch::{Kind, Tensor};

/// Why a model cannot be a timm ViT, or None.
pub fn unsupported(src: &Source) -> Option<String> {
    let why = channels::for_mode(src.model.mode).timm_unsupported()?;
    Some(format!(
        "model.channels: {} is channel-adaptive ({why}); timm's VisionTransformer has one fixed patch embedding over a fixed channel list (use --format torchscript, or a model.channels: fixed model)",
        src.model.mode.name(),
    ))
}

/// timm's registered name for this size (the `model_args` in `config.json` fix every size
/// anyway, so an unregistered patch size borrows the patch-16 name).
pub fn architecture(arch: Arch, patch_size: usize) -> String {
    let size = arch_name(arch).trim_start_matches("vit_").to_string();
    let registered = matches!(
        (arch, patch_size),
        (Arch::VitTiny, 16)
            | (Arch::VitSmall | Arch::VitBase, 8 | 16 | 32)
            | (Arch::VitLarge, 16 | 32)
    );
    let patch = if registered { patch_size } else { 16 };
    format!("vit_{size}_patch{patch}_224")
}

/// The state dict under timm's names, float32 and contiguous, sorted by name.
pub fn state_dict(src: &Source) -> Vec<(String, Tensor)> {
    let cfg = src.vit_config();
    // Our registers sit without positions: timm expresses that only with no_embed_class,
    // so a model with a class position moves it into the class token.
    let fold = src.model.num_register_tokens > 0 && !cfg.no_embed_class;
    let ours = src.tensors();
    let class_pos = ours
        .iter()
        .find(|(n, _)| n == "pos_embed")
        .map(|(_, t)| t.narrow(1, 0, 1))
        .expect("a ViT has a position embedding");
    let mut out = Vec::new();
    for (name, t) in ours {
        let t = t.detach().to_kind(Kind::Float);
        match name.as_str() {
            // no_embed_class: the class token's position moves into the token itself.
            "cls_token" if fold => out.push((name, t + &class_pos)),
            "pos_embed" if fold => {
                let n = t.size()[1];
                out.push((name, t.narrow(1, 1, n - 1)));
            }
            _ => out.push((crate::model::timm::timm_name(&name), t)),
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.into_iter().map(|(n, t)| (n, t.contiguous())).collect()
}

/// timm's `config.json` (the layout `timm.models.push_to_hf` writes): `model_args` rebuild
/// the network, `pretrained_cfg` holds the input description. `pretrained_cfg` is timm's
/// `PretrainedCfg` dataclass, which rejects unknown keys, so the channel names are in its
/// `notes` (one `channel i: NAME` each) and, as a list, in the top-level `channel_names`.
pub fn config_json(src: &Source) -> serde_json::Value {
    let cfg = src.vit_config();
    let k = src.model.channel_names.len();
    let r = src.model.num_register_tokens;
    let notes: Vec<String> = src
        .model
        .channel_names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("channel {i}: {n}"))
        .collect();
    serde_json::json!({
        "architecture": architecture(src.model.arch, src.model.patch_size),
        "num_classes": 0,
        "num_features": cfg.embed_dim,
        "global_pool": "token",
        "channel_names": src.model.channel_names,
        // Marks the folder as this project's export (`--force` replaces only such folders)
        // and records where the input size came from.
        super::MARKER: {"format": "timm", "input_size": src.input.json()},
        "model_args": {
            "img_size": cfg.img_size,
            "patch_size": cfg.patch_size,
            "in_chans": k,
            "embed_dim": cfg.embed_dim,
            "depth": cfg.depth,
            "num_heads": cfg.num_heads,
            "mlp_ratio": cfg.mlp_ratio,
            "qkv_bias": true,
            "class_token": true,
            "global_pool": "token",
            "reg_tokens": r,
            "no_embed_class": r > 0 || cfg.no_embed_class,
            "init_values": cfg.layer_scale,
            "num_classes": 0,
        },
        "pretrained_cfg": {
            "tag": "scdino",
            "custom_load": false,
            "input_size": [k, cfg.img_size, cfg.img_size],
            "fixed_input_size": true,
            "interpolation": "bilinear",
            "crop_pct": 1.0,
            "crop_mode": "center",
            "mean": src.mean,
            "std": src.std,
            "num_classes": 0,
            "pool_size": null,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
            "description": format!(
                "scDINO ViT-DINO {} backbone trained with trainer (scdino-rs) on {k} channels: {}. Input: each channel min-max scaled to [0, 1] per image, then (x - mean) / std per channel.",
                super::model_record::network_name(src.network),
                src.model.channel_names.join(", ")
            ),
            "notes": notes,
        },
    })
}

/// Writes `model.safetensors` and `config.json`; returns the model card's loading section.
pub fn write(src: &Source, staging: &Staging) -> Result<String, ExportError> {
    if let Some(why) = unsupported(src) {
        return Err(ExportError::Unsupported {
            path: src.path.clone(),
            format: "timm",
            why,
        });
    }
    let tensors = state_dict(src);
    let bytes = serialize(&tensors).map_err(|what| ExportError::Invalid {
        path: staging.path("model.safetensors"),
        what,
    })?;
    staging.write("model.safetensors", &bytes)?;
    let config = config_json(src);
    let text = serde_json::to_string_pretty(&config).expect("the config serializes") + "\n";
    staging.write("config.json", text.as_bytes())?;
    Ok(how_to_load(src, &config))
}

/// The exact Python lines that load this export.
fn how_to_load(src: &Source, config: &serde_json::Value) -> String {
    let args = &config["model_args"];
    let arch = config["architecture"].as_str().unwrap_or_default();
    let kwargs = format!(
        "num_classes=0, global_pool=\"token\", img_size={}, patch_size={}, in_chans={}, embed_dim={}, depth={}, num_heads={}, reg_tokens={}, no_embed_class={}",
        args["img_size"],
        args["patch_size"],
        args["in_chans"],
        args["embed_dim"],
        args["depth"],
        args["num_heads"],
        args["reg_tokens"],
        if args["no_embed_class"] == true { "True" } else { "False" },
    ) + &match src.vit_config().layer_scale {
        Some(v) => format!(", init_values={v:e}"),
        None => String::new(),
    };
    format!(
        r#"With timm (tested with timm 1.0.31), from this folder:

```python
import timm, torch
model = timm.create_model("local-dir:/path/to/this/folder", pretrained=True).eval()
```

or from the weights file alone, giving the architecture:

```python
model = timm.create_model("{arch}", pretrained=True,
    pretrained_cfg_overlay=dict(file="/path/to/this/folder/model.safetensors"),
    {kwargs}).eval()
```

or as a plain state dict:

```python
from safetensors.torch import load_file
model = timm.create_model("{arch}", pretrained=False, {kwargs})
model.load_state_dict(load_file("/path/to/this/folder/model.safetensors"))
model.eval()
```

`model(x)` with `x` a float32 `[B, {k}, {s}, {s}]` tensor, normalised with the mean and std of the channel table, is the CLS
token after the final norm, `[B, {d}]`: the feature this project's analyses use (they
L2-normalise it). The input size is fixed at {s}×{s}. {explain} (`dynamic_img_size=True`
accepts other sizes, but timm resamples the position embeddings its own way, not DINO's.)
"#,
        explain = src
            .input
            .explain(&src.model.vit_config(), src.config.as_ref()),
        k = src.model.channel_names.len(),
        s = args["img_size"],
        d = config["num_features"],
    )
}

/// safetensors bytes with Hugging Face's `{"format": "pt"}` metadata.
fn serialize(tensors: &[(String, Tensor)]) -> Result<Vec<u8>, String> {
    let info = HashMap::from([("format".to_string(), "pt".to_string())]);
    crate::tensor_file::serialize(tensors, info).map_err(|e| e.to_string())
}
