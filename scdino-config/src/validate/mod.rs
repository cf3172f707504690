//! Reporting a value that parses but makes no sense, with its key and the line it is on. The
//! run config and the launcher's `cluster.yaml` report their values the same way, so both use
//! this one helper; each file's error type takes an [`Invalid`] through `From`.
//!
//! Each section of the run config checks itself, in its own file below (`run.rs`, `data.rs`,
//! ...); [`crate::Config`]'s validation is the list of those calls, always in the same order
//! (the first refusal is the one reported). A new section adds one file and one call.
use crate::KeyLines;

mod augment;
mod data;
mod downstream;
mod model;
mod run;
mod train;

/// A value that parses but makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}{}: `{key}`: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct Invalid {
    /// The file (or `<stdin>`, or an edit's name) the value came from.
    pub origin: String,
    /// The dotted key, e.g. `train.epochs` or `stages[1]`.
    pub key: String,
    /// None for a value that is not written in the file (a default made invalid by another key).
    pub line: Option<usize>,
    pub message: String,
}

/// Checks the values of one file; every refusal names the key and, when the file has it, its
/// line.
#[derive(Debug, Clone, Copy)]
pub struct Validator<'a> {
    origin: &'a str,
    lines: &'a KeyLines,
}

impl<'a> Validator<'a> {
    pub fn new(origin: &'a str, lines: &'a KeyLines) -> Self {
        Self { origin, lines }
    }

    pub fn err(&self, key: &str, message: &str) -> Invalid {
        Invalid {
            origin: self.origin.to_string(),
            key: key.to_string(),
            line: self.lines.line_of(key),
            message: message.to_string(),
        }
    }

    /// Whether the file writes `key` itself (not a default).
    pub fn written(&self, key: &str) -> bool {
        self.lines.written(key).is_some()
    }

    pub fn check(&self, ok: bool, key: &str, message: &str) -> Result<(), Invalid> {
        if ok {
            Ok(())
        } else {
            Err(self.err(key, message))
        }
    }

    pub fn positive(&self, x: f64, key: &str) -> Result<(), Invalid> {
        self.check(
            x.is_finite() && x > 0.0,
            key,
            &format!("is {x} but must be a positive number"),
        )
    }

    pub fn non_negative(&self, x: f64, key: &str) -> Result<(), Invalid> {
        self.check(
            x.is_finite() && x >= 0.0,
            key,
            &format!("is {x} but must be zero or positive"),
        )
    }

    /// A name that becomes a folder: not blank, no `/`.
    pub fn folder_name(&self, name: &str, key: &str) -> Result<(), Invalid> {
        self.check(!name.trim().is_empty(), key, "must not be empty")?;
        self.check(
            !name.contains('/'),
            key,
            "is a folder name and must not contain '/'",
        )
    }

    pub fn fraction_open(&self, x: f64, key: &str) -> Result<(), Invalid> {
        self.check(
            x > 0.0 && x < 1.0,
            key,
            &format!("is {x} but must be strictly between 0 and 1"),
        )
    }
}
