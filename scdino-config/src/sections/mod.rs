//! The YAML schema: one struct per section, one file per top-level section (as `validate/`
//! checks them), every field defaulted to scDINO's `scDINO_full_pipeline.yaml` value (or its
//! argparse default where the yaml is silent).
//!
//! Unknown keys are rejected (`deny_unknown_fields`) because scDINO silently ignored its own
//! misspelled keys (`warump_epochs`, `techer_temp`) and trained with values nobody chose.
//! The doc comment of each field names the scDINO key it replaces; docs/config-reference.md is
//! generated from those comments (`crate::reference` reads every file here).
mod augment;
mod data;
mod downstream;
mod model;
mod run;
mod train;

pub use augment::*;
pub use data::*;
pub use downstream::*;
pub use model::*;
pub use run::*;
pub use train::*;

use serde::{Deserialize, Serialize};

/// The whole file as written by the user, with defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Sections {
    pub run: RunSection,
    pub data: DataSection,
    pub model: ModelSection,
    pub train: TrainSection,
    pub augment: AugmentSection,
    pub downstream: DownstreamSection,
}
