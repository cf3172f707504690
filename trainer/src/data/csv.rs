//! The CSV files the trainer reads (`trainer embed`'s `--list` and `--metadata`, a screen's
//! LoadData and object tables): RFC 4180 (a header row,
//! comma-separated fields, `"…"` quoting with `""` for a quote, LF or CRLF line ends). Small
//! enough to carry here rather than a dependency; every error names the file and line.
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CsvError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: {what}", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        what: String,
    },
    #[error("{}: no `{column}` column (the header is: {header})", path.display())]
    NoColumn {
        path: PathBuf,
        column: String,
        header: String,
    },
}

/// A CSV file read whole: its header and rows, each row with its 1-based line number.
pub struct Csv {
    pub path: PathBuf,
    pub header: Vec<String>,
    pub rows: Vec<(usize, Vec<String>)>,
    /// SHA-256 of the text read.
    pub sha256: String,
}

impl Csv {
    pub fn read(path: &Path) -> Result<Self, CsvError> {
        let text = std::fs::read_to_string(path).map_err(|source| CsvError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, CsvError> {
        let mut header = vec![];
        let mut rows = vec![];
        scan(
            text.as_bytes(),
            path,
            |h| {
                header = h.to_vec();
                Ok::<_, CsvError>(())
            },
            |line, fields| {
                rows.push((line, fields.to_vec()));
                Ok(())
            },
        )?;
        Ok(Self {
            path: path.to_path_buf(),
            header,
            rows,
            sha256: {
                use sha2::Digest;
                format!("{:x}", sha2::Sha256::digest(text.as_bytes()))
            },
        })
    }

    /// The index of column `name`, or an error naming the header.
    pub fn column(&self, name: &str) -> Result<usize, CsvError> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| CsvError::NoColumn {
                path: self.path.clone(),
                column: name.to_string(),
                header: self.header.join(","),
            })
    }
}

/// Reads the rows of a CSV as [`Csv::parse`] does (the header's byte-order mark and spaces
/// trimmed, blank lines skipped, a row with another field count an error naming its line), one
/// row at a time: a table of millions of rows (a screen's object table) is never held whole.
/// `header` sees the header, then `row` each row with the line it starts on; the field
/// buffers are reused from row to row.
pub fn scan<E: From<CsvError>>(
    input: impl std::io::BufRead,
    path: &Path,
    header: impl FnOnce(&[String]) -> Result<(), E>,
    mut row: impl FnMut(usize, &[String]) -> Result<(), E>,
) -> Result<(), E> {
    let syntax = |line: usize, what: String| CsvError::Syntax {
        path: path.to_path_buf(),
        line,
        what,
    };
    let failed = |failure| match failure {
        Failure::Syntax(line, what) => syntax(line, what),
        Failure::Io(source) => CsvError::Io {
            path: path.to_path_buf(),
            source,
        },
    };
    let mut records = Records::new(input);
    let mut fields = vec![];
    if records.next_into(&mut fields).map_err(failed)?.is_none() {
        return Err(syntax(1, "empty file: a header row is needed".into()).into());
    }
    for h in &mut fields {
        *h = h.trim_start_matches('\u{feff}').trim().to_string();
    }
    let width = fields.len();
    header(&fields)?;
    while let Some(line) = records.next_into(&mut fields).map_err(failed)? {
        if fields.len() == 1 && fields[0].is_empty() {
            continue; // a blank line
        }
        if fields.len() != width {
            return Err(syntax(
                line,
                format!("{} fields but the header has {width}", fields.len()),
            )
            .into());
        }
        row(line, &fields)?;
    }
    Ok(())
}

enum Failure {
    Syntax(usize, String),
    Io(std::io::Error),
}

/// The records of a text read line by line; a quoted field may span lines.
struct Records<R> {
    input: R,
    buf: String,
    /// The line the next text read starts on.
    line: usize,
}

impl<R: std::io::BufRead> Records<R> {
    fn new(input: R) -> Self {
        Self {
            input,
            buf: String::new(),
            line: 1,
        }
    }

    /// The next record into `fields` (its strings reused), with the line it starts on;
    /// `None` at the end of the text. An unterminated quote is an error naming the line it
    /// opened on.
    fn next_into(&mut self, fields: &mut Vec<String>) -> Result<Option<usize>, Failure> {
        let start = self.line;
        let mut n = 0; // fields finished
        let (mut quoted, mut quote_line) = (false, start);
        let field = |fields: &mut Vec<String>, n: usize| {
            if fields.len() == n {
                fields.push(String::new());
            }
            fields[n].clear();
        };
        field(fields, 0);
        loop {
            self.buf.clear();
            if self.input.read_line(&mut self.buf).map_err(Failure::Io)? == 0 {
                if quoted {
                    return Err(Failure::Syntax(
                        quote_line,
                        "a quoted field is never closed".into(),
                    ));
                }
                if n == 0 && fields[0].is_empty() {
                    return Ok(None);
                }
                fields.truncate(n + 1);
                return Ok(Some(start));
            }
            let mut chars = self.buf.chars().peekable();
            while let Some(c) = chars.next() {
                match (quoted, c) {
                    (true, '"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        fields[n].push('"');
                    }
                    (true, '"') => quoted = false,
                    (true, c) => {
                        if c == '\n' {
                            self.line += 1;
                        }
                        fields[n].push(c);
                    }
                    (false, '"') if fields[n].is_empty() => {
                        quoted = true;
                        quote_line = self.line;
                    }
                    (false, ',') => {
                        n += 1;
                        field(fields, n);
                    }
                    (false, '\r') if chars.peek() == Some(&'\n') => {}
                    (false, '\n') => {
                        self.line += 1;
                        fields.truncate(n + 1);
                        return Ok(Some(start));
                    }
                    (false, c) => fields[n].push(c),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_line_ends_and_errors() {
        let csv = Csv::parse(
            "path,Metadata_Note\r\na.tiff,\"x, \"\"y\"\"\"\n\nb.tiff,\"two\nlines\"\nc.tiff,\n",
            Path::new("m.csv"),
        )
        .unwrap();
        assert_eq!(csv.header, ["path", "Metadata_Note"]);
        let rows: Vec<_> = csv.rows.iter().map(|(l, f)| (*l, f.clone())).collect();
        assert_eq!(
            rows,
            [
                (2, vec!["a.tiff".to_string(), "x, \"y\"".into()]),
                (4, vec!["b.tiff".into(), "two\nlines".into()]),
                (6, vec!["c.tiff".into(), String::new()]),
            ]
        );
        let err = |text: &str| {
            Csv::parse(text, Path::new("m.csv"))
                .err()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            err("path,x\na,b,c\n"),
            "m.csv:2: 3 fields but the header has 2"
        );
        assert_eq!(
            err("path\n\"open\n"),
            "m.csv:2: a quoted field is never closed"
        );
        assert_eq!(
            csv.column("Plate").unwrap_err().to_string(),
            "m.csv: no `Plate` column (the header is: path,Metadata_Note)"
        );
    }
}
