use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use trainer::embed::{run, EmbedOptions, OnError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PrecisionArg {
    Fp32,
    Bf16,
}

/// `trainer embed`: CLS features of any images (a folder or an s3:// prefix in any layout, or
/// a CSV list) with a checkpoint, as a profile table; resumable, split over ranks and shards
/// (docs/embedding.md).
#[derive(Debug, Args)]
pub struct EmbedArgs {
    /// A checkpoint written by this trainer (it records the run config, channels and mean/std).
    #[arg(long, value_name = "CKPT")]
    checkpoint: PathBuf,
    /// The images: a folder or s3://, gs:// or az:// bucket/prefix; every .tif/.tiff below it, recursively.
    #[arg(long, value_name = "DIR|URL", required_unless_present = "screen")]
    images: Option<String>,
    /// A screen instead of --images: a config whose `data` section names it (`dataset_dir` =
    /// the LoadData table or OME-Zarr plate, `channel_names`, `data.screen`); every cell is
    /// embedded with its site's Metadata_* columns, its object number and centre.
    #[arg(long, value_name = "CONFIG.yaml", conflicts_with_all = ["images", "list"])]
    screen: Option<PathBuf>,
    /// The profile table to write (parts and manifest in OUT.parts/, errors in OUT's
    /// `.errors.parquet`).
    #[arg(long, value_name = "OUT.parquet")]
    out: PathBuf,
    /// Embed the paths in this CSV's `path` column (relative to --images) instead of listing.
    #[arg(long, value_name = "FILE.csv")]
    list: Option<PathBuf>,
    /// Metadata_* columns joined on this CSV's `path` column (relative to --images).
    #[arg(long, value_name = "FILE.csv")]
    metadata: Option<PathBuf>,
    /// Metadata_* columns parsed from each path relative to --images, e.g.
    /// '{Plate}/{Well}/{Site}_{Cell}.tiff'.
    #[arg(long, value_name = "PATTERN")]
    path_pattern: Option<String>,
    /// Comma-separated channel names to embed (a subset for tokens/bag models; a fixed model
    /// gets the channels it lacks as zeros). Default: the channels the model was trained on.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    channels: Option<Vec<String>>,
    #[arg(long, value_enum, default_value = "skip")]
    on_error: OnError,
    /// Images per forward pass (default: the run's downstream.features.batch_size_per_gpu).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    batch_size: Option<u32>,
    /// cpu, cuda (the GPU of this process's local rank) or cuda:N (default: cuda when a GPU
    /// is visible, else cpu).
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    #[arg(long, value_enum, default_value = "fp32")]
    precision: PrecisionArg,
    /// This Slurm array task's slice of the sorted image list (with --shard-count); its
    /// parts are written, not merged.
    #[arg(long, value_name = "I", requires = "shard_count")]
    shard_index: Option<usize>,
    #[arg(long, value_name = "N", requires = "shard_index", value_parser = clap::value_parser!(u32).range(1..))]
    shard_count: Option<u32>,
    /// Only merge the finished parts of every shard into OUT.
    #[arg(long, conflicts_with_all = ["shard_index", "shard_count"])]
    merge: bool,
    /// Images per part (the unit of resume).
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    part_size: u32,
    /// Threads reading and preparing images ahead of the forward passes.
    #[arg(long, value_name = "N", default_value_t = 2)]
    readers: usize,
}

impl EmbedArgs {
    pub fn run(self) -> Result<()> {
        let device = device(self.device.as_deref())?;
        let opts = EmbedOptions {
            checkpoint: self.checkpoint,
            images: self.images.unwrap_or_default(),
            screen: self.screen.map(trainer::embed::ScreenOf::File),
            out: self.out.clone(),
            list: self.list,
            metadata: self.metadata,
            path_pattern: self.path_pattern,
            channels: self.channels,
            on_error: self.on_error,
            batch_size: self.batch_size.map(|b| b as usize),
            device,
            bf16: self.precision == PrecisionArg::Bf16,
            shard: self.shard_index.zip(self.shard_count.map(|c| c as usize)),
            merge_only: self.merge,
            part_size: self.part_size as usize,
            readers: self.readers.max(1),
        };
        let s = run(&opts).with_context(|| format!("embedding into {}", self.out.display()))?;
        if !opts.merge_only {
            println!(
                "{} images: {} parts embedded, {} already finished, {} images not embedded (errors)",
                s.images, s.parts_embedded, s.parts_kept, s.errors
            );
        }
        for line in &s.metadata_report {
            println!("metadata: {line}");
        }
        if let Some((rows, errors)) = s.merged {
            println!(
                "{rows} rows -> {}; {errors} images in {}",
                self.out.display(),
                trainer::embed::parts::errors_path(&self.out).display()
            );
        }
        Ok(())
    }
}

fn device(given: Option<&str>) -> Result<tch::Device> {
    use trainer::device::{resolve_for_this_process, DeviceChoice};
    let resolve = |choice| resolve_for_this_process(choice).map_err(|e| e.asked_by("--device"));
    Ok(match given {
        None => resolve(DeviceChoice::Auto)?,
        Some("cpu") => tch::Device::Cpu,
        Some("cuda") => resolve(DeviceChoice::Cuda)?,
        Some(other) => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => tch::Device::Cuda(n),
            _ => bail!("--device {other:?}: expected cpu, cuda or cuda:N"),
        },
    })
}
