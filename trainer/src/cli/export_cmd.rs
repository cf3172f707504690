use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use trainer::config::CheckpointKey;
use trainer::export::{export, ExportRequest, Format};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    /// timm's VisionTransformer: model.safetensors + config.json (`model.channels: fixed` only).
    Timm,
    /// A TorchScript module (model.pt) with the normalisation inside, for `torch.jit.load`.
    Torchscript,
}

/// `trainer export`: a checkpoint's backbone for timm or TorchScript (docs/export.md).
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A checkpoint written by `trainer train` (`checkpoint.safetensors`, `checkpointNNNN.safetensors`).
    #[arg(long, value_name = "CKPT")]
    checkpoint: PathBuf,
    #[arg(long, value_enum)]
    format: FormatArg,
    /// The folder to write (model, config.json, README.md model card); must not exist or be empty.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Export the student's backbone instead of the teacher's (DINO evaluates the teacher).
    #[arg(long)]
    student: bool,
    /// Replace --out even if it holds files.
    #[arg(long)]
    force: bool,
}

impl ExportArgs {
    pub fn run(self) -> Result<()> {
        let req = ExportRequest {
            checkpoint: self.checkpoint.clone(),
            format: match self.format {
                FormatArg::Timm => Format::Timm,
                FormatArg::Torchscript => Format::Torchscript,
            },
            out: self.out.clone(),
            network: if self.student {
                CheckpointKey::Student
            } else {
                CheckpointKey::Teacher
            },
            force: self.force,
        };
        let files = export(&req).with_context(|| {
            format!(
                "exporting {} to {}",
                self.checkpoint.display(),
                self.out.display()
            )
        })?;
        for f in files {
            println!("{}", f.display());
        }
        Ok(())
    }
}
