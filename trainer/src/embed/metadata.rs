//! The `Metadata_*` columns of an embedding: fields parsed from each image's path with a
//! pattern (`{Plate}/{Well}/{Site}_{Cell}.tiff`) and columns joined from a CSV keyed by path.
//! Whatever does not line up (a path the pattern does not match, an image without a CSV row,
//! a CSV row without an image) is counted and shown by example, never dropped: the image keeps
//! its row with those columns null. A key listed twice in the CSV cannot be joined and is an
//! error.
use super::images::normalise_rel;
use crate::data::csv::{Csv, CsvError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error(transparent)]
    Csv(#[from] CsvError),
    #[error("--path-pattern {pattern:?}: {what}")]
    Pattern { pattern: String, what: String },
    #[error("{}: {count} paths have more than one row (e.g. {}); a path must have one row to be joined", path.display(), examples.join(", "))]
    DuplicateKeys {
        path: PathBuf,
        count: usize,
        examples: Vec<String>,
    },
    /// Two sources of one column name: a Parquet table cannot hold two columns of one name
    /// (pandas refuses such a file), so it is refused before anything is embedded.
    #[error("column {column} comes from {first} and from {second}; rename one")]
    Clash {
        column: String,
        first: String,
        second: String,
    },
}

/// The columns every embedding table writes besides the metadata, in table order around
/// it: the image path first, then the metadata, then these three.
pub const IMAGE_PATH: &str = "Metadata_ImagePath";
pub const CHECKPOINT: &str = "Metadata_Checkpoint";
pub const EPOCH: &str = "Metadata_Epoch";
pub const CHANNELS: &str = "Metadata_Channels";
const WRITTEN: [&str; 4] = [IMAGE_PATH, CHECKPOINT, EPOCH, CHANNELS];

/// How many examples a report shows.
const EXAMPLES: usize = 5;

/// One piece of a path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    /// A field: one or more characters, never a '/'.
    Field(String),
}

/// `{Name}` fields between literal text, matched against a whole relative path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    pieces: Vec<Piece>,
}

impl PathPattern {
    pub fn parse(text: &str) -> Result<Self, MetadataError> {
        let err = |what: &str| MetadataError::Pattern {
            pattern: text.to_string(),
            what: what.to_string(),
        };
        let mut pieces = vec![];
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest.find('}').ok_or_else(|| err("a '{' is never closed"))?;
                    let name = &rest[1..end];
                    if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                        return Err(err(&format!(
                            "field {{{name}}}: a field name is letters, digits and '_'"
                        )));
                    }
                    if matches!(pieces.last(), Some(Piece::Field(_))) {
                        return Err(err("two fields must be separated by literal text"));
                    }
                    pieces.push(Piece::Field(name.to_string()));
                    rest = &rest[end + 1..];
                }
                Some(i) => {
                    pieces.push(Piece::Literal(rest[..i].to_string()));
                    rest = &rest[i..];
                }
                None => {
                    pieces.push(Piece::Literal(rest.to_string()));
                    rest = "";
                }
            }
            if let Some(Piece::Literal(l)) = pieces.last() {
                if l.contains('}') {
                    return Err(err("a '}' without its '{'"));
                }
            }
        }
        let columns: Vec<String> = Self::names(&pieces).map(column_name).collect();
        if let Some(dup) = columns
            .iter()
            .enumerate()
            .find(|(i, c)| columns[..*i].contains(c))
        {
            return Err(err(&format!("field {} appears twice", dup.1)));
        }
        if columns.is_empty() {
            return Err(err("no {Field} in it"));
        }
        Ok(Self {
            text: text.to_string(),
            pieces,
        })
    }

    fn names(pieces: &[Piece]) -> impl Iterator<Item = &str> {
        pieces.iter().filter_map(|p| match p {
            Piece::Field(n) => Some(n.as_str()),
            Piece::Literal(_) => None,
        })
    }

    /// The columns the fields become (`{Plate}` → `Metadata_Plate`), in pattern order.
    pub fn columns(&self) -> Vec<String> {
        Self::names(&self.pieces).map(column_name).collect()
    }

    /// The field values of `path` in pattern order, or `None` when it does not match. Fields
    /// take the shortest text that lets the rest match (`{Site}_{Cell}` on `s1_c2_x` gives
    /// `s1` and `c2_x`).
    pub fn parse_path(&self, path: &str) -> Option<Vec<String>> {
        let mut out = vec![];
        match_from(&self.pieces, path, &mut out).then_some(out)
    }
}

fn match_from(pieces: &[Piece], s: &str, out: &mut Vec<String>) -> bool {
    match pieces.first() {
        None => s.is_empty(),
        Some(Piece::Literal(l)) => s
            .strip_prefix(l.as_str())
            .is_some_and(|rest| match_from(&pieces[1..], rest, out)),
        Some(Piece::Field(_)) => {
            let limit = s.find('/').unwrap_or(s.len());
            for end in s[..limit].char_indices().map(|(i, c)| i + c.len_utf8()) {
                out.push(s[..end].to_string());
                if match_from(&pieces[1..], &s[end..], out) {
                    return true;
                }
                out.pop();
            }
            false
        }
    }
}

/// `Metadata_{name}`, or `name` when it already starts so.
fn column_name(name: &str) -> String {
    if name.starts_with("Metadata_") {
        name.to_string()
    } else {
        format!("Metadata_{name}")
    }
}

/// A metadata CSV indexed by its `path` column.
pub struct MetadataCsv {
    pub path: PathBuf,
    /// Every other column, as `Metadata_*` names.
    pub columns: Vec<String>,
    /// Those columns as the CSV's header names them.
    header: Vec<String>,
    /// SHA-256 of the file's bytes: a rerun with other metadata is told apart by it.
    pub sha256: String,
    rows: HashMap<String, Vec<String>>,
}

impl MetadataCsv {
    pub fn read(path: &Path) -> Result<Self, MetadataError> {
        let csv = Csv::read(path)?;
        let key = csv.column("path")?;
        let header: Vec<String> = csv
            .header
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != key)
            .map(|(_, h)| h.clone())
            .collect();
        let columns = header.iter().map(|h| column_name(h)).collect();
        let sha256 = csv.sha256.clone();
        let mut rows = HashMap::with_capacity(csv.rows.len());
        let mut dups = vec![];
        for (_, mut fields) in csv.rows {
            let k = normalise_rel(&fields.remove(key));
            match rows.entry(k) {
                std::collections::hash_map::Entry::Occupied(e) => dups.push(e.key().clone()),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(fields);
                }
            }
        }
        if !dups.is_empty() {
            dups.sort();
            dups.dedup();
            return Err(MetadataError::DuplicateKeys {
                path: path.to_path_buf(),
                count: dups.len(),
                examples: dups.into_iter().take(EXAMPLES).collect(),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            columns,
            header,
            sha256,
            rows,
        })
    }
}

/// What the metadata columns were made from (recorded in the job manifest).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MetadataFingerprint {
    pub path_pattern: Option<String>,
    pub csv_sha256: Option<String>,
}

/// What did not line up, counted with the first examples (sorted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mismatch {
    pub count: usize,
    pub examples: Vec<String>,
}

impl Mismatch {
    fn add(&mut self, what: &str) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(what.to_string());
        }
    }

    fn line(&self, what: &str) -> Option<String> {
        (self.count > 0)
            .then(|| format!("{} {what} (e.g. {})", self.count, self.examples.join(", ")))
    }
}

/// The metadata report of one job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Images whose path the pattern does not match.
    pub unmatched_paths: Mismatch,
    /// Images without a row in the metadata CSV.
    pub images_without_row: Mismatch,
    /// CSV rows naming no image of the job.
    pub rows_without_image: Mismatch,
}

impl Report {
    /// One line per kind of mismatch, for the log and the end-of-job summary.
    pub fn lines(&self, pattern: Option<&str>, csv: Option<&Path>) -> Vec<String> {
        let csv = csv.map(|p| p.display().to_string()).unwrap_or_default();
        [
            self.unmatched_paths.line(&format!(
                "image paths do not match --path-pattern {:?} (their pattern columns are null)",
                pattern.unwrap_or_default()
            )),
            self.images_without_row.line(&format!(
                "images have no row in {csv} (its columns are null for them)"
            )),
            self.rows_without_image
                .line(&format!("rows of {csv} name no image of this job")),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The metadata of every image, from the pattern and/or the CSV, and for a screen's cells
/// their site's `Metadata_*` columns, object number and centre.
pub struct Metadata {
    pub pattern: Option<PathPattern>,
    pub csv: Option<MetadataCsv>,
    pub screen: Option<ScreenMetadata>,
}

/// The metadata of a screen's cells, asked by the cell's index in the screen.
pub struct ScreenMetadata {
    source: std::sync::Arc<crate::data::screen::cell_source::ScreenSource>,
    columns: Vec<String>,
}

impl ScreenMetadata {
    pub fn new(source: std::sync::Arc<crate::data::screen::cell_source::ScreenSource>) -> Self {
        // Every site of a layout has the same columns (a table's header, a plate's keys).
        let columns = if source.cells().is_empty() {
            vec![]
        } else {
            source.metadata(0).into_iter().map(|(k, _)| k).collect()
        };
        Self { source, columns }
    }
}

impl Metadata {
    /// The column names, pattern fields first. A name given twice (by the pattern and the
    /// CSV, by two CSV columns such as `Treatment` and `Metadata_Treatment`) or one the
    /// table writes itself (`Metadata_ImagePath`, `_Checkpoint`, `_Epoch`, `_Channels`) is
    /// an error naming both sources.
    pub fn columns(&self) -> Result<Vec<String>, MetadataError> {
        let mut named: Vec<(String, String)> = WRITTEN
            .iter()
            .map(|c| (c.to_string(), "the embedding table itself".to_string()))
            .collect();
        let mut add = |column: String, source: String| {
            if let Some((_, first)) = named.iter().find(|(c, _)| *c == column) {
                return Err(MetadataError::Clash {
                    column,
                    first: first.clone(),
                    second: source,
                });
            }
            named.push((column, source));
            Ok(())
        };
        if let Some(p) = &self.pattern {
            for (field, column) in PathPattern::names(&p.pieces).zip(p.columns()) {
                add(column, format!("--path-pattern field {{{field}}}"))?;
            }
        }
        if let Some(csv) = &self.csv {
            for (header, column) in csv.header.iter().zip(&csv.columns) {
                add(
                    column.clone(),
                    format!("column {header:?} of {}", csv.path.display()),
                )?;
            }
        }
        if let Some(screen) = &self.screen {
            for column in &screen.columns {
                add(
                    column.clone(),
                    format!("the screen {}", screen.source.root().display()),
                )?;
            }
        }
        Ok(named
            .split_off(WRITTEN.len())
            .into_iter()
            .map(|(c, _)| c)
            .collect())
    }

    /// What the metadata is made of, for the job manifest: the pattern's text and the CSV's
    /// SHA-256 (a rerun with other metadata re-joins it instead of keeping stale values).
    pub fn fingerprint(&self) -> MetadataFingerprint {
        MetadataFingerprint {
            path_pattern: self.pattern.as_ref().map(|p| p.text.clone()),
            csv_sha256: self.csv.as_ref().map(|c| c.sha256.clone()),
        }
    }

    /// The values of the columns for the image at `rel`, `cell` of the screen where the
    /// images are a screen's cells (empty where unknown).
    pub fn values(&self, rel: &str, cell: Option<usize>) -> Vec<String> {
        let mut out = vec![];
        if let Some(p) = &self.pattern {
            let n = p.columns().len();
            out.extend(p.parse_path(rel).unwrap_or_else(|| vec![String::new(); n]));
        }
        if let Some(csv) = &self.csv {
            match csv.rows.get(rel) {
                Some(v) => out.extend(v.iter().cloned()),
                None => out.extend(std::iter::repeat_n(String::new(), csv.columns.len())),
            }
        }
        if let Some(screen) = &self.screen {
            match cell {
                Some(i) => out.extend(screen.source.metadata(i).into_iter().map(|(_, v)| v)),
                None => out.extend(std::iter::repeat_n(String::new(), screen.columns.len())),
            }
        }
        out
    }

    /// What does not line up between the images `rels` (sorted) and the metadata.
    pub fn report<S: AsRef<str>>(&self, rels: impl Iterator<Item = S>) -> Report {
        let mut r = Report::default();
        let mut seen = std::collections::HashSet::new();
        if self.pattern.is_none() && self.csv.is_none() {
            return r;
        }
        for rel in rels {
            let rel = rel.as_ref();
            if let Some(p) = &self.pattern {
                if p.parse_path(rel).is_none() {
                    r.unmatched_paths.add(rel);
                }
            }
            if let Some(csv) = &self.csv {
                if csv.rows.contains_key(rel) {
                    seen.insert(rel.to_string());
                } else {
                    r.images_without_row.add(rel);
                }
            }
        }
        if let Some(csv) = &self.csv {
            let mut orphans: Vec<&String> =
                csv.rows.keys().filter(|k| !seen.contains(*k)).collect();
            orphans.sort();
            for k in orphans {
                r.rows_without_image.add(k);
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_paths_and_refuse_what_cannot_work() {
        let p = PathPattern::parse("{Plate}/{Well}/{Site}_{Cell}.tiff").unwrap();
        assert_eq!(
            p.columns(),
            [
                "Metadata_Plate",
                "Metadata_Well",
                "Metadata_Site",
                "Metadata_Cell"
            ]
        );
        assert_eq!(
            p.parse_path("P1/A01/s1_c2_x.tiff").unwrap(),
            ["P1", "A01", "s1", "c2_x"]
        );
        assert_eq!(p.parse_path("P1/A01/x/s1_c2.tiff"), None);
        assert_eq!(p.parse_path("P1/A01/s1c2.tiff"), None);
        assert_eq!(p.parse_path("P1/A01/s1_c2.tif"), None);
        for (bad, why) in [
            ("{Plate", "a '{' is never closed"),
            (
                "{A}{B}.tiff",
                "two fields must be separated by literal text",
            ),
            ("{A}/{A}.tiff", "field Metadata_A appears twice"),
            ("x.tiff", "no {Field} in it"),
            (
                "{a b}.tiff",
                "field {a b}: a field name is letters, digits and '_'",
            ),
            ("a}/{B}", "a '}' without its '{'"),
        ] {
            let e = PathPattern::parse(bad).unwrap_err().to_string();
            assert_eq!(e, format!("--path-pattern {bad:?}: {why}"));
        }
    }
}
