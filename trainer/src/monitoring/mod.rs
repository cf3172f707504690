//! Where training telemetry goes for monitoring: TensorBoard scalar event files and a Prometheus
//! textfile for node_exporter.
//!
//! Both writers are dependency-free on purpose: the TFRecord framing, CRC32C and
//! the three protobuf messages TensorBoard needs for scalars are a few dozen
//! lines, whereas the Rust TensorBoard crates are unmaintained and would pull in
//! a protobuf code generator. Only rank 0 is expected to write.
mod crc32c;
mod prometheus;
mod proto;
pub(crate) mod tensorboard;

pub use crc32c::{crc32c, masked_crc32c};
pub use prometheus::{Metric, MetricKind, PromTextfile};
pub use tensorboard::TensorBoardWriter;

use std::path::PathBuf;

/// Errors of the metrics writers. Every variant names the file or directory
/// involved so that a full disk or a bad mount is recognisable from the log line.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// An operating-system I/O error on `path`.
    #[error("{}: {context}: {source}", path.display())]
    Io {
        path: PathBuf,
        /// What we were doing, e.g. "creating event file".
        context: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// A metric would produce a textfile that Prometheus (or node_exporter)
    /// rejects: bad metric or label name, conflicting HELP/TYPE within one
    /// family, a duplicated series. Checked before anything is written, so the
    /// previous file stays in place.
    #[error("{}: invalid metric `{metric}`: {reason}", path.display())]
    InvalidMetric {
        path: PathBuf,
        metric: String,
        reason: String,
    },
}

impl MetricsError {
    pub(crate) fn io(
        path: impl Into<PathBuf>,
        context: &'static str,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| MetricsError::Io {
            path,
            context,
            source,
        }
    }
}
