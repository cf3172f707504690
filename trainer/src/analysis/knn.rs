//! Global weighted kNN evaluation of CLS features (scDINO `pyscripts/global_kNN.py`).
//!
//! # Algorithm (scDINO's, step for step)
//! 1. Features `[N, D]` (L2-normalised rows, as the feature stage writes them; not normalised
//!    again here, as in scDINO) and one label per row.
//! 2. `np.random.seed(seed); idx = arange(N); np.random.shuffle(idx)` (numpy's legacy MT19937,
//!    [`crate::data::numpy_shuffled_indices`]); features and labels are reordered by `idx`.
//! 3. `n_train = int(N · 0.8)` (Python f64 product, truncated): train = the first `n_train`
//!    shuffled rows, test = the rest.
//! 4. Labels are encoded **once, on all labels** ([`LabelEncoder`]: sorted unique strings →
//!    `0..C`, sklearn's `LabelEncoder`). scDINO fitted two encoders, one on the train and one on
//!    the test labels, so a class missing from one side shifted the codes of the other: a bug,
//!    fixed here (reference §18 item 9).
//! 5. For every k, with temperature T, the test rows go through in chunks: cosine similarity
//!    `chunk · trainᵀ` (a libtorch matmul, multi-threaded), `topk(k)` (largest, sorted), votes
//!    per class `Σ exp(sim / T)` over the neighbours of that class, classes ranked by votes
//!    (descending), top-1 = `ranking[0] == y`, top-2 = `y ∈ ranking[..min(2, k)]`, and
//!    percentages `100 · count / n_test`. The tensor operations are the very ones scDINO calls
//!    (mm, topk, gather, scatter one-hot, div, exp, mul, sum), in the same dtype, so with the same
//!    libtorch the counts are identical to scDINO's run on the same file.
//!
//! # Deliberate differences, all documented behaviour
//! * **Chunk size**: scDINO's is `n_test // 100`, which is 0 below 100 test rows and makes
//!   `range(0, n, 0)` raise. Ours is `max(1, n_test / 100)`, further capped so that one chunk's
//!   similarity matrix holds at most [`KnnConfig::max_chunk_elements`] values (512 MB in f64 by
//!   default; the cap does not bind at scDINO's scale: 227 × 90,852). The chunk size does not
//!   change any result.
//! * **k larger than the training set**: scDINO's `topk` raises and it writes an `Error:` line.
//!   We clamp k to `n_train`, report `k_used` and `clamped` in [`KnnKResult`], add a warning to
//!   [`KnnReport::warnings`], and the `global_kNN.txt` line keeps the requested k with a note
//!   appended (`... (k clamped to 120, the number of training samples)`).
//! * **One class**: top-2 looks at `min(2, k, C)` ranked classes (scDINO's `narrow` raised).
//! * **Empty sides**: `n_train == 0` or `n_test == 0` (N < 2) is an error.
//! * **Non-finite votes** (T so small that `exp(sim / T)` overflows, below ≈ 1/709 in f64) are
//!   an error instead of silently NaN rankings.
//! * **One pass for all k**: the similarity matrix and `topk` are computed once per chunk for
//!   the largest k; each k takes the first k of the sorted neighbours (scDINO recomputed both
//!   for every k). Identical results whenever no two training rows tie in similarity exactly at
//!   the k-th place; such exact ties arise only from duplicated rows (DistributedSampler
//!   padding), which carry the same label and therefore the same votes.
//!
//! # Ties in the votes
//! Classes are ranked with libtorch's **stable** descending sort: equal votes keep class order,
//! so the class with the lower code (the code-point-smaller label) ranks first. Exact vote ties
//! are common for classes with no neighbour (votes 0), which decides top-2 when all k
//! neighbours share one class. scDINO calls `probs.sort(1, True)` (`stable=False`); on CPU,
//! libtorch sorts each row with `std::sort`, which for ≤ 16 elements is an insertion sort and
//! hence stable, so for ≤ 16 classes the rankings are identical to scDINO's. With more classes
//! the unstable sort's tie order is an implementation detail; ours stays the documented one.
//! Ties in similarity are broken by libtorch's `topk` (see above).
//!
//! # Label order
//! Codes follow sorted code points (`np.unique` on strings). scDINO reads the labels with
//! `pandas.read_csv`, which would turn an all-numeric label column into integers and sort them
//! numerically (`"10"` after `"9"`); we keep the strings (`"10"` before `"9"`). Only the
//! tie-breaking order above can differ.
//!
//! # Extras scDINO lacks
//! Per-class precision, recall and F1 of the top-1 prediction and the confusion matrix
//! (rows = true class, columns = predicted class) for every k, serialisable to JSON.
use crate::data::numpy_shuffled_indices;
use serde::Serialize;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// The output file name scDINO appends to (`{…}_analyses/kNN/global_kNN.txt`).
pub const GLOBAL_KNN_TXT: &str = "global_kNN.txt";

/// The separator line scDINO writes after every run (50 dashes, no newline).
pub const SEPARATOR: &str = "--------------------------------------------------";

#[derive(Debug, thiserror::Error)]
pub enum KnnError {
    /// An operating-system I/O error on `path`.
    #[error("{}: {context}: {source}", path.display())]
    Io {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A malformed line of an input file (1-based line number).
    #[error("{}:{line}: {reason}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("kNN: features must be a non-empty [N, D] matrix, got shape {shape:?}")]
    FeatureShape { shape: Vec<i64> },
    #[error("kNN: features must be f32 or f64, got {kind:?}")]
    FeatureKind { kind: Kind },
    #[error("kNN: {features} feature rows but {labels} labels")]
    RowCountMismatch { features: usize, labels: usize },
    #[error("kNN: {} has {features} feature rows but {} has {labels} labels; they must correspond row for row", features_csv.display(), labels_csv.display())]
    CsvRowCountMismatch {
        features_csv: PathBuf,
        features: usize,
        labels_csv: PathBuf,
        labels: usize,
    },
    #[error("kNN: label {label:?} was not fitted")]
    UnfittedLabel { label: String },
    #[error("kNN: k must be a non-empty list of values ≥ 1, got {ks:?}")]
    BadKs { ks: Vec<usize> },
    #[error("kNN: temperature must be finite and > 0, got {temperature}")]
    BadTemperature { temperature: f64 },
    #[error("kNN: train fraction must be within (0, 1), got {fraction}")]
    BadTrainFraction { fraction: f64 },
    #[error(
        "kNN: {n} samples give {train} train and {test} test rows; both sides need at least one"
    )]
    EmptySide { n: usize, train: usize, test: usize },
    #[error("kNN: non-finite votes: exp(similarity / T) overflows for T = {temperature}")]
    NonFiniteVotes { temperature: f64 },
    #[error("kNN: libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

impl KnnError {
    fn io(path: &Path, context: &'static str, source: std::io::Error) -> Self {
        KnnError::Io {
            path: path.to_path_buf(),
            context,
            source,
        }
    }
    fn parse(path: &Path, line: usize, reason: impl Into<String>) -> Self {
        KnnError::Parse {
            path: path.to_path_buf(),
            line,
            reason: reason.into(),
        }
    }
}

/// Features and their labels, row for row.
#[derive(Debug)]
pub struct KnnInput {
    /// `[N, D]`, `Float` or `Double`, rows L2-normalised (scDINO's feature CSV is read as f64).
    pub features: Tensor,
    /// One label per feature row.
    pub labels: Vec<String>,
}

impl KnnInput {
    /// Checks shapes and dtype: a 2-D f32/f64 tensor with one row per label, N ≥ 1, D ≥ 1.
    pub fn new(features: Tensor, labels: Vec<String>) -> Result<Self, KnnError> {
        let size = features.size();
        if size.len() != 2 || size[0] < 1 || size[1] < 1 {
            return Err(KnnError::FeatureShape { shape: size });
        }
        if !matches!(features.kind(), Kind::Float | Kind::Double) {
            return Err(KnnError::FeatureKind {
                kind: features.kind(),
            });
        }
        if size[0] as usize != labels.len() {
            return Err(KnnError::RowCountMismatch {
                features: size[0] as usize,
                labels: labels.len(),
            });
        }
        Ok(KnnInput { features, labels })
    }

    /// Reads scDINO's feature CSV and `class_labels.csv` (see [`read_features_csv`] and
    /// [`read_labels_csv`]); the row counts must agree.
    pub fn from_csv(features_csv: &Path, labels_csv: &Path) -> Result<Self, KnnError> {
        let features = read_features_csv(features_csv)?;
        let labels = read_labels_csv(labels_csv)?;
        let rows = features.size()[0] as usize;
        if rows != labels.len() {
            return Err(KnnError::CsvRowCountMismatch {
                features_csv: features_csv.to_path_buf(),
                features: rows,
                labels_csv: labels_csv.to_path_buf(),
                labels: labels.len(),
            });
        }
        KnnInput::new(features, labels)
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Feature dimension D.
    pub fn dim(&self) -> usize {
        self.features.size()[1] as usize
    }
}

fn read_bytes(path: &Path) -> Result<Vec<u8>, KnnError> {
    std::fs::read(path).map_err(|e| KnnError::io(path, "reading", e))
}

/// Lines of `bytes` split at `\n` (a trailing `\r` is dropped); a final newline does not start
/// another line. Returns (1-based line number, content).
fn split_lines(bytes: &[u8]) -> Vec<(usize, &[u8])> {
    let mut body = bytes;
    if let Some(stripped) = body.strip_suffix(b"\n") {
        body = stripped;
    }
    if bytes.is_empty() {
        return Vec::new();
    }
    body.split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l.strip_suffix(b"\r").unwrap_or(l)))
        .collect()
}

fn shorten(s: &str) -> String {
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s.to_string()
    }
}

/// Parses one CSV row of `expected` numbers (if given) into `out`.
fn parse_row(
    path: &Path,
    line_no: usize,
    line: &[u8],
    expected: Option<usize>,
    out: &mut Vec<f64>,
) -> Result<usize, KnnError> {
    let text = std::str::from_utf8(line)
        .map_err(|_| KnnError::parse(path, line_no, "not valid UTF-8 text"))?;
    if text.trim().is_empty() {
        return Err(KnnError::parse(
            path,
            line_no,
            "empty line (expected one comma-separated feature row per image)",
        ));
    }
    let mut count = 0;
    for (col, field) in text.split(',').enumerate() {
        let field = field.trim();
        let v: f64 = field.parse().map_err(|_| {
            KnnError::parse(
                path,
                line_no,
                format!("column {}: {:?} is not a number", col + 1, shorten(field)),
            )
        })?;
        if !v.is_finite() {
            return Err(KnnError::parse(
                path,
                line_no,
                format!("column {}: non-finite value {field:?}", col + 1),
            ));
        }
        out.push(v);
        count += 1;
    }
    if let Some(e) = expected {
        if count != e {
            return Err(KnnError::parse(
                path,
                line_no,
                format!("{count} values, but line 1 has {e}"),
            ));
        }
    }
    Ok(count)
}

/// Reads scDINO's feature CSV (`np.savetxt(…, delimiter=",")`, `%.18e`, no header, one row per
/// image) into an `[N, D]` f64 tensor, as `np.genfromtxt` does. Every row must have the same
/// number of finite values; blank lines (other than a final newline) are errors. Errors name the
/// file and the 1-based line. Large files are parsed on several threads.
pub fn read_features_csv(path: &Path) -> Result<Tensor, KnnError> {
    let bytes = read_bytes(path)?;
    let lines = split_lines(&bytes);
    if lines.is_empty() {
        return Err(KnnError::parse(path, 1, "empty file: no feature rows"));
    }
    let mut first = Vec::new();
    let d = parse_row(path, 1, lines[0].1, None, &mut first)?;
    let threads = if bytes.len() < (1 << 20) {
        1
    } else {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(16)
    };
    let rest = &lines[1..];
    let per = rest.len().div_ceil(threads).max(1);
    let parts: Vec<Result<Vec<f64>, KnnError>> = std::thread::scope(|s| {
        let handles: Vec<_> = rest
            .chunks(per)
            .map(|chunk| {
                s.spawn(move || {
                    let mut out = Vec::with_capacity(chunk.len() * d);
                    for &(no, line) in chunk {
                        parse_row(path, no, line, Some(d), &mut out)?;
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("CSV parser thread panicked"))
            .collect()
    });
    let mut values = first;
    values.reserve(rest.len() * d);
    // Chunks are in line order, so the first error found is the earliest line's.
    for part in parts {
        values.extend(part?);
    }
    let n = lines.len() as i64;
    Ok(Tensor::from_slice(&values).view([n, d as i64]))
}

/// Reads `class_labels.csv` (`np.savetxt(fmt="%s")`: one label per line, no header). Each line
/// is one label, kept verbatim (no trimming, no comma splitting); empty lines other than a final
/// newline are errors, since pandas would skip them and misalign labels with features.
pub fn read_labels_csv(path: &Path) -> Result<Vec<String>, KnnError> {
    let bytes = read_bytes(path)?;
    let lines = split_lines(&bytes);
    if lines.is_empty() {
        return Err(KnnError::parse(path, 1, "empty file: no labels"));
    }
    lines
        .into_iter()
        .map(|(no, line)| {
            let s = std::str::from_utf8(line)
                .map_err(|_| KnnError::parse(path, no, "not valid UTF-8 text"))?;
            if s.is_empty() {
                return Err(KnnError::parse(path, no, "empty label"));
            }
            Ok(s.to_string())
        })
        .collect()
}

/// sklearn's `LabelEncoder` fitted once: the sorted unique labels (code-point order, as
/// `np.unique`), code = position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LabelEncoder {
    pub classes: Vec<String>,
}

impl LabelEncoder {
    pub fn fit<S: AsRef<str>>(labels: &[S]) -> Self {
        let mut classes: Vec<String> = labels.iter().map(|s| s.as_ref().to_string()).collect();
        classes.sort_unstable();
        classes.dedup();
        LabelEncoder { classes }
    }

    /// The code of every label; a label not seen by `fit` is an error.
    pub fn transform<S: AsRef<str>>(&self, labels: &[S]) -> Result<Vec<i64>, KnnError> {
        labels
            .iter()
            .map(|l| {
                let l = l.as_ref();
                self.classes
                    .binary_search_by(|c| c.as_str().cmp(l))
                    .map(|i| i as i64)
                    .map_err(|_| KnnError::UnfittedLabel {
                        label: l.to_string(),
                    })
            })
            .collect()
    }

    pub fn num_classes(&self) -> usize {
        self.classes.len()
    }
}

/// Parameters of the evaluation (`downstream.knn` plus `run.seed`).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct KnnConfig {
    /// `meta.seed` (40 in scDINO's config): the shuffle before the 80/20 split.
    pub seed: u32,
    /// Every k evaluated, in output order (each ≥ 1).
    pub ks: Vec<usize>,
    /// Vote temperature T (> 0).
    pub temperature: f64,
    /// Train share of the split; scDINO hard-codes 0.8 (`n_train = int(N · fraction)`).
    pub train_fraction: f64,
    /// Upper bound on `chunk × n_train` similarity values held at once.
    pub max_chunk_elements: usize,
}

impl Default for KnnConfig {
    fn default() -> Self {
        KnnConfig {
            seed: 40,
            ks: vec![5, 10, 50, 100, 200, 500],
            temperature: 0.1,
            train_fraction: 0.8,
            max_chunk_elements: 1 << 26,
        }
    }
}

/// Precision, recall and F1 of one class for the top-1 predictions (0 where undefined, as
/// sklearn's `zero_division=0`).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ClassMetrics {
    pub class: String,
    /// Test rows of this class.
    pub support: u64,
    /// Test rows predicted as this class.
    pub predicted: u64,
    pub true_positives: u64,
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
}

/// The result for one k.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct KnnKResult {
    /// The k asked for.
    pub k: usize,
    /// The k used: `min(k, n_train)`.
    pub k_used: usize,
    /// `k_used < k`.
    pub clamped: bool,
    pub top1_correct: u64,
    pub top2_correct: u64,
    /// Test rows evaluated (`n_test`).
    pub total: u64,
    /// `top1_correct · 100 / total` (Python's `top1 * 100.0 / total`).
    pub top1_percent: f64,
    pub top2_percent: f64,
    /// Per class, in code order.
    pub per_class: Vec<ClassMetrics>,
    /// Unweighted mean of the per-class F1 over classes with support > 0.
    pub macro_f1: f64,
    /// `confusion[true][predicted]`, top-1 predictions, in code order.
    pub confusion: Vec<Vec<u64>>,
}

impl KnnKResult {
    /// scDINO's `global_kNN.txt` line (without newline): `{k}-NN Top1: {round(top1)}, Top2:
    /// {round(top2)}`, with Python's round-half-to-even; a clamped k gets a note appended.
    pub fn txt_line(&self) -> String {
        let mut line = format!(
            "{}-NN Top1: {}, Top2: {}",
            self.k,
            python_round(self.top1_percent),
            python_round(self.top2_percent)
        );
        if self.clamped {
            line.push_str(&format!(
                " (k clamped to {}, the number of training samples)",
                self.k_used
            ));
        }
        line
    }
}

/// The whole evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct KnnReport {
    pub n_samples: usize,
    pub n_train: usize,
    pub n_test: usize,
    pub dim: usize,
    pub seed: u32,
    pub temperature: f64,
    /// Test rows per similarity chunk.
    pub chunk_size: usize,
    /// Class names in code order.
    pub classes: Vec<String>,
    pub results: Vec<KnnKResult>,
    /// Human-readable notes (clamped k, classes absent from the test or train side).
    pub warnings: Vec<String>,
    /// The checkpoint the features came from and its epoch (set by the pipeline stage from
    /// the features bundle; absent in reports written before provenance was recorded).
    #[serde(default)]
    pub checkpoint: Option<String>,
    #[serde(default)]
    pub checkpoint_epoch: Option<usize>,
}

impl KnnReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("kNN report serialises")
    }

    /// One run's block of `global_kNN.txt`: `Run: {run_name}`, one line per k, 50 dashes; every
    /// line newline-terminated (scDINO's `f.write(... + "\n")`).
    pub fn txt_block(&self, run_name: &str) -> String {
        let mut s = format!("Run: {run_name}\n");
        for r in &self.results {
            s.push_str(&r.txt_line());
            s.push('\n');
        }
        s.push_str(SEPARATOR);
        s.push('\n');
        s
    }
}

/// Python 3's `round(x)` for a float: nearest integer, exact halves to even.
pub fn python_round(x: f64) -> i64 {
    x.round_ties_even() as i64
}

/// Appends one run's block to `path` as scDINO's `open(path, 'a')` does, but atomically: the
/// existing content (if any) is read, the block appended, and the whole written to a temporary
/// file in the same directory that is renamed over `path`. A crash leaves either the old or the
/// new file. If the existing content does not end with a newline, one is inserted first.
pub fn append_txt(path: &Path, block: &str) -> Result<(), KnnError> {
    let mut content = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(KnnError::io(path, "reading existing results", e)),
    };
    if !content.is_empty() && !content.ends_with(b"\n") {
        content.push(b'\n');
    }
    content.extend_from_slice(block.as_bytes());
    scdino_base::fs::write_atomic(path, &content).map_err(|e| KnnError::io(path, "writing", e))
}

/// Per-k running tallies.
struct Tally {
    top1: u64,
    top2: u64,
    total: u64,
    confusion: Vec<Vec<u64>>,
}

/// Runs the evaluation (see the module documentation for the exact algorithm).
pub fn run_global_knn(input: &KnnInput, cfg: &KnnConfig) -> Result<KnnReport, KnnError> {
    check_settings(cfg)?;
    let n = input.len();
    let d = input.dim();
    // Python: int(features.shape[0] * 0.8).
    let n_train = ((n as f64 * cfg.train_fraction) as usize).min(n);
    let n_test = n - n_train;
    if n_train == 0 || n_test == 0 {
        return Err(KnnError::EmptySide {
            n,
            train: n_train,
            test: n_test,
        });
    }

    let encoder = LabelEncoder::fit(&input.labels);
    let num_classes = encoder.num_classes();
    let codes = encoder.transform(&input.labels)?;
    let order = numpy_shuffled_indices(n, cfg.seed);
    let shuffled_codes: Vec<i64> = order.iter().map(|&i| codes[i]).collect();
    let mut warnings = absent_class_warnings(&encoder.classes, &shuffled_codes, n_train);

    let k_used: Vec<usize> = cfg.ks.iter().map(|&k| k.min(n_train)).collect();
    for (&k, &ku) in cfg.ks.iter().zip(&k_used) {
        if ku < k {
            warnings.push(format!(
                "k = {k} exceeds the {n_train} training rows; clamped to {ku}"
            ));
        }
    }
    let k_max = *k_used.iter().max().expect("ks is non-empty");

    let chunk = (n_test / 100)
        .max(1)
        .min((cfg.max_chunk_elements / n_train).max(1));

    let result = tch::no_grad(|| -> Result<Vec<Tally>, KnnError> {
        let features = &input.features;
        let device = features.device();
        let order_i64: Vec<i64> = order.iter().map(|&i| i as i64).collect();
        let idx = Tensor::from_slice(&order_i64).to_device(device);
        let shuffled = features.f_index_select(0, &idx)?;
        let train = shuffled.narrow(0, 0, n_train as i64);
        let train_t = train.tr();
        let train_labels = Tensor::from_slice(&shuffled_codes[..n_train]).to_device(device);
        let test_codes = &shuffled_codes[n_train..];

        let mut tallies: Vec<Tally> = k_used
            .iter()
            .map(|_| Tally {
                top1: 0,
                top2: 0,
                total: 0,
                confusion: vec![vec![0; num_classes]; num_classes],
            })
            .collect();
        let mut start = 0;
        while start < n_test {
            let b = chunk.min(n_test - start);
            let bi = b as i64;
            let test_chunk = shuffled.narrow(0, (n_train + start) as i64, bi);
            let targets = &test_codes[start..start + b];
            let similarity = test_chunk.f_mm(&train_t)?;
            let (distances, indices) = similarity.f_topk(k_max as i64, 1, true, true)?;
            let candidates = train_labels
                .view([1, -1])
                .expand([bi, n_train as i64], false);
            let retrieved = candidates.f_gather(1, &indices, false)?;
            for (tally, &k) in tallies.iter_mut().zip(&k_used) {
                let votes = Votes {
                    distances: &distances,
                    retrieved: &retrieved,
                    k,
                    num_classes,
                    temperature: cfg.temperature,
                };
                tally.count(&votes.top_two()?, targets);
            }
            start += b;
        }
        Ok(tallies)
    })?;

    let results = result
        .into_iter()
        .zip(cfg.ks.iter().zip(&k_used))
        .map(|(t, (&k, &ku))| t.result(k, ku, &encoder.classes))
        .collect();

    Ok(KnnReport {
        n_samples: n,
        n_train,
        n_test,
        dim: d,
        seed: cfg.seed,
        temperature: cfg.temperature,
        chunk_size: chunk,
        classes: encoder.classes,
        results,
        warnings,
        checkpoint: None,
        checkpoint_epoch: None,
    })
}

fn check_settings(cfg: &KnnConfig) -> Result<(), KnnError> {
    if cfg.ks.is_empty() || cfg.ks.contains(&0) {
        return Err(KnnError::BadKs { ks: cfg.ks.clone() });
    }
    if !(cfg.temperature.is_finite() && cfg.temperature > 0.0) {
        return Err(KnnError::BadTemperature {
            temperature: cfg.temperature,
        });
    }
    if !(cfg.train_fraction > 0.0 && cfg.train_fraction < 1.0) {
        return Err(KnnError::BadTrainFraction {
            fraction: cfg.train_fraction,
        });
    }
    Ok(())
}

/// A warning for each side (training rows `..n_train`, test rows after) that lacks classes.
fn absent_class_warnings(
    classes: &[String],
    shuffled_codes: &[i64],
    n_train: usize,
) -> Vec<String> {
    let mut warnings = Vec::new();
    for (side, range) in [
        ("training", 0..n_train),
        ("test", n_train..shuffled_codes.len()),
    ] {
        let mut present = vec![false; classes.len()];
        for &c in &shuffled_codes[range] {
            present[c as usize] = true;
        }
        let missing: Vec<&str> = classes
            .iter()
            .zip(&present)
            .filter(|(_, &p)| !p)
            .map(|(c, _)| c.as_str())
            .collect();
        if !missing.is_empty() {
            warnings.push(format!("classes absent from the {side} rows: {missing:?}"));
        }
    }
    warnings
}

/// One test chunk's neighbours, voted on with `k` of them.
struct Votes<'a> {
    /// `[b, k_max]` similarities, best first.
    distances: &'a Tensor,
    /// `[b, k_max]` class codes of those neighbours.
    retrieved: &'a Tensor,
    k: usize,
    num_classes: usize,
    temperature: f64,
}

impl Votes<'_> {
    /// scDINO's weighted vote: per row, the (up to) two best classes, best first, flattened
    /// (`width` per row, see [`Tally::count`]).
    fn top_two(&self) -> Result<Vec<i64>, KnnError> {
        let (distances, retrieved) = (self.distances, self.retrieved);
        let (device, kind) = (distances.device(), distances.kind());
        let bi = distances.size()[0];
        let (ki, c) = (self.k as i64, self.num_classes as i64);
        // Contiguous [b, k] copies, so every op sees scDINO's shapes and layout.
        let dist_k = distances.narrow(1, 0, ki).contiguous();
        let nbr_k = retrieved.narrow(1, 0, ki).contiguous();
        let one_hot = Tensor::f_zeros([bi * ki, c], (kind, device))?.f_scatter_value(
            1,
            &nbr_k.view([-1, 1]),
            1.0,
        )?;
        let weights = dist_k.f_div_scalar(self.temperature)?.f_exp()?;
        let probs = one_hot
            .view([bi, -1, c])
            .f_mul(&weights.view([bi, -1, 1]))?
            .f_sum_dim_intlist(1, false, None::<Kind>)?;
        if !bool::try_from(probs.f_isfinite()?.f_all()?)? {
            return Err(KnnError::NonFiniteVotes {
                temperature: self.temperature,
            });
        }
        let (_, predictions) = probs.f_sort_stable(true, 1, true)?;
        let top = predictions
            .narrow(1, 0, self.width() as i64)
            .contiguous()
            .to_device(Device::Cpu);
        Ok(Vec::<i64>::try_from(top.view([-1]))?)
    }

    /// Classes ranked per row: two, unless k or the classes allow fewer.
    fn width(&self) -> usize {
        2.min(self.k).min(self.num_classes)
    }
}

impl Tally {
    /// Adds a chunk's rows: `top` holds each row's ranked classes (`top.len() / rows` each).
    fn count(&mut self, top: &[i64], targets: &[i64]) {
        let width = top.len() / targets.len();
        for (row, &y) in targets.iter().enumerate() {
            let ranked = &top[row * width..(row + 1) * width];
            if ranked[0] == y {
                self.top1 += 1;
            }
            if ranked.contains(&y) {
                self.top2 += 1;
            }
            self.confusion[y as usize][ranked[0] as usize] += 1;
        }
        self.total += targets.len() as u64;
    }

    /// The report of `k` (`k_used` after clamping to the training rows).
    fn result(self, k: usize, k_used: usize, classes: &[String]) -> KnnKResult {
        let per_class = class_metrics(classes, &self.confusion);
        let with_support: Vec<f64> = per_class
            .iter()
            .filter(|m| m.support > 0)
            .map(|m| m.f1)
            .collect();
        let macro_f1 = if with_support.is_empty() {
            0.0
        } else {
            with_support.iter().sum::<f64>() / with_support.len() as f64
        };
        KnnKResult {
            k,
            k_used,
            clamped: k_used < k,
            top1_correct: self.top1,
            top2_correct: self.top2,
            total: self.total,
            top1_percent: self.top1 as f64 * 100.0 / self.total as f64,
            top2_percent: self.top2 as f64 * 100.0 / self.total as f64,
            per_class,
            macro_f1,
            confusion: self.confusion,
        }
    }
}

/// Per-class precision / recall / F1 from a confusion matrix (`[true][predicted]`).
pub fn class_metrics(classes: &[String], confusion: &[Vec<u64>]) -> Vec<ClassMetrics> {
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    classes
        .iter()
        .enumerate()
        .map(|(i, class)| {
            let tp = confusion[i][i];
            let support: u64 = confusion[i].iter().sum();
            let predicted: u64 = confusion.iter().map(|row| row[i]).sum();
            let precision = ratio(tp, predicted);
            let recall = ratio(tp, support);
            let f1 = if precision + recall == 0.0 {
                0.0
            } else {
                2.0 * precision * recall / (precision + recall)
            };
            ClassMetrics {
                class: class.clone(),
                support,
                predicted,
                true_positives: tp,
                precision,
                recall,
                f1,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_round_is_half_to_even() {
        // Python: [round(x) for x in (0.5, 1.5, 2.5, 12.5, 13.5, 99.5, 100.0, 49.49999, 2.5000001)]
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (12.5, 12),
            (13.5, 14),
            (99.5, 100),
            (100.0, 100),
            (49.49999, 49),
            (2.5000001, 3),
            (87.5, 88),
            (62.5, 62),
        ];
        for (x, want) in cases {
            assert_eq!(python_round(x), want, "round({x})");
        }
    }

    #[test]
    fn label_encoder_sorts_code_points_once() {
        let labels = ["b", "a", "B", "a", "10", "9", "é"];
        let enc = LabelEncoder::fit(&labels);
        assert_eq!(enc.classes, vec!["10", "9", "B", "a", "b", "é"]);
        assert_eq!(enc.transform(&labels).unwrap(), vec![4, 3, 2, 3, 0, 1, 5]);
        assert!(enc.transform(&["zz"]).is_err());
    }

    #[test]
    fn split_lines_handles_crlf_and_final_newline() {
        let l = split_lines(b"a\r\nb\n");
        assert_eq!(l, vec![(1, &b"a"[..]), (2, &b"b"[..])]);
        assert_eq!(split_lines(b"a\n\nb").len(), 3);
        assert!(split_lines(b"").is_empty());
        assert_eq!(split_lines(b"\n"), vec![(1, &b""[..])]);
    }

    #[test]
    fn class_metrics_zero_division_is_zero() {
        let classes = vec!["a".to_string(), "b".to_string()];
        let m = class_metrics(&classes, &[vec![2, 0], vec![1, 0]]);
        assert_eq!(m[0].precision, 2.0 / 3.0);
        assert_eq!(m[0].recall, 1.0);
        assert_eq!((m[1].precision, m[1].recall, m[1].f1), (0.0, 0.0, 0.0));
    }
}
