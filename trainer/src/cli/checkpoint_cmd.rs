use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use trainer::config::CheckpointKey;
use trainer::model::backbone::BackboneWeights;

/// `trainer checkpoint ...`: PyTorch `.pth` checkpoints (scDINO/DINO) without Python.
#[derive(Debug, Subcommand)]
pub enum CheckpointCommand {
    /// Print what a checkpoint holds: epoch, scDINO args, backbone tensors.
    Inspect(InspectArgs),
    /// Convert the backbone of a `.pth` into one of our safetensors checkpoints.
    Import(ImportArgs),
}

impl CheckpointCommand {
    pub fn run(self) -> Result<()> {
        match self {
            Self::Inspect(a) => a.run(),
            Self::Import(a) => a.run(),
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Key {
    Teacher,
    Student,
}

impl From<Key> for CheckpointKey {
    fn from(k: Key) -> Self {
        match k {
            Key::Teacher => CheckpointKey::Teacher,
            Key::Student => CheckpointKey::Student,
        }
    }
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    checkpoint: PathBuf,
    /// Which network of a training checkpoint.
    #[arg(long, value_enum, default_value = "teacher")]
    key: Key,
}

impl InspectArgs {
    fn run(self) -> Result<()> {
        let w = BackboneWeights::load(&self.checkpoint, self.key.into())
            .with_context(|| format!("reading {}", self.checkpoint.display()))?;
        describe(&w);
        if let Some(args) = &w.args {
            println!("args:");
            for (k, v) in &args.all {
                println!("  {k}: {v}");
            }
        }
        let mut names: Vec<&String> = w.tensors.keys().collect();
        names.sort();
        for n in names {
            let t = &w.tensors[n];
            println!("{n} {:?} {:?}", t.kind(), t.size());
        }
        Ok(())
    }
}

fn describe(w: &BackboneWeights) {
    let epoch = w
        .epoch
        .map(|e| format!("{e} epochs done (feature tag {})", w.tag()))
        .unwrap_or_else(|| format!("epoch unknown (feature tag {})", w.tag()));
    println!(
        "{}: {} backbone tensors, {epoch}{}",
        w.path.display(),
        w.tensors.len(),
        w.args
            .as_ref()
            .map(|a| format!(", trained with {}", a.summary()))
            .unwrap_or_default()
    );
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The `.pth` to read.
    #[arg(long)]
    pth: PathBuf,
    /// The safetensors checkpoint to write (backbone only, under `<key>.backbone.*`).
    #[arg(long)]
    out: PathBuf,
    /// Which network of a training checkpoint.
    #[arg(long, value_enum, default_value = "teacher")]
    key: Key,
}

impl ImportArgs {
    fn run(self) -> Result<()> {
        let w = BackboneWeights::load(&self.pth, self.key.into())
            .with_context(|| format!("reading {}", self.pth.display()))?;
        describe(&w);
        w.save(&self.out, self.key.into())
            .with_context(|| format!("writing {}", self.out.display()))?;
        println!("-> {}", self.out.display());
        Ok(())
    }
}
