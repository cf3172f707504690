//! Every flat column of a Parquet file as pandas, polars and pyarrow write them: floats as
//! numbers, everything else as text with its nulls kept. Tables come from anyone's code (a
//! profile table for scoring, a screen's LoadData or object table), and a column nobody asks
//! for must not make the file unreadable, so every physical and logical type they write has a
//! reading here: strings (also dictionary-encoded: pandas categoricals, polars
//! `Categorical`/`Enum`), booleans (`true`/`false`), signed and unsigned integers, floats
//! (shortest round-trip text; NaN is null, as in pandas), decimals, dates, times and
//! timestamps (ISO 8601, `Z` when stored as UTC), UUIDs and pyarrow's all-null columns.
use parquet::basic::{ConvertedType, LogicalType, TimeUnit, Type as PhysicalType};
use parquet::column::reader::ColumnReader;
use parquet::data_type::{ByteArray, FixedLenByteArray, Int96};
use parquet::file::reader::{ChunkReader, FileReader, SerializedFileReader};
use parquet::schema::types::ColumnDescriptor;

/// One flat column's values (all of them, or one chunk of a row group).
pub enum Leaf {
    /// float32 (features stay float32 bit for bit); nulls NaN.
    Floats32(Vec<f32>),
    /// double and half floats; nulls NaN.
    Numbers(Vec<f64>),
    /// Anything else, as text; nulls `None`.
    Text(Vec<Option<String>>),
}

impl Leaf {
    pub fn len(&self) -> usize {
        match self {
            Leaf::Floats32(v) => v.len(),
            Leaf::Numbers(v) => v.len(),
            Leaf::Text(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `more` (a later chunk of the same column, so the same variant).
    fn extend(&mut self, more: Leaf) {
        match (self, more) {
            (Leaf::Floats32(a), Leaf::Floats32(b)) => a.extend(b),
            (Leaf::Numbers(a), Leaf::Numbers(b)) => a.extend(b),
            (Leaf::Text(a), Leaf::Text(b)) => a.extend(b),
            _ => unreachable!("chunks of one column have one variant"),
        }
    }

    /// Values of a numeric column as text (the form [`read_table`] gives metadata: shortest
    /// round-trip floats, NaN as null).
    pub fn into_text(self) -> Vec<Option<String>> {
        match self {
            Leaf::Floats32(v) => v
                .into_iter()
                .map(|x| (!x.is_nan()).then(|| format!("{x:?}")))
                .collect(),
            Leaf::Numbers(v) => v
                .into_iter()
                .map(|x| (!x.is_nan()).then(|| format!("{x:?}")))
                .collect(),
            Leaf::Text(v) => v,
        }
    }
}

/// Every flat column of a file as text, in table order: a table that is read as records
/// (a screen's LoadData or object table) whatever types its writer chose. Floats are their
/// shortest round-trip text, so a number reads back as the same number; NaN and nulls are
/// `None`. A nested column is refused naming it, as is a column of another length.
pub fn read_text_columns<R: ChunkReader + 'static>(
    reader: &SerializedFileReader<R>,
) -> parquet::errors::Result<Vec<(String, Vec<Option<String>>)>> {
    let rows = reader.metadata().file_metadata().num_rows().max(0) as usize;
    let schema = reader.metadata().file_metadata().schema_descr();
    let mut out = Vec::with_capacity(schema.num_columns());
    for (i, col) in schema.columns().iter().enumerate() {
        refuse_nested(col)?;
        let values = read_leaf(reader, i, col)?;
        if values.len() != rows {
            return Err(parquet::errors::ParquetError::General(format!(
                "column `{}` has {} values but the table has {rows} rows (damaged file?)",
                col.name(),
                values.len()
            )));
        }
        out.push((col.name().to_string(), values.into_text()));
    }
    Ok(out)
}

/// `read(reader, i)` for each column index of `columns`, on up to one thread per core, results
/// in `columns`' order: the columns of a table are independent, and a profile table is
/// hundreds of them (with the block-wise checksum and the tiled reshape, a table of
/// 90,851 × 384 floats reads 1.7-1.9x faster on two cores, BENCHMARKS.md). Each thread opens
/// the file itself (`open`), since parquet's `File` reader
/// seeks one file offset shared by its clones. Fewer than 16 columns a thread are read on
/// this one.
pub fn each_column_on_threads<R, T, E>(
    reader: &SerializedFileReader<R>,
    columns: &[usize],
    open: impl Fn() -> Result<SerializedFileReader<R>, E> + Sync,
    read: impl Fn(&SerializedFileReader<R>, usize) -> T + Sync,
) -> Result<Vec<T>, E>
where
    R: ChunkReader + 'static,
    T: Send,
    E: Send,
{
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(columns.len() / 16).max(1);
    if threads == 1 {
        return Ok(columns.iter().map(|&i| read(reader, i)).collect());
    }
    // Thread t reads the columns at t, t + threads, ...: feature columns are alike in size,
    // so strides share the work evenly whatever the metadata columns cost.
    let per_thread: Vec<Result<Vec<T>, E>> = std::thread::scope(|scope| {
        let (open, read) = (&open, &read);
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let own = open()?;
                    Ok(columns
                        .iter()
                        .skip(t)
                        .step_by(threads)
                        .map(|&i| read(&own, i))
                        .collect())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut strided = per_thread
        .into_iter()
        .map(|r| r.map(Vec::into_iter))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((0..columns.len())
        .filter_map(|k| strided[k % threads].next())
        .collect())
}

/// Refuses a nested column (a list, struct or map), naming it: the tables read as records are
/// flat.
pub fn refuse_nested(col: &ColumnDescriptor) -> parquet::errors::Result<()> {
    if col.max_rep_level() > 0 || col.path().parts().len() > 1 {
        return Err(parquet::errors::ParquetError::General(format!(
            "column `{}` is nested (a list, struct or map); flatten it to plain columns",
            col.path()
        )));
    }
    Ok(())
}

/// What pandas' `astype(float)` makes of a column: a number per row or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numeric {
    /// float, double, half float: read as numbers, nulls NaN.
    Float,
    /// Plain integers, read as text and parsed (nulls NaN).
    Integer,
    /// Booleans (`true` = 1).
    Bool,
    /// Text, dates, decimals, ...: not a number.
    No,
}

/// How `col`'s values become numbers (see [`Numeric`]).
pub fn numeric(col: &ColumnDescriptor) -> Numeric {
    match Kind::of(
        col.physical_type(),
        col.logical_type_ref(),
        col.converted_type(),
        col,
    ) {
        Kind::Float32 | Kind::Float64 | Kind::Float16 => Numeric::Float,
        Kind::Signed | Kind::Unsigned(_) => Numeric::Integer,
        Kind::Bool => Numeric::Bool,
        _ => Numeric::No,
    }
}

/// Values at their rows: `defs` are the definition levels (empty for a required column),
/// `max_def` the level of a present value.
fn spread<T, U>(defs: &[i16], max_def: i16, values: Vec<T>, f: impl Fn(T) -> U, null: U) -> Vec<U>
where
    U: Clone,
{
    if max_def == 0 {
        return values.into_iter().map(f).collect();
    }
    let mut it = values.into_iter();
    defs.iter()
        .map(|&d| {
            if d == max_def {
                it.next().map(&f).unwrap_or_else(|| null.clone())
            } else {
                null.clone()
            }
        })
        .collect()
}

/// Reads all of leaf column `i` over the row groups.
pub fn read_leaf<R: ChunkReader + 'static>(
    reader: &SerializedFileReader<R>,
    i: usize,
    col: &ColumnDescriptor,
) -> parquet::errors::Result<Leaf> {
    let mut out: Option<Leaf> = None;
    for g in 0..reader.metadata().num_row_groups() {
        let n = reader.metadata().row_group(g).num_rows().max(0) as usize;
        read_leaf_chunks(reader, g, i, col, n.max(1), |chunk| {
            match &mut out {
                Some(o) => o.extend(chunk),
                None => out = Some(chunk),
            }
            Ok(())
        })?;
    }
    Ok(out.unwrap_or_else(|| match numeric(col) {
        Numeric::Float if col.physical_type() == PhysicalType::FLOAT => Leaf::Floats32(vec![]),
        Numeric::Float => Leaf::Numbers(vec![]),
        _ => Leaf::Text(vec![]),
    }))
}

/// Reads leaf column `i` of row group `g` in chunks of at most `chunk` rows, in row order,
/// handing each to `f`: a caller streaming a table holds one chunk of one column at a time,
/// whatever size the writer gave its row groups (pyarrow writes up to a million rows in one).
pub fn read_leaf_chunks<R: ChunkReader + 'static>(
    reader: &SerializedFileReader<R>,
    g: usize,
    i: usize,
    col: &ColumnDescriptor,
    chunk: usize,
    mut f: impl FnMut(Leaf) -> parquet::errors::Result<()>,
) -> parquet::errors::Result<()> {
    let mut cursor = LeafCursor::new(reader, g, i, col)?;
    while let Some(leaf) = cursor.next(chunk)? {
        f(leaf)?;
    }
    Ok(())
}

/// One leaf column of one row group, read a chunk of rows at a time: several cursors read
/// a table's columns side by side, row-aligned, holding one chunk of each.
pub struct LeafCursor {
    reader: ColumnReader,
    kind: Kind,
    max_def: i16,
    /// Rows of the row group not read yet.
    left: usize,
    defs: Vec<i16>,
}

impl LeafCursor {
    pub fn new<R: ChunkReader + 'static>(
        reader: &SerializedFileReader<R>,
        g: usize,
        i: usize,
        col: &ColumnDescriptor,
    ) -> parquet::errors::Result<Self> {
        let kind = Kind::of(
            col.physical_type(),
            col.logical_type_ref(),
            col.converted_type(),
            col,
        );
        Ok(Self {
            reader: reader.get_row_group(g)?.get_column_reader(i)?,
            kind,
            max_def: col.max_def_level(),
            left: reader.metadata().row_group(g).num_rows().max(0) as usize,
            defs: Vec::new(),
        })
    }

    /// The next at most `chunk` rows (at least one), or `None` when the row group is read.
    pub fn next(&mut self, chunk: usize) -> parquet::errors::Result<Option<Leaf>> {
        let want = chunk.max(1).min(self.left);
        if want == 0 {
            return Ok(None);
        }
        let (kind, max_def, defs) = (self.kind, self.max_def, &mut self.defs);
        macro_rules! chunk {
            ($r:expr, $t:ty, |$v:ident| $leaf:expr) => {{
                defs.clear();
                let mut $v: Vec<$t> = Vec::with_capacity(want);
                let (records, _, _) =
                    $r.read_records(want, (max_def > 0).then_some(&mut *defs), None, &mut $v)?;
                if records == 0 {
                    self.left = 0;
                    return Ok(None);
                }
                self.left -= records.min(self.left);
                $leaf
            }};
        }
        let leaf =
            match &mut self.reader {
                ColumnReader::FloatColumnReader(r) => chunk!(r, f32, |v| Leaf::Floats32(spread(
                    defs,
                    max_def,
                    v,
                    |x| x,
                    f32::NAN
                ))),
                ColumnReader::DoubleColumnReader(r) => chunk!(r, f64, |v| Leaf::Numbers(spread(
                    defs,
                    max_def,
                    v,
                    |x| x,
                    f64::NAN
                ))),
                ColumnReader::FixedLenByteArrayColumnReader(r) if matches!(kind, Kind::Float16) => {
                    chunk!(r, FixedLenByteArray, |v| Leaf::Numbers(spread(
                        defs,
                        max_def,
                        v,
                        |b| half(b.data()),
                        f64::NAN
                    )))
                }
                ColumnReader::BoolColumnReader(r) => chunk!(r, bool, |v| Leaf::Text(spread(
                    defs,
                    max_def,
                    v,
                    |b| Some(b.to_string()),
                    None
                ))),
                ColumnReader::Int32ColumnReader(r) => chunk!(r, i32, |v| Leaf::Text(spread(
                    defs,
                    max_def,
                    v,
                    |x| kind.int(x.into()),
                    None
                ))),
                ColumnReader::Int64ColumnReader(r) => chunk!(r, i64, |v| Leaf::Text(spread(
                    defs,
                    max_def,
                    v,
                    |x| kind.int(x),
                    None
                ))),
                ColumnReader::Int96ColumnReader(r) => chunk!(r, Int96, |v| Leaf::Text(spread(
                    defs,
                    max_def,
                    v,
                    |x: Int96| Some(timestamp(x.to_nanos(), 1_000_000_000, false)),
                    None
                ))),
                ColumnReader::ByteArrayColumnReader(r) => chunk!(r, ByteArray, |v| Leaf::Text(
                    spread(defs, max_def, v, |b| kind.bytes(b.data()), None)
                )),
                ColumnReader::FixedLenByteArrayColumnReader(r) => {
                    chunk!(r, FixedLenByteArray, |v| Leaf::Text(spread(
                        defs,
                        max_def,
                        v,
                        |b| kind.bytes(b.data()),
                        None
                    )))
                }
            };
        Ok(Some(leaf))
    }
}

/// How a column's stored values become numbers or text.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Float32,
    Float64,
    Float16,
    Signed,
    /// Unsigned, stored in 64 bits (`true`) or 32.
    Unsigned(bool),
    Date,
    /// Time of day; the unit's ticks per second.
    Time(i64),
    /// Ticks per second, stored as UTC.
    Timestamp(i64, bool),
    Decimal(i32),
    Uuid,
    /// Strings, JSON, enums, binary.
    Text,
    Bool,
}

fn per_second(unit: &TimeUnit) -> i64 {
    match unit {
        TimeUnit::MILLIS => 1_000,
        TimeUnit::MICROS => 1_000_000,
        TimeUnit::NANOS => 1_000_000_000,
    }
}

impl Kind {
    fn of(
        physical: PhysicalType,
        logical: Option<&LogicalType>,
        converted: ConvertedType,
        col: &ColumnDescriptor,
    ) -> Self {
        match (physical, logical) {
            (PhysicalType::FLOAT, _) => Kind::Float32,
            (PhysicalType::DOUBLE, _) => Kind::Float64,
            (PhysicalType::BOOLEAN, _) => Kind::Bool,
            (PhysicalType::FIXED_LEN_BYTE_ARRAY, Some(LogicalType::Float16)) => Kind::Float16,
            (_, Some(LogicalType::Decimal { scale, .. })) => Kind::Decimal(*scale),
            (_, Some(LogicalType::Date)) => Kind::Date,
            (_, Some(LogicalType::Time { unit, .. })) => Kind::Time(per_second(unit)),
            (
                _,
                Some(LogicalType::Timestamp {
                    unit,
                    is_adjusted_to_u_t_c,
                }),
            ) => Kind::Timestamp(per_second(unit), *is_adjusted_to_u_t_c),
            (_, Some(LogicalType::Integer { is_signed, .. })) => {
                if *is_signed {
                    Kind::Signed
                } else {
                    Kind::Unsigned(physical == PhysicalType::INT64)
                }
            }
            (PhysicalType::FIXED_LEN_BYTE_ARRAY, Some(LogicalType::Uuid)) => Kind::Uuid,
            (PhysicalType::INT32 | PhysicalType::INT64, _) => match converted {
                ConvertedType::UINT_8
                | ConvertedType::UINT_16
                | ConvertedType::UINT_32
                | ConvertedType::UINT_64 => Kind::Unsigned(physical == PhysicalType::INT64),
                ConvertedType::DATE => Kind::Date,
                ConvertedType::DECIMAL => Kind::Decimal(col.type_scale()),
                ConvertedType::TIME_MILLIS => Kind::Time(1_000),
                ConvertedType::TIME_MICROS => Kind::Time(1_000_000),
                ConvertedType::TIMESTAMP_MILLIS => Kind::Timestamp(1_000, true),
                ConvertedType::TIMESTAMP_MICROS => Kind::Timestamp(1_000_000, true),
                _ => Kind::Signed,
            },
            (_, _) if converted == ConvertedType::DECIMAL => Kind::Decimal(col.type_scale()),
            _ => Kind::Text,
        }
    }

    /// An integer-stored value as text.
    fn int(self, x: i64) -> Option<String> {
        Some(match self {
            // Stored as the two's complement of the physical width.
            Kind::Unsigned(true) => (x as u64).to_string(),
            Kind::Unsigned(false) => (x as i32 as u32).to_string(),
            Kind::Date => date(x),
            Kind::Time(per) => {
                let (s, frac) = (x.div_euclid(per), x.rem_euclid(per));
                format!(
                    "{:02}:{:02}:{:02}{}",
                    s / 3600,
                    s / 60 % 60,
                    s % 60,
                    fraction(frac, per)
                )
            }
            Kind::Timestamp(per, utc) => timestamp(x, per, utc),
            Kind::Decimal(scale) => decimal(i128::from(x), scale),
            _ => x.to_string(),
        })
    }

    /// A byte-array value as text.
    fn bytes(self, b: &[u8]) -> Option<String> {
        Some(match self {
            Kind::Decimal(scale) if b.len() <= 16 => {
                // Big-endian two's complement.
                let mut v: i128 = if b.first().is_some_and(|&x| x & 0x80 != 0) {
                    -1
                } else {
                    0
                };
                for &x in b {
                    v = (v << 8) | i128::from(x);
                }
                decimal(v, scale)
            }
            Kind::Uuid if b.len() == 16 => {
                let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
                format!(
                    "{}-{}-{}-{}-{}",
                    &h[..8],
                    &h[8..12],
                    &h[12..16],
                    &h[16..20],
                    &h[20..]
                )
            }
            _ => String::from_utf8_lossy(b).into_owned(),
        })
    }
}

/// An IEEE half float from its two little-endian bytes.
fn half(b: &[u8]) -> f64 {
    let bits = u16::from_le_bytes([b[0], b.get(1).copied().unwrap_or(0)]);
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> 10) & 0x1f);
    let mant = f64::from(bits & 0x3ff);
    sign * match exp {
        0 => mant * 2f64.powi(-24),
        31 if mant == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + mant / 1024.0) * 2f64.powi(e - 15),
    }
}

/// `unscaled × 10^-scale` as decimal text.
fn decimal(unscaled: i128, scale: i32) -> String {
    if scale <= 0 {
        return format!("{}{}", unscaled, "0".repeat((-scale) as usize));
    }
    let s = unscaled.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = format!("{s:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{}{int}.{frac}", if unscaled < 0 { "-" } else { "" })
}

/// Days since 1970-01-01 as `YYYY-MM-DD` (proleptic Gregorian).
fn date(days: i64) -> String {
    let (y, m, d) = scdino_base::log::civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `.fff` of `frac` ticks of `per` per second, trailing zeros dropped; empty when zero.
fn fraction(frac: i64, per: i64) -> String {
    if frac == 0 {
        return String::new();
    }
    let digits = per.ilog10() as usize;
    let s = format!("{frac:0>digits$}");
    format!(".{}", s.trim_end_matches('0'))
}

/// `ticks` of `per` per second since the epoch as `YYYY-MM-DDTHH:MM:SS[.f][Z]`.
fn timestamp(ticks: i64, per: i64, utc: bool) -> String {
    let (secs, frac) = (ticks.div_euclid(per), ticks.rem_euclid(per));
    let (days, s) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    format!(
        "{}T{:02}:{:02}:{:02}{}{}",
        date(days),
        s / 3600,
        s / 60 % 60,
        s % 60,
        fraction(frac, per),
        if utc { "Z" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_decimals_halves_and_times_read_as_text() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(19_723), "2024-01-01");
        assert_eq!(date(-1), "1969-12-31");
        assert_eq!(decimal(-12_345, 2), "-123.45");
        assert_eq!(decimal(5, 3), "0.005");
        assert_eq!(decimal(7, 0), "7");
        assert_eq!(half(&[0x00, 0x3c]), 1.0);
        assert_eq!(half(&[0x00, 0xc0]), -2.0);
        assert!(half(&[0x01, 0x7c]).is_nan());
        assert_eq!(
            timestamp(1_704_067_200_500, 1_000, true),
            "2024-01-01T00:00:00.5Z"
        );
        assert_eq!(
            Kind::Time(1_000_000).int(3_723_000_001).unwrap(),
            "01:02:03.000001"
        );
        assert_eq!(Kind::Unsigned(false).int(-1).unwrap(), "4294967295");
        assert_eq!(
            Kind::Unsigned(true).int(-1).unwrap(),
            "18446744073709551615"
        );
    }
}
