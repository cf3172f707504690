//! `trainer embed`: a checkpoint's CLS features of any set of images, in any layout, at any
//! scale, as a profile table (`Metadata_*`, then float32 `DINO_CLS_*`).
//!
//! * [`images`]: which images (a folder or `s3://` prefix listed recursively, or a CSV list),
//!   sorted; [`metadata`]: `Metadata_*` from a path pattern and a CSV join, with a report of
//!   what does not line up; [`model`]: the backbone and preprocessing from the checkpoint
//!   alone; [`parts`]: resumable parts, their manifest and the merge; [`run`]: the job, split
//!   over ranks (`trainer launch`, `srun`) and Slurm array shards.
pub mod images;
pub mod metadata;
pub mod model;
pub mod parts;
pub mod process;

pub use process::{run, EmbedOptions, EmbedSummary, OnError, ScreenOf};
