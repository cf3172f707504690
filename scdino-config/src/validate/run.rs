//! `run:` — the run's name and seed.
use crate::{Invalid, RunSection, Validator};

impl RunSection {
    pub(crate) fn validate(&self, v: &Validator) -> Result<(), Invalid> {
        v.folder_name(&self.name, "run.name")?;
        v.check(
            self.seed <= u64::from(u32::MAX),
            "run.seed",
            "must be between 0 and 4294967295 (numpy's seed range, needed to reproduce scDINO's splits)",
        )
    }
}
