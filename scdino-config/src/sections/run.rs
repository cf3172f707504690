//! `run:`.
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where a run lives and how it is seeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunSection {
    /// `meta.name_of_run`: the run folder under `output_dir`.
    pub name: String,
    /// `meta.output_dir`.
    pub output_dir: PathBuf,
    /// `meta.seed`: split, torch and kNN seed (numpy legacy seeding needs 0..2^32-1).
    pub seed: u64,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            name: "name_of_run".into(),
            output_dir: "/outputdir".into(),
            seed: 40,
        }
    }
}
