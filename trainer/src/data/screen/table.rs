//! A screen's tables (a LoadData table, an object table) as records, whether CellProfiler
//! wrote them as CSV (optionally `.gz`, as the Cell Painting Gallery stores `load_data.csv.gz`)
//! or pandas/polars/pyarrow as Parquet: the layouts read one record type and never ask which.
use std::path::Path;

use parquet::file::reader::{ChunkReader, FileReader, SerializedFileReader};

use super::files::Files;
use super::ScreenError;
use crate::data::csv::Csv;
use crate::parquet_columns::{refuse_nested, LeafCursor};

/// Reads the table at `address` (a path or store URL): Parquet when the name ends in
/// `.parquet` or `.pq`, CSV otherwise. A Parquet table's values are text as
/// [`crate::parquet_columns::read_text_columns`] gives them, nulls empty (as a CSV writes
/// them), and its rows are numbered as a CSV's would be (row `r` on line `r + 1`).
pub fn read_table(files: &Files, address: &str) -> Result<Csv, ScreenError> {
    let lower = address.to_ascii_lowercase();
    if !(lower.ends_with(".parquet") || lower.ends_with(".pq")) {
        let text = files.read_text(address)?;
        return Csv::parse(&text, Path::new(address))
            .map_err(|e| ScreenError::table(address, e.to_string()));
    }
    let bytes = files.read(address)?;
    let sha256 = {
        use sha2::Digest;
        format!("{:x}", sha2::Sha256::digest(&bytes))
    };
    let parquet = |e: parquet::errors::ParquetError| {
        ScreenError::table(address, format!("not a readable Parquet table: {e}"))
    };
    let reader = SerializedFileReader::new(bytes::Bytes::from(bytes)).map_err(parquet)?;
    let columns = crate::parquet_columns::read_text_columns(&reader).map_err(parquet)?;
    let n = columns.first().map_or(0, |(_, v)| v.len());
    let header = columns.iter().map(|(name, _)| name.clone()).collect();
    let rows = (0..n)
        .map(|r| {
            let fields = columns
                .iter()
                .map(|(_, v)| v[r].clone().unwrap_or_default())
                .collect();
            (r + 2, fields)
        })
        .collect();
    Ok(Csv {
        path: address.into(),
        header,
        rows,
        sha256,
    })
}

/// Streams the table at `address` (CSV or Parquet, as [`read_table`] tells them apart) row by
/// row, holding only the columns `select` picks from the header: an object table of a plate
/// can have millions of rows and thousands of feature columns, of which a screen needs four.
/// `select` returns the positions wanted; `row` then sees each row's number (from 1, as
/// [`ScreenError::Row`] counts them) and its values of those columns in that order, nulls
/// empty. A CSV is parsed as it is read; a Parquet table is read 65,536 rows of the selected
/// columns at a time. Neither is ever held whole, on disk or in a store.
pub fn scan_table(
    files: &Files,
    address: &str,
    select: impl FnOnce(&[String]) -> Result<Vec<usize>, ScreenError>,
    mut row: impl FnMut(usize, &[&str]) -> Result<(), ScreenError>,
) -> Result<(), ScreenError> {
    let lower = address.to_ascii_lowercase();
    if !(lower.ends_with(".parquet") || lower.ends_with(".pq")) {
        let input = files.open_text(address)?;
        let picked = std::cell::OnceCell::new();
        let mut number = 0;
        return crate::data::csv::scan(
            input,
            Path::new(address),
            |header| {
                let _ = picked.set(select(header)?);
                Ok(())
            },
            |_, fields| {
                number += 1;
                let values: Vec<&str> = picked
                    .get()
                    .map_or(&[][..], Vec::as_slice)
                    .iter()
                    .map(|&i| fields[i].as_str())
                    .collect();
                row(number, &values)
            },
        );
    }
    let parquet = |e: parquet::errors::ParquetError| {
        ScreenError::table(address, format!("not a readable Parquet table: {e}"))
    };
    // Read where the chunks are, never whole: a local file by seeking, a store object by
    // ranges.
    if super::files::is_url(address) {
        let object = files.open_object(address)?;
        let reader = SerializedFileReader::new(object.clone()).map_err(parquet)?;
        let header = column_names(&reader);
        let picked = select(&header)?;
        let chunks = (0..reader.metadata().num_row_groups())
            .flat_map(|g| {
                let group = reader.metadata().row_group(g);
                picked.iter().map(move |&i| {
                    let (start, len) = group.column(i).byte_range();
                    start..start + len
                })
            })
            .collect();
        object.expect_chunks(chunks, picked.len());
        scan_parquet(&reader, address, |_| Ok(picked), row)
    } else {
        let file = std::fs::File::open(address)
            .map_err(|e| ScreenError::from(crate::data::DataError::io(address, "reading", e)))?;
        let reader = SerializedFileReader::new(file).map_err(parquet)?;
        scan_parquet(&reader, address, select, row)
    }
}

/// The leaf column names of a Parquet table, in its order.
fn column_names<R: ChunkReader + 'static>(reader: &SerializedFileReader<R>) -> Vec<String> {
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    schema
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect()
}

/// [`scan_table`] of a Parquet table: 65,536 rows of the selected columns at a time, their
/// column readers side by side.
fn scan_parquet<R: ChunkReader + 'static>(
    reader: &SerializedFileReader<R>,
    address: &str,
    select: impl FnOnce(&[String]) -> Result<Vec<usize>, ScreenError>,
    mut row: impl FnMut(usize, &[&str]) -> Result<(), ScreenError>,
) -> Result<(), ScreenError> {
    let parquet = |e: parquet::errors::ParquetError| {
        ScreenError::table(address, format!("not a readable Parquet table: {e}"))
    };
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let header = column_names(reader);
    let picked = select(&header)?;
    let mut number = 0;
    // Rows held at a time, of the selected columns only.
    const CHUNK_ROWS: usize = 65_536;
    for g in 0..reader.metadata().num_row_groups() {
        let mut cursors = Vec::with_capacity(picked.len());
        for &i in &picked {
            let col = schema.column(i);
            refuse_nested(&col).map_err(parquet)?;
            cursors.push(LeafCursor::new(reader, g, i, &col).map_err(parquet)?);
        }
        let mut left = reader.metadata().row_group(g).num_rows().max(0) as usize;
        while left > 0 {
            let want = CHUNK_ROWS.min(left);
            let mut columns = Vec::with_capacity(cursors.len());
            for (cursor, &i) in cursors.iter_mut().zip(&picked) {
                let values = cursor
                    .next(want)
                    .map_err(parquet)?
                    .map_or_else(Vec::new, |leaf| leaf.into_text());
                if values.len() != want {
                    return Err(ScreenError::table(
                        address,
                        format!(
                            "column `{}` ends {} rows short of row group {g} (damaged file?)",
                            header[i],
                            left - values.len()
                        ),
                    ));
                }
                columns.push(values);
            }
            for r in 0..want {
                number += 1;
                let values: Vec<&str> = columns
                    .iter()
                    .map(|c| c[r].as_deref().unwrap_or(""))
                    .collect();
                row(number, &values)?;
            }
            left -= want;
        }
    }
    Ok(())
}

/// A whole number as a table holds it: `7`, or `7.0` where a writer stored the column as
/// floats (pandas does once a column has a null).
pub fn whole_number(text: &str) -> Option<u64> {
    let t = text.trim();
    t.parse().ok().or_else(|| {
        let x: f64 = t.parse().ok()?;
        (x.is_finite() && x >= 0.0 && x.fract() == 0.0 && x < 9.007_199_254_740_992e15)
            .then_some(x as u64)
    })
}

/// A key value as two tables can both hold it: a plate name stays as it is; a site or an
/// image number stored as `3` by one writer and `3.0` by another reads as the same key.
pub fn key_text(text: &str) -> std::borrow::Cow<'_, str> {
    let t = text.trim();
    let padded = t.len() > 1 && t.starts_with('0') && t.as_bytes()[1].is_ascii_digit();
    match whole_number(t) {
        Some(n) if !padded => n.to_string().into(),
        _ => text.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_alike_from_any_writer() {
        assert_eq!(whole_number("7"), Some(7));
        assert_eq!(whole_number(" 7.0 "), Some(7));
        assert_eq!(whole_number("7.5"), None);
        assert_eq!(whole_number("-1"), None);
        assert_eq!(whole_number("NaN"), None);
        assert_eq!(key_text("3.0"), "3");
        assert_eq!(key_text("3"), "3");
        assert_eq!(key_text("BR00117035"), "BR00117035");
        // A zero-padded name is a name, not a number.
        assert_eq!(key_text("01"), "01");
        assert_eq!(key_text("0.0"), "0");
    }
}
