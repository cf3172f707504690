//! `trainer export`: a trained backbone as files other tools load without this crate: timm's
//! `VisionTransformer` (safetensors + `config.json`) or a TorchScript module. Each export is a
//! folder with a `README.md` model card saying what the model was trained on and how to load
//! it. What a format cannot express (a channel-adaptive model in timm) is refused, never
//! written approximately.
mod card;
mod model_record;
mod output;
mod timm;
mod torchscript;

pub use model_record::{InputSize, InputSizeFrom, ModelRecord, Source};
pub use output::Staging;

use crate::config::CheckpointKey;
use std::path::{Path, PathBuf};

/// The `config.json` key that marks a folder as written by `trainer export`.
pub const MARKER: &str = "scdino_export";

/// The files an export folder may hold (whatever its format).
const EXPORT_FILES: [&str; 4] = ["README.md", "config.json", "model.safetensors", "model.pt"];

/// The file formats an export can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `model.safetensors` with timm's `VisionTransformer` names, timm's `config.json`.
    Timm,
    /// `model.pt`: a traced TorchScript module, normalisation inside.
    Torchscript,
}

impl Format {
    pub fn name(&self) -> &'static str {
        match self {
            Format::Timm => "timm",
            Format::Torchscript => "torchscript",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    /// A checkpoint that records no model (imported from a `.pth`): export refuses it, a
    /// `model.init` of format `run` reads its layout from its tensors instead.
    #[error("{path}: the checkpoint does not record its model (no {missing} in its fingerprint){imported}; export needs a checkpoint written by `trainer train`")]
    Unrecorded {
        path: PathBuf,
        missing: String,
        /// ", it was imported from a .pth" when the fingerprint says so, else empty.
        imported: &'static str,
    },
    /// A `.pth` (or any `torch.save` file) given as `--checkpoint`: safetensors would only
    /// say its header is too large.
    #[error("{path} is a PyTorch file (`torch.save`, e.g. a scDINO/DINO/DINOv2 .pth), not a checkpoint written by `trainer train`; export needs one of those, which records the model, its channels and their mean/std: start a run from the file (model.init: {{from: {path}, format: pth}}) and export that run's checkpoint (`trainer features --checkpoint` reads the .pth as it is)")]
    PyTorchFile { path: PathBuf },
    #[error("cannot export {path} as {format}: {why}")]
    Unsupported {
        path: PathBuf,
        format: &'static str,
        why: String,
    },
    #[error("{0} exists and is not empty; pass --force to replace it")]
    NotEmpty(PathBuf),
    #[error("{path} is not a previous export ({why}); --force only replaces a folder `trainer export` wrote, so this one is left as it is: choose another --out")]
    NotAnExport { path: PathBuf, why: String },
    #[error("{path}: {context}: {source}")]
    Io {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Torch {
        what: String,
        #[source]
        source: tch::TchError,
    },
}

/// What `trainer export` was asked for.
#[derive(Debug, Clone)]
pub struct ExportRequest {
    pub checkpoint: PathBuf,
    pub format: Format,
    pub out: PathBuf,
    /// The teacher (DINO's evaluated network, the default) or the student.
    pub network: CheckpointKey,
    /// Replace `out` when it holds a previous export (never any other folder).
    pub force: bool,
    /// The side of the square images the export takes; None: the run's features stage's
    /// `downstream.features.resize_length`, so the export gives the pipeline's features.
    pub image_size: Option<usize>,
}

/// Writes the export of `req` to `req.out` (all files or none: they are written to a
/// hidden folder beside it that replaces it at the end) and returns the files written.
pub fn export(req: &ExportRequest) -> Result<Vec<PathBuf>, ExportError> {
    let staging = Staging::begin(&req.out, req.force)?;
    let src = Source::load(&req.checkpoint, req.network, req.image_size)?;
    tracing::info!(
        "exporting the {} backbone of {} ({}) as {}",
        model_record::network_name(req.network),
        req.checkpoint.display(),
        src.model.describe(),
        req.format.name()
    );
    let how_to_load = match req.format {
        Format::Timm => timm::write(&src, &staging)?,
        Format::Torchscript => torchscript::write(&src, &staging)?,
    };
    let card = card::model_card(&src, req.format, &how_to_load);
    staging.write("README.md", card.as_bytes())?;
    staging.commit()
}

/// `path` as the error of an I/O `context`.
fn io<'a>(
    path: &'a Path,
    context: &'static str,
) -> impl FnOnce(std::io::Error) -> ExportError + 'a {
    move |source| ExportError::Io {
        path: path.to_path_buf(),
        context,
        source,
    }
}
