//! Prometheus text exposition format (0.0.4) written as a node_exporter
//! textfile-collector file.
//!
//! node_exporter reads `*.prom` files in its textfile directory at every
//! scrape, so the file is replaced atomically (temp file in the same directory,
//! fsync, rename): a scrape sees the old or the new content, never a half-written
//! file. The temp file is hidden and ends in `.tmp`, so the collector's `*.prom`
//! glob never picks it up. Samples carry no timestamps: the textfile collector
//! rejects them.

use super::MetricsError;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Prometheus metric type, emitted on the `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A value that goes up and down (loss, learning rate, images/s).
    Gauge,
    /// A monotonically increasing total (steps, samples seen); by convention
    /// its name ends in `_total`.
    Counter,
}

impl MetricKind {
    fn as_str(self) -> &'static str {
        match self {
            MetricKind::Gauge => "gauge",
            MetricKind::Counter => "counter",
        }
    }
}

/// One sample: a series of the family `name`, identified by its labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// Family name, `[a-zA-Z_:][a-zA-Z0-9_:]*`.
    pub name: String,
    /// `# HELP` text (any string; escaped on output). All samples of a family
    /// must agree on it; empty means no `# HELP` line.
    pub help: String,
    pub kind: MetricKind,
    /// Label name/value pairs in output order, e.g. `("run", "exp1")`,
    /// `("rank", "0")`. Names are `[a-zA-Z_][a-zA-Z0-9_]*` without a leading
    /// `__` (reserved for Prometheus); values are any string.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Metric {
    /// A gauge without labels; add them with [`label`](Self::label).
    pub fn gauge(name: impl Into<String>, help: impl Into<String>, value: f64) -> Self {
        Self::new(name, help, MetricKind::Gauge, value)
    }

    /// A counter without labels; add them with [`label`](Self::label).
    pub fn counter(name: impl Into<String>, help: impl Into<String>, value: f64) -> Self {
        Self::new(name, help, MetricKind::Counter, value)
    }

    fn new(name: impl Into<String>, help: impl Into<String>, kind: MetricKind, value: f64) -> Self {
        Metric {
            name: name.into(),
            help: help.into(),
            kind,
            labels: Vec::new(),
            value,
        }
    }

    /// Appends a label (builder style).
    pub fn label(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.push((name.into(), value.into()));
        self
    }
}

/// Distinguishes concurrent writes' temp files within one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A Prometheus textfile, rewritten as a whole on every [`write`](Self::write).
#[derive(Debug, Clone)]
pub struct PromTextfile {
    path: PathBuf,
}

impl PromTextfile {
    /// The file to maintain, e.g. `/var/lib/node_exporter/textfile/scdino.prom`
    /// (node_exporter only reads names ending in `.prom`). Nothing is touched
    /// until the first write; the directory must exist.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        PromTextfile { path: path.into() }
    }

    /// The file this writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renders `metrics` in the text format: samples grouped by family in
    /// order of first appearance, each family preceded once by `# HELP` and
    /// `# TYPE`. Rejects input Prometheus would reject (see [`Metric`]),
    /// conflicting HELP/TYPE within a family and duplicated series.
    pub fn render(&self, metrics: &[Metric]) -> Result<String, MetricsError> {
        let invalid = |m: &Metric, reason: String| MetricsError::InvalidMetric {
            path: self.path.clone(),
            metric: m.name.clone(),
            reason,
        };
        // Families in first-appearance order; the text format requires all
        // samples of a family to be contiguous.
        let mut order: Vec<Vec<&Metric>> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        // Series identity is the label set, regardless of order.
        let mut series: HashSet<(&str, Vec<(&str, &str)>)> = HashSet::new();
        for m in metrics {
            if !valid_metric_name(&m.name) {
                return Err(invalid(
                    m,
                    "name must match [a-zA-Z_:][a-zA-Z0-9_:]*".into(),
                ));
            }
            for (i, (l, _)) in m.labels.iter().enumerate() {
                if !valid_label_name(l) {
                    return Err(invalid(
                        m,
                        format!("label name `{l}` must match [a-zA-Z_][a-zA-Z0-9_]* and not start with __"),
                    ));
                }
                if m.labels[..i].iter().any(|(o, _)| o == l) {
                    return Err(invalid(m, format!("label `{l}` given twice")));
                }
            }
            match index.get(m.name.as_str()) {
                Some(&i) => {
                    let first = order[i][0];
                    if first.kind != m.kind {
                        return Err(invalid(
                            m,
                            format!(
                                "TYPE {} conflicts with {} of an earlier sample",
                                m.kind.as_str(),
                                first.kind.as_str()
                            ),
                        ));
                    }
                    if first.help != m.help {
                        return Err(invalid(m, "HELP differs from an earlier sample's".into()));
                    }
                    order[i].push(m);
                }
                None => {
                    index.insert(&m.name, order.len());
                    order.push(vec![m]);
                }
            }
            let mut key: Vec<(&str, &str)> = m
                .labels
                .iter()
                .map(|(l, v)| (l.as_str(), v.as_str()))
                .collect();
            key.sort_unstable();
            if !series.insert((&m.name, key)) {
                return Err(invalid(m, format!("duplicate series {:?}", m.labels)));
            }
        }

        let mut out = String::new();
        for family in &order {
            let head = family[0];
            if !head.help.is_empty() {
                let _ = writeln!(out, "# HELP {} {}", head.name, escape_help(&head.help));
            }
            let _ = writeln!(out, "# TYPE {} {}", head.name, head.kind.as_str());
            for m in family {
                out.push_str(&m.name);
                if !m.labels.is_empty() {
                    out.push('{');
                    for (i, (l, v)) in m.labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{l}=\"{}\"", escape_label_value(v));
                    }
                    out.push('}');
                }
                let _ = writeln!(out, " {}", format_value(m.value));
            }
        }
        Ok(out)
    }

    /// Replaces the file with `metrics` atomically: renders (validation errors
    /// leave the old file untouched), writes a temp file next to it, fsyncs it,
    /// renames it over the target and fsyncs the directory. The temp file is
    /// removed on failure.
    pub fn write(&self, metrics: &[Metric]) -> Result<(), MetricsError> {
        let text = self.render(metrics)?;
        let name = self.path.file_name().ok_or_else(|| MetricsError::Io {
            path: self.path.clone(),
            context: "textfile path has no file name",
            source: std::io::ErrorKind::InvalidInput.into(),
        })?;
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let tmp = dir.join(format!(
            ".{}.{}.{}.tmp",
            name.to_string_lossy(),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = write_and_rename(&tmp, &self.path, text.as_bytes());
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result?;
        // Persist the rename itself; best effort, since some filesystems
        // refuse fsync on directories and the new content is already visible.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

fn write_and_rename(tmp: &Path, target: &Path, bytes: &[u8]) -> Result<(), MetricsError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)
        .map_err(MetricsError::io(tmp, "creating temp textfile"))?;
    f.write_all(bytes)
        .map_err(MetricsError::io(tmp, "writing temp textfile"))?;
    f.sync_all()
        .map_err(MetricsError::io(tmp, "syncing temp textfile"))?;
    drop(f);
    std::fs::rename(tmp, target).map_err(MetricsError::io(target, "renaming temp textfile over"))
}

fn valid_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with("__")
}

/// HELP text escapes only backslash and newline (quotes are literal there).
fn escape_help(s: &str) -> String {
    s.replace('\\', r"\\").replace('\n', r"\n")
}

/// Label values escape backslash, double quote and newline.
fn escape_label_value(s: &str) -> String {
    s.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// Prometheus spells the non-finite values `NaN`, `+Inf`, `-Inf`. Finite
/// values use Rust's shortest round-trip form, in exponent notation outside a
/// readable range (plain `Display` would print 1e300 as 301 digits).
fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v == 0.0 || (1e-4..1e15).contains(&v.abs()) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_metric_name("scdino:loss_total"));
        assert!(valid_metric_name("_x9"));
        assert!(!valid_metric_name("9x"));
        assert!(!valid_metric_name("a-b"));
        assert!(!valid_metric_name(""));
        assert!(!valid_metric_name("é"));
        assert!(valid_label_name("rank"));
        assert!(!valid_label_name("__name__"));
        assert!(!valid_label_name("a:b"));
    }

    #[test]
    fn values() {
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_value(1.5), "1.5");
        assert_eq!(format_value(0.0), "0");
        assert_eq!(format_value(1e300), "1e300");
        assert_eq!(format_value(-2.5e-7), "-2.5e-7");
        for v in [
            0.1,
            1.0 / 3.0,
            123456789.123,
            1e-300,
            f64::MAX,
            f64::MIN_POSITIVE,
        ] {
            assert_eq!(format_value(v).parse::<f64>().unwrap(), v);
        }
    }

    #[test]
    fn escaping() {
        assert_eq!(escape_label_value("a\\b\"c\nd"), r#"a\\b\"c\nd"#);
        assert_eq!(escape_help("a\\b\"c\nd"), r#"a\\b"c\nd"#);
    }
}
