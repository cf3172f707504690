//! The backbone as a TorchScript module (`model.pt`), traced from our own forward pass
//! (`tch::CModule::create_by_tracing`), with the per-channel normalisation inside: its input
//! is the image as the features stage has it before normalising (each channel min-max scaled
//! to [0, 1] per image, at the features stage's size), so a user needs no mean/std to use it.
//!
//! The ViT's forward takes its batch size from tensors (see `model/vit.rs`), so the traced
//! module takes any batch; the image size is the traced one (the position embeddings are
//! resampled for it, see `model_record.rs`). The traced graph sits inside a scripted module whose
//! `forward` refuses any other shape or dtype with the shape it takes (csrc/jit.cpp), since
//! a trace keeps no checks. The weights are constants of the graph:
//! `torch.jit.load(path, map_location=...)` places them.
use super::model_record::{network_name, Source};
use super::{ExportError, Staging};
use crate::model::channels::{self, CombinationInput};
use std::path::Path;
use tch::{CModule, Kind, Tensor};

/// The module's file in the export folder.
pub const FILE: &str = "model.pt";

/// What the module computes from `x` (`[B, C, H, W]`, already normalised): the mode's.
fn backbone(src: &Source, x: &Tensor) -> Tensor {
    channels::for_mode(src.model.mode).export_forward(&src.vit, x, &every_channel(src))
}

/// Every channel the model was trained on, in its order, with the run's pools (the config's
/// defaults when the checkpoint's config is gone), as the features stage embeds that
/// combination.
fn every_channel(src: &Source) -> CombinationInput {
    let features = src
        .config
        .as_ref()
        .map(|c| c.downstream.features.clone())
        .unwrap_or_default();
    CombinationInput {
        positions: None,
        trained: src.model.channel_names.len() as i64,
        bag_pool: features.bag_pool,
        tokens_pool: features.tokens_pool,
    }
}

/// The normalisation and the backbone, traced on a batch of two images of the export's
/// input size.
pub fn trace(src: &Source) -> Result<CModule, ExportError> {
    let k = src.model.channel_names.len() as i64;
    let s = src.vit_config().img_size;
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

/// The scripted `forward` around the traced graph: an input of another rank, channel count,
/// size or dtype is refused (an `AssertionError`: the C++ compiler resolves no Python
/// exception classes nor `torch.float32`, so the dtype check is
/// "floating point of 4 bytes") with the shape the module takes (traced alone, a `[B, 1, H, W]`
/// input would broadcast against the baked mean and give wrong features silently).
fn checked_forward(src: &Source) -> String {
    let k = src.model.channel_names.len();
    let s = src.vit_config().img_size;
    let expected = format!(
        "this module takes float32 [B, {k}, {s}, {s}] images (channels {}, each min-max scaled to [0, 1])",
        src.model.channel_names.join(", ")
    )
    .replace('\\', "\\\\")
    .replace('"', "'");
    format!(
        r#"
def forward(self, x: Tensor) -> Tensor:
    assert x.dim() == 4 and x.size(1) == {k} and x.size(2) == {s} and x.size(3) == {s}, "{expected}; got shape " + str(x.shape)
    assert x.is_floating_point() and x.element_size() == 4, "{expected}; got another dtype"
    return self.{INNER}.forward(x)
"#
    )
}

/// The traced backbone's name inside the exported module (`model.backbone` in Python).
const INNER: &str = "backbone";

mod shim {
    use std::os::raw::{c_char, c_int};
    extern "C" {
        pub fn shim_jit_wrap(
            traced_path: *const c_char,
            class_name: *const c_char,
            inner_name: *const c_char,
            source: *const c_char,
            out_path: *const c_char,
        ) -> c_int;
    }
}

/// Saves `traced` wrapped in a module whose `forward` is `source` (see csrc/jit.cpp).
fn save_wrapped(traced: &CModule, source: &str, out: &Path) -> Result<(), ExportError> {
    use std::ffi::CString;
    let traced_path = out.with_extension("traced.pt");
    traced
        .save(&traced_path)
        .map_err(|source| ExportError::Torch {
            what: format!("saving {}", traced_path.display()),
            source,
        })?;
    let c = |s: &str| CString::new(s).expect("no NUL in paths and generated source");
    let (tp, op) = (c(&traced_path.to_string_lossy()), c(&out.to_string_lossy()));
    let (class, inner, src) = (c("ScdinoExport"), c(INNER), c(source));
    // SAFETY: every pointer is a NUL-terminated string alive for the call; the shim catches
    // every C++ exception and returns -1 with its message kept until the next call.
    let rc = unsafe {
        shim::shim_jit_wrap(
            tp.as_ptr(),
            class.as_ptr(),
            inner.as_ptr(),
            src.as_ptr(),
            op.as_ptr(),
        )
    };
    let _ = std::fs::remove_file(&traced_path);
    if rc != 0 {
        let msg = crate::shim::last_error();
        return Err(ExportError::Invalid {
            path: out.to_path_buf(),
            what: format!("wrapping the traced backbone in its input check failed: {msg}"),
        });
    }
    Ok(())
}

/// Writes `model.pt` and `config.json` (what the module takes and gives); returns the
/// model card's loading section.
pub fn write(src: &Source, staging: &Staging) -> Result<String, ExportError> {
    let traced = trace(src)?;
    save_wrapped(&traced, &checked_forward(src), &staging.path(FILE))?;
    let config = config_json(src);
    let text = serde_json::to_string_pretty(&config).expect("the config serializes") + "\n";
    staging.write("config.json", text.as_bytes())?;
    Ok(how_to_load(src))
}

/// Output shape and meaning, per mode.
fn output(src: &Source) -> (String, &'static str) {
    let d = src.vit_config().embed_dim;
    let k = src.model.channel_names.len();
    channels::for_mode(src.model.mode).export_output(d, k, &every_channel(src))
}

/// The module's contract, machine-readable.
pub fn config_json(src: &Source) -> serde_json::Value {
    let cfg = src.vit_config();
    let (shape, meaning) = output(src);
    serde_json::json!({
        "format": "torchscript",
        "file": FILE,
        super::MARKER: {"format": "torchscript", "input_size": src.input.json()},
        "network": network_name(src.network),
        "arch": super::model_record::arch_name(src.model.arch),
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
    let cfg = src.vit_config();
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
fixed at {s}×{s}. {explain} Any other shape or dtype is refused by the module with an error
naming the shape it takes. `features`: `{shape}`, {meaning}.
"#,
        explain = src
            .input
            .explain(&src.model.vit_config(), src.config.as_ref()),
        k = src.model.channel_names.len(),
        s = cfg.img_size,
    )
}
