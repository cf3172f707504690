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
    /// The side in pixels of the square images the export takes. Default: the run's
    /// downstream.features.resize_length, at which the export gives the features stage's numbers.
    #[arg(long, value_name = "PX", value_parser = clap::value_parser!(u32).range(1..))]
    image_size: Option<u32>,
    /// Export the student's backbone instead of the teacher's (DINO evaluates the teacher).
    #[arg(long)]
    student: bool,
    /// Replace --out when it holds a previous export (any other folder is refused, untouched).
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
            image_size: self.image_size.map(|s| s as usize),
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
