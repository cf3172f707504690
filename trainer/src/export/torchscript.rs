//! The backbone as a TorchScript module (`model.pt`), traced from our own forward pass
//! (`tch::CModule::create_by_tracing`), with the per-channel normalisation inside: its input
//! is the image as the features stage has it before normalising (each channel min-max scaled
//! to [0, 1] per image, at the training resolution), so a user needs no mean/std to use it.
//!
//! The ViT's forward takes its batch size from tensors (see `model/vit.rs`), so the traced
//! module takes any batch; the image size is the traced one (the position embeddings are
//! fixed for it), and another size fails in the module rather than giving other features.
//! The weights are constants of the graph: `torch.jit.load(path, map_location=...)` places
//! them.
use super::source::{network_name, Source};
use super::{ExportError, Staging};
use crate::config::ChannelMode;
use tch::{CModule, Kind, Tensor};

/// The module's file in the export folder.
pub const FILE: &str = "model.pt";

/// What the module computes from `x` (`[B, C, H, W]`, already normalised), per mode.
fn backbone(src: &Source, x: &Tensor) -> Tensor {
    match src.model.mode {
        ChannelMode::Fixed => src.vit.forward_t(x, false),
        // Every channel the model knows, in its order (no channel index in the graph).
        ChannelMode::Tokens => src.vit.forward_channels_t(x, None, false),
        // DINO-BoC: each channel through the single-channel ViT, `[B, C, D]` (the channel
        // count is fixed, the batch is not).
        ChannelMode::Bag => {
            let k = x.size()[1];
            src.vit
                .forward_t(&x.flatten(0, 1).unsqueeze(1), false)
                .unflatten(0, [-1, k])
        }
    }
}

/// The normalisation and the backbone, traced on a batch of two images of the training
/// resolution.
pub fn trace(src: &Source) -> Result<CModule, ExportError> {
    let k = src.model.channel_names.len() as i64;
    let s = src.model.vit_config().img_size;
    let mean = Tensor::from_slice(&src.mean).reshape([1, k, 1, 1]);
    let std = Tensor::from_slice(&src.std).reshape([1, k, 1, 1]);
    let example = Tensor::rand([2, k, s, s], (Kind::Float, tch::Device::Cpu));
    let mut forward = |inputs: &[Tensor]| vec![backbone(src, &((&inputs[0] - &mean) / &std))];
    tch::no_grad(|| {
        CModule::create_by_tracing("ScdinoBackbone", "forward", &[example], &mut forward)
    })
    .map_err(|source| ExportError::Torch {
        what: format!("tracing the backbone of {}", src.path.display()),
        source,
    })
}

/// Writes `model.pt` and `config.json` (what the module takes and gives); returns the
/// model card's loading section.
pub fn write(src: &Source, staging: &Staging) -> Result<String, ExportError> {
    let module = trace(src)?;
    let path = staging.path(FILE);
    module.save(&path).map_err(|source| ExportError::Torch {
        what: format!("saving {}", path.display()),
        source,
    })?;
    let config = config_json(src);
    let text = serde_json::to_string_pretty(&config).expect("the config serializes") + "\n";
    staging.write("config.json", text.as_bytes())?;
    Ok(how_to_load(src))
}

/// Output shape and meaning, per mode.
fn output(src: &Source) -> (String, &'static str) {
    let d = src.model.vit_config().embed_dim;
    let k = src.model.channel_names.len();
    match src.model.mode {
        ChannelMode::Bag => (
            format!("[B, {k}, {d}]"),
            "each channel's CLS token (DINO Bag-of-Channels): the analyses L2-normalise each and concatenate them in channel order",
        ),
        _ => (
            format!("[B, {d}]"),
            "the CLS token after the final norm: the analyses L2-normalise it",
        ),
    }
}

/// The module's contract, machine-readable.
pub fn config_json(src: &Source) -> serde_json::Value {
    let cfg = src.model.vit_config();
    let (shape, meaning) = output(src);
    serde_json::json!({
        "format": "torchscript",
        "file": FILE,
        "network": network_name(src.network),
        "arch": super::source::arch_name(src.model.arch),
        "patch_size": cfg.patch_size,
        "embed_dim": cfg.embed_dim,
        "depth": cfg.depth,
        "num_heads": cfg.num_heads,
        "num_register_tokens": cfg.num_register_tokens,
        "model_channels": src.model.mode.name(),
        "input": {
            "shape": ["B", src.model.channel_names.len(), cfg.img_size, cfg.img_size],
            "dtype": "float32",
            "channel_names": src.model.channel_names,
            "values": "each channel min-max scaled to [0, 1] per image (not yet normalised)",
        },
        "normalization_inside": {"mean": src.mean, "std": src.std},
        "output": {"shape": shape, "meaning": meaning},
    })
}

fn how_to_load(src: &Source) -> String {
    let cfg = src.model.vit_config();
    let (shape, meaning) = output(src);
    format!(
        r#"With PyTorch alone (no timm, no this project):

```python
import torch
model = torch.jit.load("/path/to/this/folder/{FILE}", map_location="cpu").eval()  # or "cuda"
with torch.no_grad():
    features = model(x)
```

`x`: float32 `[B, {k}, {s}, {s}]`, channels in the order of the channel table, each channel min-max
scaled to [0, 1] per image (what this project's preprocessing gives before normalising; the
module subtracts the mean and divides by the std itself). Any batch size; the image size is
fixed at {s}×{s}. `features`: `{shape}`, {meaning}.
"#,
        k = src.model.channel_names.len(),
        s = cfg.img_size,
    )
}
