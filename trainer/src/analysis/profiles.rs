//! Features as image-based profiles: a Parquet table with one row per image, `Metadata_*`
//! columns first and then one float32 column per feature (`DINO_CLS_0…`), the shape
//! pycytominer, the JUMP Cell Painting profiles and copairs work on. scDINO's `%.18e` CSV stays
//! for compatibility; at 90,851 × 384 it is ~700 MB of text, the table a sixth of that and read
//! without parsing.
//!
//! Written with parquet's column writers (no Arrow: the table is a handful of string columns
//! and a block of floats), Snappy-compressed as pandas and polars write by default. The
//! feature block's SHA-256 rides in the file's key-value metadata and is checked on read, so a
//! table this crate wrote cannot come back silently changed; a table from elsewhere (a
//! CellProfiler profile, one pycytominer normalised) has none and is read as it is.
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tch::{Kind, Tensor};

use parquet::basic::{Compression, LogicalType, Repetition, Type as PhysicalType};
use parquet::column::reader::ColumnReader;
use parquet::data_type::{ByteArray, ByteArrayType, FloatType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::{ColumnPath, Type};

use super::features::FeatureSet;
use crate::config::DatasetLocation;
use crate::cpu_values::values_mut;
use crate::parquet_columns::each_column_on_threads;

/// Prefix of the feature columns this crate writes.
pub const FEATURE_PREFIX: &str = "DINO_CLS_";
/// Key of the feature block's SHA-256 in the file's key-value metadata.
pub(crate) const CHECKSUM_KEY: &str = "scdino.features_sha256";
/// Rows per row group: bounded so a reader can stream a large table group by group.
const ROW_GROUP_ROWS: usize = 65_536;

#[derive(Debug, thiserror::Error)]
pub enum ProfilesError {
    #[error("{path}: {source}")]
    Parquet {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no `{column}` column (a profile table needs `Metadata_Class` and at least one float feature column)")]
    MissingColumn { path: PathBuf, column: &'static str },
    #[error("{path}: column `{column}` has {found} values but the table has {rows} rows (nulls are not allowed in it)")]
    RowCount {
        path: PathBuf,
        column: String,
        found: usize,
        rows: usize,
    },
    #[error("{path}: column `{column}` is {kind}; feature columns must be float or double, metadata columns strings (name non-feature columns `Metadata_*`)")]
    ColumnType {
        path: PathBuf,
        column: String,
        kind: String,
    },
    #[error("{path}: the feature values do not match the checksum written with them (file changed or damaged)")]
    Checksum { path: PathBuf },
    #[error("{path}: evaluation needs rows whose Metadata_Split is `train` and rows with another split; it has {train} and {other}")]
    Splits {
        path: PathBuf,
        train: usize,
        other: usize,
    },
    #[error("{rows} feature rows but {labels} labels and {paths} paths")]
    Mismatch {
        rows: usize,
        labels: usize,
        paths: usize,
    },
}

/// Rows of one [`FeatureSet`] as they go into a table: which split they are and where their
/// images live (to find the layout's donor and condition folders).
pub struct ProfileRows<'a> {
    pub set: &'a FeatureSet,
    /// `Metadata_Split`: `train`, `heldout` or `test`.
    pub split: &'a str,
    /// The dataset the paths are under (as written in the config: the paths start with it).
    pub root: &'a DatasetLocation,
}

/// What a profile table held, read back.
#[derive(Debug)]
pub struct Profiles {
    /// `[N, D]` float32, as stored.
    pub features: Tensor,
    pub feature_names: Vec<String>,
    pub labels: Vec<String>,
    /// `Metadata_ImagePath`, or empty strings where the table has none.
    pub paths: Vec<String>,
    /// `Metadata_Split`, or `None` where the table has none.
    pub splits: Option<Vec<String>>,
    /// `Metadata_Checkpoint` of the first row (empty if absent).
    pub checkpoint: String,
    /// `Metadata_Epoch` of the first row.
    pub checkpoint_epoch: Option<usize>,
}

impl Profiles {
    /// The rows as a [`FeatureSet`] tagged `tag`, L2-normalised as the features stage writes
    /// them when they are not already (a table from elsewhere gets the cosine geometry the kNN
    /// and UMAP assume). Rows of unit length are left bit for bit: dividing them by their
    /// norm moves values by an ulp, and the UMAP layout is chaotic enough that one ulp moved
    /// the demo's trustworthiness from 0.988 to 0.931.
    pub fn into_feature_set(self, tag: &str) -> FeatureSet {
        let norms = self
            .features
            .norm_scalaropt_dim(2.0, [1], true)
            .clamp_min(1e-12);
        let unit = self.labels.is_empty() || (&norms - 1.0).abs().max().double_value(&[]) <= 1e-5;
        let n = self.labels.len();
        FeatureSet {
            features: if unit {
                self.features
            } else {
                &self.features / norms
            },
            labels: self.labels,
            paths: self.paths,
            indices: (0..n).collect(),
            tag: tag.to_string(),
            checkpoint: self.checkpoint,
            checkpoint_epoch: self.checkpoint_epoch,
        }
    }

    /// Rows whose `Metadata_Split` is (`true`) or is not (`false`) `split`.
    pub fn rows_where_split(&self, split: &str, equal: bool) -> Vec<i64> {
        let Some(splits) = &self.splits else {
            return vec![];
        };
        (0..splits.len() as i64)
            .filter(|&i| (splits[i as usize] == split) == equal)
            .collect()
    }
}

/// The tag a profile file stands for: `epoch4` for `…/epoch4_profiles.parquet`, else the file
/// stem.
pub fn tag_of(path: &Path) -> String {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("profiles");
    stem.strip_suffix("_profiles").unwrap_or(stem).to_string()
}

/// The donor and condition folders of `path`: the two folders above its class folder, when
/// they lie under `root` (scDINO's test layout `<donor>/<condition>/<class>/<file>`).
fn donor_condition(root: &str, path: &str, label: &str) -> Option<(String, String)> {
    let rel = path.strip_prefix(root.trim_end_matches('/'))?;
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    let class_at = parts.iter().rposition(|p| *p == label)?;
    (class_at >= 2).then(|| {
        (
            parts[class_at - 2].to_string(),
            parts[class_at - 1].to_string(),
        )
    })
}

/// Columns that hold a value only for the rows whose path has it (null elsewhere).
const NULLABLE: [&str; 2] = ["Metadata_Donor", "Metadata_Condition"];

/// Writes `parts` as one table at `path`, atomically: `Metadata_ImagePath`, `Metadata_Class`,
/// `Metadata_Split`, `Metadata_Donor` and `Metadata_Condition` (when any row's path has them;
/// null for the rows whose path has not, e.g. the training rows beside test-folder rows),
/// `Metadata_Checkpoint`, `Metadata_Epoch` (null when unknown), `Metadata_Channels`
/// (`channels` joined by `+`), then `DINO_CLS_0…` (float32).
pub fn write(path: &Path, parts: &[ProfileRows], channels: &[String]) -> Result<(), ProfilesError> {
    let dim = parts
        .iter()
        .map(|p| p.set.features.size()[1] as usize)
        .next()
        .unwrap_or(0);
    let mut meta: Vec<(&str, Vec<String>)> = vec![
        ("Metadata_ImagePath", vec![]),
        ("Metadata_Class", vec![]),
        ("Metadata_Split", vec![]),
    ];
    let mut donors: Vec<Option<(String, String)>> = vec![];
    let mut checkpoints = vec![];
    let mut epochs: Vec<Option<i64>> = vec![];
    let mut values: Vec<f32> = vec![];
    for part in parts {
        let set = part.set;
        let rows = set.features.size()[0] as usize;
        if set.labels.len() != rows || set.paths.len() != rows {
            return Err(ProfilesError::Mismatch {
                rows,
                labels: set.labels.len(),
                paths: set.paths.len(),
            });
        }
        meta[0].1.extend(set.paths.iter().cloned());
        meta[1].1.extend(set.labels.iter().cloned());
        meta[2]
            .1
            .extend(std::iter::repeat_n(part.split.to_string(), rows));
        let root = part.root.to_string();
        donors.extend(
            set.paths
                .iter()
                .zip(&set.labels)
                .map(|(p, l)| donor_condition(&root, p, l)),
        );
        checkpoints.extend(std::iter::repeat_n(set.checkpoint.clone(), rows));
        epochs.extend(std::iter::repeat_n(
            set.checkpoint_epoch.map(|e| e as i64),
            rows,
        ));
        let flat = set
            .features
            .to_kind(Kind::Float)
            .contiguous()
            .flatten(0, -1);
        values.extend(Vec::<f32>::try_from(&flat).expect("float features convert"));
    }
    if donors.iter().any(Option::is_some) {
        // An empty string is the null of these columns (a folder name is never empty).
        let (d, c) = donors.into_iter().map(Option::unwrap_or_default).unzip();
        meta.push(("Metadata_Donor", d));
        meta.push(("Metadata_Condition", c));
    }
    meta.push(("Metadata_Checkpoint", checkpoints));
    let rows = meta[0].1.len();
    let table = Table {
        strings: meta,
        epochs,
        channels: channels.join("+"),
        values,
        rows,
        dim,
    };
    let bytes = table.encode().map_err(|source| ProfilesError::Parquet {
        path: path.to_path_buf(),
        source,
    })?;
    scdino_base::fs::write_atomic(path, &bytes).map_err(|source| ProfilesError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The columns of a table in the order they are written.
struct Table<'a> {
    strings: Vec<(&'a str, Vec<String>)>,
    epochs: Vec<Option<i64>>,
    channels: String,
    /// Row-major `[rows, dim]`.
    values: Vec<f32>,
    rows: usize,
    dim: usize,
}

impl Table<'_> {
    fn encode(&self) -> parquet::errors::Result<Vec<u8>> {
        let mut columns: Vec<ColumnSpec> = self
            .strings
            .iter()
            .map(|(name, _)| ColumnSpec::string(name, NULLABLE.contains(name)))
            .collect();
        columns.push(ColumnSpec::Int {
            name: "Metadata_Epoch".into(),
        });
        columns.push(ColumnSpec::string("Metadata_Channels", false));
        let mut stream = ProfileStream::new(Vec::new(), columns, self.dim)?;
        let channels = vec![self.channels.clone(); ROW_GROUP_ROWS.min(self.rows)];
        // An empty table still gets one (empty) row group, so readers see its columns.
        for start in (0..self.rows.max(1)).step_by(ROW_GROUP_ROWS) {
            let rows = start..(start + ROW_GROUP_ROWS).min(self.rows);
            let mut data: Vec<ColumnData> = self
                .strings
                .iter()
                .map(|(_, v)| ColumnData::Strings(&v[rows.clone()]))
                .collect();
            data.push(ColumnData::Ints(&self.epochs[rows.clone()]));
            data.push(ColumnData::Strings(&channels[..rows.len()]));
            let values = &self.values[rows.start * self.dim..rows.end * self.dim];
            stream.write_group(&data, values)?;
        }
        stream.finish()
    }
}

fn string_field(name: &str, nullable: bool) -> parquet::errors::Result<Arc<Type>> {
    let repetition = if nullable {
        Repetition::OPTIONAL
    } else {
        Repetition::REQUIRED
    };
    Ok(Arc::new(
        Type::primitive_type_builder(name, PhysicalType::BYTE_ARRAY)
            .with_repetition(repetition)
            .with_logical_type(Some(LogicalType::String))
            .build()?,
    ))
}

/// One metadata column of a streamed profile table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnSpec {
    /// UTF-8 strings; a `nullable` column stores the empty string as null.
    Str { name: String, nullable: bool },
    /// Optional int64 (`Metadata_Epoch`).
    Int { name: String },
}

impl ColumnSpec {
    pub fn string(name: &str, nullable: bool) -> Self {
        Self::Str {
            name: name.to_string(),
            nullable,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Self::Str { name, .. } | Self::Int { name } => name,
        }
    }
}

/// One row group's values of a [`ColumnSpec`], in the spec's order.
pub enum ColumnData<'a> {
    Strings(&'a [String]),
    Ints(&'a [Option<i64>]),
}

/// A profile table written row group by row group, so a table of any number of rows is
/// written with the memory of one group: the metadata columns, then `DINO_CLS_0…` (float32),
/// the feature block's SHA-256 accumulated as groups pass and stored in the key-value
/// metadata when the table is finished (the same checksum [`read`] verifies).
pub struct ProfileStream<W: std::io::Write + Send> {
    writer: SerializedFileWriter<W>,
    columns: Vec<ColumnSpec>,
    dim: usize,
    hash: Sha256,
    column_values: Vec<f32>,
}

impl<W: std::io::Write + Send> ProfileStream<W> {
    pub fn new(out: W, columns: Vec<ColumnSpec>, dim: usize) -> parquet::errors::Result<Self> {
        let mut fields = vec![];
        // Dictionaries only where values repeat (classes, splits, the checkpoint): on the
        // feature columns a dictionary is tried, overflows and leaves its pages behind (the
        // table came out 1.5x the size of the raw floats).
        let mut props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_dictionary_enabled(false);
        for spec in &columns {
            match spec {
                ColumnSpec::Str { name, nullable } => {
                    fields.push(string_field(name, *nullable)?);
                    if name != "Metadata_ImagePath" {
                        props = props
                            .set_column_dictionary_enabled(ColumnPath::from(name.as_str()), true);
                    }
                }
                ColumnSpec::Int { name } => fields.push(Arc::new(
                    Type::primitive_type_builder(name, PhysicalType::INT64)
                        .with_repetition(Repetition::OPTIONAL)
                        .build()?,
                )),
            }
        }
        for j in 0..dim {
            fields.push(Arc::new(
                Type::primitive_type_builder(&format!("{FEATURE_PREFIX}{j}"), PhysicalType::FLOAT)
                    .with_repetition(Repetition::REQUIRED)
                    .build()?,
            ));
        }
        let schema = Type::group_type_builder("schema")
            .with_fields(fields)
            .build()?;
        let writer = SerializedFileWriter::new(out, Arc::new(schema), Arc::new(props.build()))?;
        Ok(Self {
            writer,
            columns,
            dim,
            hash: Sha256::new(),
            column_values: vec![],
        })
    }

    /// Appends one row group: `data` in the order of the columns, `values` row-major
    /// `[rows, dim]`.
    pub fn write_group(
        &mut self,
        data: &[ColumnData],
        values: &[f32],
    ) -> parquet::errors::Result<()> {
        let rows = values.len().checked_div(self.dim).unwrap_or_else(|| {
            data.first().map_or(0, |d| match d {
                ColumnData::Strings(v) => v.len(),
                ColumnData::Ints(v) => v.len(),
            })
        });
        hash_floats(&mut self.hash, values);
        let mut group = self.writer.next_row_group()?;
        let mut column = 0;
        while let Some(mut col) = group.next_column()? {
            match (self.columns.get(column), data.get(column)) {
                (Some(ColumnSpec::Str { nullable, .. }), Some(ColumnData::Strings(values))) => {
                    let v: Vec<ByteArray> = values
                        .iter()
                        .filter(|s| !*nullable || !s.is_empty())
                        .map(|s| ByteArray::from(s.as_str()))
                        .collect();
                    let defined: Vec<i16> = values.iter().map(|s| !s.is_empty() as i16).collect();
                    let defs = nullable.then_some(&defined[..]);
                    col.typed::<ByteArrayType>().write_batch(&v, defs, None)?;
                }
                (Some(ColumnSpec::Int { .. }), Some(ColumnData::Ints(values))) => {
                    let defined: Vec<i16> = values.iter().map(|e| e.is_some() as i16).collect();
                    let v: Vec<i64> = values.iter().flatten().copied().collect();
                    col.typed::<Int64Type>()
                        .write_batch(&v, Some(&defined), None)?;
                }
                (Some(_), _) => {
                    return Err(parquet::errors::ParquetError::General(format!(
                        "column {column} of the row group does not match its spec"
                    )))
                }
                (None, _) => {
                    let j = column - self.columns.len();
                    self.column_values.clear();
                    self.column_values
                        .extend((0..rows).map(|r| values[r * self.dim + j]));
                    col.typed::<FloatType>()
                        .write_batch(&self.column_values, None, None)?;
                }
            }
            col.close()?;
            column += 1;
        }
        group.close()?;
        Ok(())
    }

    /// Writes the checksum and the footer; returns the output.
    pub fn finish(mut self) -> parquet::errors::Result<W> {
        let sum = format!("{:x}", self.hash.finalize_reset());
        self.writer
            .append_key_value_metadata(KeyValue::new(CHECKSUM_KEY.to_string(), sum));
        self.writer.into_inner()
    }
}

/// SHA-256 of the feature block, row-major little-endian float32.
pub(crate) fn feature_checksum(values: &[f32]) -> String {
    let mut h = Sha256::new();
    hash_floats(&mut h, values);
    format!("{:x}", h.finalize())
}

/// Feeds `values` to `h` as little-endian bytes, a block at a time: one `update` per float
/// cost more than the hashing itself (0.3 s of a 90,851 × 384 table's read).
fn hash_floats(h: &mut Sha256, values: &[f32]) {
    const BLOCK: usize = 4096;
    let mut bytes = Vec::with_capacity(BLOCK * 4);
    for block in values.chunks(BLOCK) {
        bytes.clear();
        bytes.extend(block.iter().flat_map(|v| v.to_le_bytes()));
        h.update(&bytes);
    }
}

/// Column-major `columns` (each `rows` long) into `out`, row-major `[rows, columns.len()]`,
/// a tile at a time so reads and writes both stay in cache, rows split over the cores.
pub(crate) fn to_row_major(columns: &[&[f32]], rows: usize, out: &mut [f32]) {
    const TILE: usize = 64;
    let dim = columns.len();
    assert_eq!(
        out.len(),
        rows * dim,
        "to_row_major: the output holds rows × columns"
    );
    if dim == 0 || rows == 0 {
        return;
    }
    let threads = worker_threads().min(rows.div_ceil(TILE)).max(1);
    let rows_per = rows.div_ceil(threads).div_ceil(TILE) * TILE;
    std::thread::scope(|scope| {
        for (t, block) in out.chunks_mut(rows_per * dim).enumerate() {
            scope.spawn(move || {
                let first = t * rows_per;
                let n = block.len() / dim;
                for r0 in (0..n).step_by(TILE) {
                    let r1 = (r0 + TILE).min(n);
                    for j0 in (0..dim).step_by(TILE) {
                        for (j, col) in columns
                            .iter()
                            .enumerate()
                            .take((j0 + TILE).min(dim))
                            .skip(j0)
                        {
                            for r in r0..r1 {
                                block[r * dim + j] = col[first + r];
                            }
                        }
                    }
                }
            });
        }
    });
}

/// Threads for reading and reshaping a table: the cores this process may use.
fn worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One column of a table, read whole.
pub(crate) enum Column {
    Strings(Vec<String>),
    Floats(Vec<f32>),
    Ints(Vec<Option<i64>>),
}

/// Reads a profile table: ours, or any table with a `Metadata_Class` string column and float
/// or double feature columns (every column not named `Metadata_*`).
pub fn read(path: &Path) -> Result<Profiles, ProfilesError> {
    let (rows, mut columns, stored) = read_columns(path)?;
    let mut take_strings = |key: &str| {
        columns.iter().position(|(n, _)| n == key).and_then(|i| {
            match std::mem::replace(&mut columns[i].1, Column::Strings(vec![])) {
                Column::Strings(v) => Some(v),
                other => {
                    columns[i].1 = other;
                    None
                }
            }
        })
    };
    let labels = take_strings("Metadata_Class").ok_or(ProfilesError::MissingColumn {
        path: path.to_path_buf(),
        column: "Metadata_Class",
    })?;
    let paths = take_strings("Metadata_ImagePath").unwrap_or_else(|| vec![String::new(); rows]);
    let splits = take_strings("Metadata_Split");
    let checkpoint = take_strings("Metadata_Checkpoint")
        .and_then(|v| v.into_iter().next())
        .unwrap_or_default();
    let checkpoint_epoch = columns.iter().find_map(|(n, c)| match c {
        Column::Ints(v) if n == "Metadata_Epoch" => v.first().copied().flatten(),
        _ => None,
    });
    let mut feature_names = vec![];
    let mut values = vec![];
    for (name, column) in &columns {
        if name.starts_with("Metadata_") {
            continue;
        }
        match column {
            Column::Floats(v) => {
                feature_names.push(name.clone());
                values.push(v.as_slice());
            }
            other => {
                return Err(ProfilesError::ColumnType {
                    path: path.to_path_buf(),
                    column: name.clone(),
                    kind: match other {
                        Column::Strings(_) => "a string column".into(),
                        _ => "an integer column".into(),
                    },
                })
            }
        }
    }
    if feature_names.is_empty() {
        return Err(ProfilesError::MissingColumn {
            path: path.to_path_buf(),
            column: "DINO_CLS_0",
        });
    }
    let dim = feature_names.len();
    let mut features = Tensor::empty([rows as i64, dim as i64], (Kind::Float, tch::Device::Cpu));
    let row_major = values_mut(&mut features);
    to_row_major(&values, rows, row_major);
    verify_checksum(stored, row_major, path)?;
    Ok(Profiles {
        features,
        feature_names,
        labels,
        paths,
        splits,
        checkpoint,
        checkpoint_epoch: checkpoint_epoch.map(|e| e as usize),
    })
}

/// Refuses `values` (a table's row-major feature block) when the table carries a checksum
/// (`stored`) they do not match.
fn verify_checksum(
    stored: Option<String>,
    values: &[f32],
    path: &Path,
) -> Result<(), ProfilesError> {
    match stored {
        Some(sum) if sum != feature_checksum(values) => Err(ProfilesError::Checksum {
            path: path.to_path_buf(),
        }),
        _ => Ok(()),
    }
}

/// The feature checksum stored in a table's key-value metadata, if any.
fn stored_checksum(reader: &SerializedFileReader<std::fs::File>) -> Option<String> {
    reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|k| k.key == CHECKSUM_KEY))
        .and_then(|k| k.value.clone())
}

/// The Parquet reader of the table at `path`.
fn open_reader(path: &Path) -> Result<SerializedFileReader<std::fs::File>, ProfilesError> {
    let file = std::fs::File::open(path).map_err(|source| ProfilesError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    SerializedFileReader::new(file).map_err(|source| ProfilesError::Parquet {
        path: path.to_path_buf(),
        source,
    })
}

/// Row count, named columns and stored feature checksum of a table, as read.
pub(crate) type TableColumns = (usize, Vec<(String, Column)>, Option<String>);

/// Every column of the table at `path`, read whole and checked to have one value per row,
/// with the row count and the feature checksum stored with it (if any).
pub(crate) fn read_columns(path: &Path) -> Result<TableColumns, ProfilesError> {
    let pq = |source| ProfilesError::Parquet {
        path: path.to_path_buf(),
        source,
    };
    let reader = open_reader(path)?;
    let meta = reader.metadata();
    let rows = meta.file_metadata().num_rows() as usize;
    let schema = meta.file_metadata().schema_descr();
    let mut columns: Vec<(String, Column)> = vec![];
    for (i, column) in read_all_columns(&reader, path)?.into_iter().enumerate() {
        let name = schema.column(i).name().to_string();
        let column = column.map_err(|e| match e {
            ReadError::Parquet(source) => pq(source),
            ReadError::Profiles(e) => e,
        })?;
        let found = match &column {
            Column::Strings(v) => v.len(),
            Column::Floats(v) => v.len(),
            Column::Ints(v) => v.len(),
        };
        if found != rows {
            return Err(ProfilesError::RowCount {
                path: path.to_path_buf(),
                column: name,
                found,
                rows,
            });
        }
        columns.push((name, column));
    }
    Ok((rows, columns, stored_checksum(&reader)))
}

/// A table [`ProfileStream`] wrote, read back whole (one part of a larger table: bounded
/// rows), to be copied into another stream.
pub struct StreamedTable {
    pub columns: Vec<ColumnSpec>,
    pub data: Vec<OwnedColumn>,
    /// Row-major `[rows, dim]`, checksum verified.
    pub values: Vec<f32>,
    pub rows: usize,
    pub dim: usize,
}

/// The values of one metadata column of a [`StreamedTable`].
pub enum OwnedColumn {
    Strings(Vec<String>),
    Ints(Vec<Option<i64>>),
}

impl StreamedTable {
    /// The metadata columns as a row group's data.
    pub fn column_data(&self) -> Vec<ColumnData<'_>> {
        self.data
            .iter()
            .map(|c| match c {
                OwnedColumn::Strings(v) => ColumnData::Strings(v),
                OwnedColumn::Ints(v) => ColumnData::Ints(v),
            })
            .collect()
    }
}

/// Reads a table written by [`ProfileStream`] (metadata columns, then `DINO_CLS_*`).
pub fn read_streamed(path: &Path) -> Result<StreamedTable, ProfilesError> {
    let pq = |source| ProfilesError::Parquet {
        path: path.to_path_buf(),
        source,
    };
    let reader = open_reader(path)?;
    let rows = reader.metadata().file_metadata().num_rows() as usize;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let (mut columns, mut data, mut features) = (vec![], vec![], vec![]);
    let read = read_all_columns(&reader, path)?;
    for (col, column) in schema.columns().iter().zip(read) {
        let name = col.name().to_string();
        let column = column.map_err(|e| match e {
            ReadError::Parquet(source) => pq(source),
            ReadError::Profiles(e) => e,
        })?;
        match column {
            Column::Floats(v) if name.starts_with(FEATURE_PREFIX) => features.push((name, v)),
            Column::Strings(v) => {
                columns.push(ColumnSpec::string(&name, col.max_def_level() > 0));
                data.push(OwnedColumn::Strings(v));
            }
            Column::Ints(v) => {
                columns.push(ColumnSpec::Int { name });
                data.push(OwnedColumn::Ints(v));
            }
            Column::Floats(_) => {
                return Err(ProfilesError::ColumnType {
                    path: path.to_path_buf(),
                    column: name,
                    kind: "a float column not named DINO_CLS_*".into(),
                })
            }
        }
    }
    let dim = features.len();
    // A null in a feature column reads as one value fewer: refused, naming the column.
    if let Some((name, short)) = features.iter().find(|(_, c)| c.len() != rows) {
        return Err(ProfilesError::RowCount {
            path: path.to_path_buf(),
            column: name.clone(),
            found: short.len(),
            rows,
        });
    }
    let mut values = vec![0f32; rows * dim];
    to_row_major(
        &features
            .iter()
            .map(|(_, c)| c.as_slice())
            .collect::<Vec<_>>(),
        rows,
        &mut values,
    );
    verify_checksum(stored_checksum(&reader), &values, path)?;
    Ok(StreamedTable {
        columns,
        data,
        values,
        rows,
        dim,
    })
}

/// Every column of the table, in table order, read on up to one thread per core.
fn read_all_columns(
    reader: &SerializedFileReader<std::fs::File>,
    path: &Path,
) -> Result<Vec<Result<Column, ReadError>>, ProfilesError> {
    let schema = reader.metadata().file_metadata().schema_descr();
    let names: Vec<String> = schema
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    let all: Vec<usize> = (0..names.len()).collect();
    each_column_on_threads(
        reader,
        &all,
        || open_reader(path),
        |r, i| read_column(r, i, path, &names[i]),
    )
}

enum ReadError {
    Parquet(parquet::errors::ParquetError),
    Profiles(ProfilesError),
}

impl From<parquet::errors::ParquetError> for ReadError {
    fn from(e: parquet::errors::ParquetError) -> Self {
        ReadError::Parquet(e)
    }
}

/// Column `i` over every row group. Nulls are dropped (the row count check then names the
/// column), except in `Metadata_Epoch`, where null means unknown.
fn read_column(
    reader: &SerializedFileReader<std::fs::File>,
    i: usize,
    path: &Path,
    name: &str,
) -> Result<Column, ReadError> {
    let meta = reader.metadata();
    let physical = meta
        .file_metadata()
        .schema_descr()
        .column(i)
        .physical_type();
    let mut column = match physical {
        PhysicalType::BYTE_ARRAY => Column::Strings(vec![]),
        PhysicalType::FLOAT | PhysicalType::DOUBLE => Column::Floats(vec![]),
        PhysicalType::INT32 | PhysicalType::INT64 => Column::Ints(vec![]),
        other => {
            return Err(ReadError::Profiles(ProfilesError::ColumnType {
                path: path.to_path_buf(),
                column: name.to_string(),
                kind: format!("{other:?}"),
            }))
        }
    };
    for g in 0..meta.num_row_groups() {
        let group = reader.get_row_group(g)?;
        let n = meta.row_group(g).num_rows() as usize;
        let mut defs = Vec::with_capacity(n);
        match (group.get_column_reader(i)?, &mut column) {
            (ColumnReader::ByteArrayColumnReader(mut r), Column::Strings(out)) => {
                let mut v = Vec::with_capacity(n);
                r.read_records(n, Some(&mut defs), None, &mut v)?;
                let mut text = v
                    .iter()
                    .map(|b| String::from_utf8_lossy(b.data()).into_owned());
                if defs.is_empty() || !name.starts_with("Metadata_") {
                    // Required, or a non-metadata string column (refused later): as read.
                    out.extend(text);
                } else {
                    // An optional metadata column: null reads as the empty string.
                    out.extend(defs.iter().map(|&d| {
                        if d > 0 {
                            text.next().unwrap_or_default()
                        } else {
                            String::new()
                        }
                    }));
                }
            }
            (ColumnReader::FloatColumnReader(mut r), Column::Floats(out)) => {
                r.read_records(n, Some(&mut defs), None, out)?;
            }
            (ColumnReader::DoubleColumnReader(mut r), Column::Floats(out)) => {
                let mut v = Vec::with_capacity(n);
                r.read_records(n, Some(&mut defs), None, &mut v)?;
                out.extend(v.iter().map(|&x| x as f32));
            }
            (ColumnReader::Int64ColumnReader(mut r), Column::Ints(out)) => {
                let mut v = Vec::with_capacity(n);
                r.read_records(n, Some(&mut defs), None, &mut v)?;
                out.extend(spread_nulls(&defs, &v, n));
            }
            (ColumnReader::Int32ColumnReader(mut r), Column::Ints(out)) => {
                let mut v = Vec::with_capacity(n);
                r.read_records(n, Some(&mut defs), None, &mut v)?;
                let v: Vec<i64> = v.into_iter().map(i64::from).collect();
                out.extend(spread_nulls(&defs, &v, n));
            }
            _ => unreachable!("reader kind follows the physical type"),
        }
    }
    Ok(column)
}

/// Values of an optional column back at their rows (`None` where the definition level is 0).
fn spread_nulls(defs: &[i16], values: &[i64], n: usize) -> Vec<Option<i64>> {
    if defs.is_empty() {
        return values.iter().copied().map(Some).take(n).collect();
    }
    let mut it = values.iter();
    defs.iter()
        .map(|&d| if d > 0 { it.next().copied() } else { None })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(rows: usize, dim: usize, epoch: Option<usize>) -> FeatureSet {
        let features = Tensor::randn([rows as i64, dim as i64], (Kind::Float, tch::Device::Cpu));
        FeatureSet {
            features,
            labels: (0..rows).map(|i| format!("c{}", i % 3)).collect(),
            paths: (0..rows)
                .map(|i| format!("/d/Test/Donor01/Control/c{}/img{i}.tiff", i % 3))
                .collect(),
            indices: (0..rows).collect(),
            tag: "epoch2".into(),
            checkpoint: "/ck/checkpoint0002.safetensors".into(),
            checkpoint_epoch: epoch,
        }
    }

    #[test]
    fn round_trip_with_layout_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("epoch2_profiles.parquet");
        let a = set(70_000, 3, Some(2));
        let b = set(5, 3, Some(2));
        write(
            &path,
            &[
                ProfileRows {
                    set: &a,
                    split: "train",
                    root: &DatasetLocation::Local("/d/Test".into()),
                },
                ProfileRows {
                    set: &b,
                    split: "test",
                    root: &DatasetLocation::Local("/d/Test/".into()),
                },
            ],
            &["DAPI".into(), "CD3".into()],
        )
        .unwrap();
        let back = read(&path).unwrap();
        assert_eq!(
            back.feature_names,
            ["DINO_CLS_0", "DINO_CLS_1", "DINO_CLS_2"]
        );
        let both = Tensor::cat(&[&a.features, &b.features], 0);
        assert!(back.features.equal(&both));
        assert_eq!(back.labels[..70_000], a.labels[..]);
        assert_eq!(back.paths[70_000..], b.paths[..]);
        assert_eq!(back.rows_where_split("train", true).len(), 70_000);
        assert_eq!(
            back.rows_where_split("train", false),
            [70_000, 70_001, 70_002, 70_003, 70_004]
        );
        assert_eq!(back.checkpoint_epoch, Some(2));
        assert_eq!(tag_of(&path), "epoch2");
    }

    #[test]
    fn unit_rows_stay_bit_for_bit_and_others_are_normalised() {
        let table = |rows: Vec<f32>| Profiles {
            features: Tensor::from_slice(&rows).reshape([2, 2]),
            feature_names: vec!["a".into(), "b".into()],
            labels: vec!["x".into(), "y".into()],
            paths: vec![String::new(); 2],
            splits: None,
            checkpoint: String::new(),
            checkpoint_epoch: None,
        };
        // 0.6, 0.8 has norm 1 up to rounding; division by it would move the last bit.
        let unit = vec![0.6f32, 0.8, 1.0, 0.0];
        let set = table(unit.clone()).into_feature_set("t");
        assert_eq!(
            Vec::<f32>::try_from(set.features.flatten(0, -1)).unwrap(),
            unit
        );
        let set = table(vec![3.0, 4.0, 0.0, 2.0]).into_feature_set("t");
        assert_eq!(
            Vec::<f32>::try_from(set.features.flatten(0, -1)).unwrap(),
            [0.6, 0.8, 0.0, 1.0]
        );
    }

    #[test]
    fn donor_and_condition_only_under_the_root() {
        assert_eq!(
            donor_condition("/d/Test", "/d/Test/Donor01/Control/B/x.tiff", "B"),
            Some(("Donor01".into(), "Control".into()))
        );
        assert_eq!(
            donor_condition("/d/Training", "/d/Training/B/x.tiff", "B"),
            None
        );
        assert_eq!(
            donor_condition("/e", "/d/Test/Donor01/Control/B/x.tiff", "B"),
            None
        );
    }

    #[test]
    fn tables_of_any_shape_read_back_bit_for_bit_on_one_thread_or_several() {
        // Widths below and above the threaded read's 16 columns per thread, heights around the
        // reshape's 64-row tiles and its split over the cores.
        let dir = tempfile::tempdir().unwrap();
        for (rows, dim) in [(1, 1), (1, 40), (63, 33), (65, 97), (129, 64), (1000, 130)] {
            let path = dir.path().join(format!("t{rows}x{dim}_profiles.parquet"));
            let s = set(rows, dim, None);
            let parts = [ProfileRows {
                set: &s,
                split: "heldout",
                root: &DatasetLocation::Local("/d".into()),
            }];
            write(&path, &parts, &[]).unwrap();
            let back = read(&path).unwrap();
            assert!(back.features.equal(&s.features), "{rows} x {dim}");
            assert_eq!(back.labels, s.labels, "{rows} x {dim}");
            assert_eq!(back.feature_names.len(), dim);
            assert_eq!(back.feature_names[dim - 1], format!("DINO_CLS_{}", dim - 1));
        }
    }

    #[test]
    fn the_reshape_puts_every_value_at_its_row_and_column() {
        for (rows, dim) in [(0, 3), (3, 0), (1, 1), (64, 64), (65, 1), (200, 131)] {
            let columns: Vec<Vec<f32>> = (0..dim)
                .map(|j| (0..rows).map(|r| (r * 1000 + j) as f32).collect())
                .collect();
            let mut out = vec![f32::NAN; rows * dim];
            to_row_major(
                &columns.iter().map(Vec::as_slice).collect::<Vec<_>>(),
                rows,
                &mut out,
            );
            let want: Vec<f32> = (0..rows)
                .flat_map(|r| (0..dim).map(move |j| (r * 1000 + j) as f32))
                .collect();
            assert_eq!(out, want, "{rows} x {dim}");
        }
    }

    #[test]
    fn the_checksum_is_the_sha256_of_the_little_endian_floats() {
        // Tables written before the hash took blocks must still verify: the same bytes.
        let values: Vec<f32> = (0..10_007).map(|i| (i as f32).sin()).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            feature_checksum(&values),
            format!("{:x}", Sha256::digest(&bytes))
        );
    }

    #[test]
    fn changed_features_fail_the_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t_profiles.parquet");
        let s = set(4, 2, None);
        let rows = [ProfileRows {
            set: &s,
            split: "heldout",
            root: &DatasetLocation::Local("/d".into()),
        }];
        let table = Table {
            strings: vec![
                ("Metadata_ImagePath", s.paths.clone()),
                ("Metadata_Class", s.labels.clone()),
            ],
            epochs: vec![None; 4],
            channels: "a".into(),
            values: vec![0.5; 8],
            rows: 4,
            dim: 2,
        };
        // Same schema and checksum as a table of 0.5s, but the checksum of other values.
        let mut bytes = table.encode().unwrap();
        let good = feature_checksum(&[0.5; 8]);
        let bad = feature_checksum(&[0.25; 8]);
        let at = bytes
            .windows(good.len())
            .position(|w| w == good.as_bytes())
            .unwrap();
        bytes[at..at + bad.len()].copy_from_slice(bad.as_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(read(&path), Err(ProfilesError::Checksum { .. })));
        write(&path, &rows, &[]).unwrap();
        let back = read(&path).unwrap();
        assert_eq!(back.checkpoint_epoch, None);
        assert!(back.splits.unwrap().iter().all(|s| s == "heldout"));
    }
}
