//! End-to-end tests: the real `trainer` and `launcher` binaries on real files.
mod chammi_cli;
mod collectives_cli;
mod dist_cli;
mod docs_cli;
mod image_cli;
mod launcher_cli;
mod pipeline_cli;
mod shards_cli;
mod train_cli;
mod trainer_cli;
mod util;
mod version_cli;
mod workflows_cli;
