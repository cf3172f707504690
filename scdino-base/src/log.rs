//! The log format both binaries write. Diagnostics go through `tracing` and land on stderr,
//! one line per event, written with a single `write` call: the ranks of a job share stderr
//! (and the Slurm log file), and a line assembled from several writes could be cut by
//! another rank's output (a checksum the tests compare, a stage the log reports).
//!
//! Two formats:
//! - `text` (default) keeps the lines readable in a terminal and a Slurm log: the message
//!   alone, `warning: `/`error: ` in front of warnings and errors, and, when the process is one
//!   rank of several, `[rank R/W local L HOST] ` in front of every line. Our own events write
//!   the whole human text into the message, so their structured fields (for JSON) are not
//!   repeated; events of other crates (object_store, reqwest, ...) get their fields appended
//!   as `key=value`, since their message alone is often not enough.
//! - `json`: one object per line for log shipping (`timestamp` in UTC RFC 3339, `level`,
//!   `target`, `message`, `host`, and `rank`/`local_rank`/`world_size` when distributed,
//!   the event's own fields under `fields`).
//!
//! The level filter is `SCDINO_LOG`, else `RUST_LOG` (`tracing-subscriber`'s `EnvFilter`
//! syntax, e.g. `info,trainer::data=debug`), else `info` for the binary's own crates and
//! `warn` for every dependency (their info events are internal timings a user did not ask
//! for: `SCDINO_LOG=info` shows them).
use std::fmt::Write as _;
use std::sync::OnceLock;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The variable naming the format for processes that get no `--log-format` (ranks spawned by
/// `trainer launch`, jobs whose command line the user does not write).
pub const FORMAT_ENV: &str = "SCDINO_LOG_FORMAT";
/// The variable holding the level filter (read before `RUST_LOG`).
pub const FILTER_ENV: &str = "SCDINO_LOG";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log format {other:?} is neither `text` nor `json`")),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which process of a job wrote a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub host: String,
    /// `(rank, local_rank, world_size)` when the process is one rank of a distributed job.
    pub rank: Option<(usize, usize, usize)>,
}

impl Identity {
    /// This host, not part of a distributed job.
    pub fn local() -> Self {
        Self {
            host: hostname(),
            rank: None,
        }
    }

    fn text_prefix(&self) -> Option<String> {
        self.rank
            .filter(|&(_, _, world)| world > 1)
            .map(|(rank, local, world)| {
                format!("[rank {rank}/{world} local {local} {}] ", self.host)
            })
    }
}

/// `line` without the `[rank R/W local L HOST] ` that text lines of a distributed process
/// start with, for programs that read the trainer's logs (e.g. `launcher scaling`).
pub fn without_rank_prefix(line: &str) -> &str {
    line.strip_prefix("[rank ")
        .and_then(|rest| rest.split_once("] "))
        .map_or(line, |(_, message)| message)
}

/// The machine's host name (as `hostname` prints it), or `unknown`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

#[derive(Debug, thiserror::Error)]
pub enum LogInitError {
    #[error(
        "{var}={value:?} is not a log filter (e.g. `info` or `info,trainer::data=debug`): {reason}"
    )]
    Filter {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("{FORMAT_ENV}={0:?} is neither `text` nor `json`")]
    Format(String),
}

/// Where a finished line goes: stderr by default; the trainer routes it around its progress
/// bar so the bar is redrawn below the line instead of being overwritten.
pub type Sink = fn(&[u8]);

fn stderr_sink(line: &[u8]) {
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line);
}

static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// The format installed by [`init`] (text when none was), for passing on to child processes.
pub fn current_format() -> LogFormat {
    FORMAT.get().copied().unwrap_or_default()
}

/// A binary's final error: in text as `fn main() -> anyhow::Result` prints it (`Error: ` and
/// `chain`, the causes one per line, see [`chain_text`]), in JSON as one error line
/// (`one_line`, the causes joined by `: `).
pub fn report_error(chain: &str, one_line: &str) {
    match current_format() {
        LogFormat::Text => eprintln!("Error: {chain}"),
        LogFormat::Json => tracing::error!("{one_line}"),
    }
}

/// An error and its causes as anyhow's `{:?}` lays them out (the message, then `Caused by:`
/// and the causes, numbered when there are several), without the stack backtrace anyhow
/// appends when `RUST_BACKTRACE` is set: a user's error (a config key, a missing file) is
/// the message, and a backtrace of the binary only hides it.
pub fn chain_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let causes: Vec<String> = std::iter::successors(error.source(), |e| e.source())
        .map(ToString::to_string)
        .collect();
    if !causes.is_empty() {
        text.push_str("\n\nCaused by:");
        for (i, c) in causes.iter().enumerate() {
            if causes.len() == 1 {
                let _ = write!(text, "\n    {c}");
            } else {
                let _ = write!(text, "\n    {i}: {c}");
            }
        }
    }
    text
}

/// The format given on the command line, else [`FORMAT_ENV`], else text.
pub fn format_from(flag: Option<LogFormat>) -> Result<LogFormat, LogInitError> {
    if let Some(f) = flag {
        return Ok(f);
    }
    match std::env::var(FORMAT_ENV) {
        Ok(v) if !v.trim().is_empty() => v.parse().map_err(|_| LogInitError::Format(v)),
        _ => Ok(LogFormat::Text),
    }
}

/// Installs the global subscriber. `own_targets` are the crate names whose events carry the
/// full text in their message. A second call (tests) leaves the first subscriber in place.
pub fn init(
    format: LogFormat,
    identity: Identity,
    own_targets: &'static [&'static str],
    sink: Option<Sink>,
) -> Result<(), LogInitError> {
    let filter = filter_from_env(own_targets)?;
    let layer = Lines {
        format,
        prefix: identity.text_prefix(),
        identity,
        own_targets,
        sink: sink.unwrap_or(stderr_sink),
    };
    if tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init()
        .is_ok()
    {
        let _ = FORMAT.set(format);
    }
    Ok(())
}

/// `info` for `own_targets`, `warn` for everything else.
pub fn default_filter(own_targets: &[&str]) -> String {
    let mut f = String::from("warn");
    for t in own_targets {
        let _ = write!(f, ",{t}=info");
    }
    f
}

fn filter_from_env(own_targets: &[&str]) -> Result<EnvFilter, LogInitError> {
    for var in [FILTER_ENV, "RUST_LOG"] {
        if let Ok(value) = std::env::var(var) {
            if value.trim().is_empty() {
                continue;
            }
            return EnvFilter::try_new(&value).map_err(|e| LogInitError::Filter {
                var,
                value,
                reason: e.to_string(),
            });
        }
    }
    Ok(EnvFilter::new(default_filter(own_targets)))
}

struct Lines {
    format: LogFormat,
    identity: Identity,
    prefix: Option<String>,
    own_targets: &'static [&'static str],
    sink: Sink,
}

impl<S: Subscriber> Layer<S> for Lines {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let line = match self.format {
            LogFormat::Text => {
                let own = self.own_targets.iter().any(|t| {
                    meta.target()
                        .strip_prefix(t)
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
                });
                text_line(
                    self.prefix.as_deref(),
                    *meta.level(),
                    &fields,
                    !own || fields.message.is_empty(),
                )
            }
            LogFormat::Json => json_line(
                &self.identity,
                *meta.level(),
                meta.target(),
                fields,
                std::time::SystemTime::now(),
            ),
        };
        (self.sink)(line.as_bytes());
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: serde_json::Map<String, serde_json::Value>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.rest
                .insert(field.name().into(), format!("{value:?}").into());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.rest.insert(field.name().into(), value.into());
        }
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity; a diverged loss is exactly what a log must show.
        let v = serde_json::Number::from_f64(value)
            .map(serde_json::Value::Number)
            .unwrap_or_else(|| value.to_string().into());
        self.rest.insert(field.name().into(), v);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.rest.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.rest.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.rest.insert(field.name().into(), value.into());
    }
}

fn text_line(prefix: Option<&str>, level: Level, fields: &Fields, with_fields: bool) -> String {
    let mut line = String::with_capacity(fields.message.len() + 64);
    if let Some(p) = prefix {
        line.push_str(p);
    }
    line.push_str(match level {
        Level::ERROR => "error: ",
        Level::WARN => "warning: ",
        Level::INFO => "",
        Level::DEBUG => "debug: ",
        Level::TRACE => "trace: ",
    });
    line.push_str(&fields.message);
    if with_fields {
        for (k, v) in &fields.rest {
            let sep = if line.ends_with(' ') || line.is_empty() {
                ""
            } else {
                " "
            };
            match v {
                serde_json::Value::String(s) => {
                    let _ = write!(line, "{sep}{k}={s}");
                }
                other => {
                    let _ = write!(line, "{sep}{k}={other}");
                }
            }
        }
    }
    line.push('\n');
    line
}

fn json_line(
    identity: &Identity,
    level: Level,
    target: &str,
    fields: Fields,
    now: std::time::SystemTime,
) -> String {
    let mut o = serde_json::Map::new();
    o.insert("timestamp".into(), rfc3339_utc(now).into());
    o.insert("level".into(), level.as_str().into());
    o.insert("target".into(), target.into());
    o.insert("message".into(), fields.message.into());
    o.insert("host".into(), identity.host.clone().into());
    if let Some((rank, local, world)) = identity.rank {
        o.insert("rank".into(), rank.into());
        o.insert("local_rank".into(), local.into());
        o.insert("world_size".into(), world.into());
    }
    if !fields.rest.is_empty() {
        o.insert("fields".into(), serde_json::Value::Object(fields.rest));
    }
    let mut line = serde_json::Value::Object(o).to_string();
    line.push('\n');
    line
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC, milliseconds).
pub fn rfc3339_utc(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm): the
/// one copy every date the workspace writes goes through.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[derive(Debug)]
    struct Chained(&'static str, Option<Box<Chained>>);
    impl std::fmt::Display for Chained {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Chained {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    /// anyhow's layout (checked against `fn main() -> anyhow::Result` with RUST_BACKTRACE
    /// unset), never a backtrace.
    #[test]
    fn error_chains_read_as_anyhow_prints_them_without_a_backtrace() {
        let one = Chained("config.yaml: train.lr", None);
        assert_eq!(chain_text(&one), "config.yaml: train.lr");
        let two = Chained(
            "bad config",
            Some(Box::new(Chained("line 3: lr must be > 0", None))),
        );
        assert_eq!(
            chain_text(&two),
            "bad config\n\nCaused by:\n    line 3: lr must be > 0"
        );
        let three = Chained(
            "a",
            Some(Box::new(Chained("b", Some(Box::new(Chained("c", None)))))),
        );
        assert_eq!(chain_text(&three), "a\n\nCaused by:\n    0: b\n    1: c");
    }

    /// Without SCDINO_LOG/RUST_LOG: the binary's crates at info, dependencies at warn.
    #[test]
    fn the_default_filter_keeps_dependencies_quiet() {
        use tracing_subscriber::layer::SubscriberExt;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        struct Record(std::sync::Arc<std::sync::Mutex<Vec<String>>>);
        impl<S: Subscriber> Layer<S> for Record {
            fn on_event(&self, e: &Event<'_>, _: Context<'_, S>) {
                self.0.lock().unwrap().push(format!(
                    "{} {}",
                    e.metadata().level(),
                    e.metadata().target()
                ));
            }
        }
        let filter = EnvFilter::new(default_filter(&["trainer", "scdino_base"]));
        let subscriber =
            tracing_subscriber::registry().with(Record(seen.clone()).with_filter(filter));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "trainer::pipeline", "ours");
            tracing::debug!(target: "trainer::pipeline", "ours, debug");
            tracing::info!(target: "umap_rs::set_operations", "theirs");
            tracing::warn!(target: "object_store::client", "theirs, warn");
            tracing::info!(target: "scdino_base::log", "ours too");
        });
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "INFO trainer::pipeline",
                "WARN object_store::client",
                "INFO scdino_base::log"
            ]
        );
    }

    #[test]
    fn timestamps_match_python_datetime() {
        // python3 -c "import datetime as d; print(d.datetime.fromtimestamp(T, d.timezone.utc))"
        let cases = [
            (0u64, "1970-01-01T00:00:00.000Z"),
            (951_782_400, "2000-02-29T00:00:00.000Z"),
            (1_795_618_861, "2026-11-25T15:01:01.000Z"),
            (4_107_542_399, "2100-02-28T23:59:59.000Z"),
        ];
        for (secs, want) in cases {
            assert_eq!(rfc3339_utc(UNIX_EPOCH + Duration::from_secs(secs)), want);
        }
        assert_eq!(
            rfc3339_utc(UNIX_EPOCH + Duration::from_millis(1_500)),
            "1970-01-01T00:00:01.500Z"
        );
    }

    fn fields(message: &str, rest: &[(&str, serde_json::Value)]) -> Fields {
        Fields {
            message: message.into(),
            rest: rest
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    #[test]
    fn text_lines_carry_the_rank_only_when_distributed() {
        let one = Identity {
            host: "n1".into(),
            rank: Some((0, 0, 1)),
        };
        let two = Identity {
            host: "n1".into(),
            rank: Some((1, 1, 2)),
        };
        let f = fields("loss: 1.0", &[("loss", 1.0.into())]);
        assert_eq!(
            text_line(one.text_prefix().as_deref(), Level::INFO, &f, false),
            "loss: 1.0\n"
        );
        assert_eq!(
            text_line(two.text_prefix().as_deref(), Level::WARN, &f, false),
            "[rank 1/2 local 1 n1] warning: loss: 1.0\n"
        );
        assert_eq!(
            text_line(
                None,
                Level::WARN,
                &fields("retrying", &[("attempt", 2.into())]),
                true
            ),
            "warning: retrying attempt=2\n"
        );
        assert_eq!(
            without_rank_prefix("[rank 1/2 local 1 n1] warning: loss: 1.0"),
            "warning: loss: 1.0"
        );
        assert_eq!(without_rank_prefix("loss: 1.0"), "loss: 1.0");
    }

    #[test]
    fn json_lines_are_one_object_with_identity_and_fields() {
        let id = Identity {
            host: "n2".into(),
            rank: Some((3, 1, 4)),
        };
        let f = fields(
            "Epoch: [0/2]",
            &[("loss", 2.5.into()), ("nan", "NaN".into())],
        );
        let line = json_line(&id, Level::INFO, "trainer::train", f, UNIX_EPOCH);
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["timestamp"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "trainer::train");
        assert_eq!(v["message"], "Epoch: [0/2]");
        assert_eq!(v["host"], "n2");
        assert_eq!(
            (
                v["rank"].as_u64(),
                v["local_rank"].as_u64(),
                v["world_size"].as_u64()
            ),
            (Some(3), Some(1), Some(4))
        );
        assert_eq!(v["fields"]["loss"], 2.5);
        assert_eq!(v["fields"]["nan"], "NaN");
    }

    #[test]
    fn formats_parse_and_reject() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!("yaml"
            .parse::<LogFormat>()
            .unwrap_err()
            .contains("\"yaml\""));
    }
}
