use anyhow::{bail, Context, Result};
use clap::Subcommand;
use std::path::PathBuf;
use trainer::config::{scdino, Config};
use trainer::probe::check_dataset;
use trainer::train::init_layout::load_config;

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a config; exits non-zero with the offending key and line.
    Check { file: PathBuf },
    /// Print the fully resolved config (every default written out).
    Show { file: PathBuf },
    /// Print every key with its default (scDINO's), as YAML that `config check` accepts: a
    /// starting point for a new run config.
    Default,
    /// Convert a scDINO pipeline yaml to our format (stdout); notes go to stderr.
    ImportScdino { file: PathBuf },
}

impl ConfigCommand {
    pub fn run(self) -> Result<()> {
        match self {
            ConfigCommand::Check { file } => {
                let cfg = load_config(&file)?;
                println!(
                    "{}: valid ({} channel combination(s), {:?}/{}, dataset {})",
                    file.display(),
                    cfg.channel_sets.len(),
                    cfg.model.arch,
                    cfg.model.patch_size,
                    cfg.data.dataset_dir
                );
                // The profiling recipe's keys belong to `metrics profile`, not the config
                // crate: read it here, so a typo shows before a run reaches the stage.
                if cfg.downstream.profiling.recipe.is_some() {
                    trainer::pipeline::profiling::configured_recipe(&cfg)
                        .with_context(|| format!("{}: downstream.profiling.recipe", file.display()))?;
                    println!("downstream.profiling.recipe: a valid profiling recipe");
                }
                match check_dataset(&cfg)
                    .with_context(|| format!("{}: data.dataset_dir", file.display()))?
                {
                    Some(d) => {
                        if !d.skipped_other_images.is_empty() {
                            tracing::warn!(
                                "{} non-TIFF image(s) skipped (e.g. {}); scDINO's ImageFolder would have counted them, so its split indices differ from ours",
                                d.skipped_other_images.len(),
                                d.skipped_other_images[0].display()
                            );
                        }
                        println!(
                        "dataset: {} images, {} labels ({}), {} channels of {}x{} px",
                        d.images,
                        d.labels.len(),
                        d.labels.join(", "),
                        d.first_image_channels,
                        d.first_image_size.0,
                        d.first_image_size.1
                        )
                    }
                    None => println!(
                        "dataset: {} does not exist on this machine; not checked",
                        cfg.data.dataset_dir
                    ),
                }
                Ok(())
            }
            ConfigCommand::Default => {
                let cfg = Config::from_yaml("", "<defaults>")?;
                print!(
                    "# Every key of the trainer's run config with its default (trainer config default).\n{}",
                    cfg.to_yaml()
                );
                Ok(())
            }
            ConfigCommand::Show { file } => {
                let cfg = load_config(&file)?;
                print!("{}", cfg.to_yaml());
                Ok(())
            }
            ConfigCommand::ImportScdino { file } => {
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read {}", file.display()))?;
                let imported = scdino::import(&text, &file.display().to_string())?;
                print!(
                    "# Imported from scDINO config {}\n{}",
                    file.display(),
                    imported.config.to_yaml()
                );
                for n in &imported.notes {
                    tracing::info!("note: {n}");
                }
                for u in &imported.unmapped {
                    tracing::info!("not mapped: {u}");
                }
                if imported.unmapped.is_empty() {
                    tracing::info!("all fields mapped");
                } else {
                    tracing::info!("{} field(s) could not be mapped", imported.unmapped.len());
                }
                Ok(())
            }
        }
        .or_else(|e: anyhow::Error| bail!("{e:#}"))
    }
}
