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
        let syntax = |line: usize, what: String| CsvError::Syntax {
            path: path.to_path_buf(),
            line,
            what,
        };
        let records = records(text).map_err(|(line, what)| syntax(line, what))?;
        let mut it = records.into_iter();
        let (_, header) = it
            .next()
            .ok_or_else(|| syntax(1, "empty file: a header row is needed".into()))?;
        let header: Vec<String> = header
            .into_iter()
            .map(|h| h.trim_start_matches('\u{feff}').trim().to_string())
            .collect();
        let mut rows = vec![];
        for (line, fields) in it {
            if fields.len() == 1 && fields[0].is_empty() {
                continue; // a blank line
            }
            if fields.len() != header.len() {
                return Err(syntax(
                    line,
                    format!(
                        "{} fields but the header has {}",
                        fields.len(),
                        header.len()
                    ),
                ));
            }
            rows.push((line, fields));
        }
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

/// Records with the line each starts on.
type Records = Vec<(usize, Vec<String>)>;

/// The records of `text` with the line each starts on; an unterminated quote is an error
/// naming the line it opened on.
fn records(text: &str) -> Result<Records, (usize, String)> {
    let mut out = vec![];
    let (mut fields, mut field) = (vec![], String::new());
    let (mut line, mut start, mut quoted, mut quote_line) = (1, 1, false, 1);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => {
                if c == '\n' {
                    line += 1;
                }
                field.push(c);
            }
            (false, '"') if field.is_empty() => {
                quoted = true;
                quote_line = line;
            }
            (false, ',') => fields.push(std::mem::take(&mut field)),
            (false, '\r') if chars.peek() == Some(&'\n') => {}
            (false, '\n') => {
                fields.push(std::mem::take(&mut field));
                out.push((start, std::mem::take(&mut fields)));
                line += 1;
                start = line;
            }
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err((quote_line, "a quoted field is never closed".into()));
    }
    if !field.is_empty() || !fields.is_empty() {
        fields.push(field);
        out.push((start, fields));
    }
    Ok(out)
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
