//! Validation of `downstream.metrics` (the profiling scores, issue 34), kept apart so the
//! section's rules live beside each other.
use crate::validate::Invalid;
use crate::{MetricsSection, Validator};

/// `downstream.metrics`: column names of the profile tables and sizes that make sense.
pub(crate) fn validate_metrics(v: &Validator, m: &MetricsSection) -> Result<(), Invalid> {
    for (value, key) in [
        (&m.label, "downstream.metrics.label"),
        (&m.batch, "downstream.metrics.batch"),
    ] {
        v.check(
            value.starts_with("Metadata_") && value.len() > "Metadata_".len(),
            key,
            "must name a metadata column of the profile table (`Metadata_…`)",
        )?;
    }
    v.check(
        m.label != m.batch,
        "downstream.metrics.batch",
        "must differ from downstream.metrics.label",
    )?;
    v.check(
        m.null_size > 0,
        "downstream.metrics.null_size",
        "must be at least 1",
    )?;
    v.check(
        m.n_neighbors >= 2,
        "downstream.metrics.n_neighbors",
        "must be at least 2",
    )
}
