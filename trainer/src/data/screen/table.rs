//! A screen's tables (a LoadData table, an object table) as records, whether CellProfiler
//! wrote them as CSV (optionally `.gz`, as the Cell Painting Gallery stores `load_data.csv.gz`)
//! or pandas/polars/pyarrow as Parquet: the layouts read one record type and never ask which.
use std::path::Path;

use parquet::file::reader::SerializedFileReader;

use super::files::Files;
use super::ScreenError;
use crate::data::csv::Csv;

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
