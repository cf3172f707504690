//! Training checkpoints: one safetensors file holding student, teacher, optimizer state and
//! loss centre under PyTorch-style names, plus JSON metadata (progress, seed, the config, a
//! fingerprint of what must not change across a resume, and a SHA-256 of every tensor).
//!
//! Writes are atomic (temp file, fsync, rename, fsync of the folder). The previous
//! `checkpoint.safetensors` is kept as `checkpoint.prev.safetensors`, so a checkpoint damaged
//! after it was written (or a disk that lied) still leaves a good one to resume from.
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

pub const FORMAT: &str = "scdino-rs/1";
pub use crate::layout::{LATEST_CHECKPOINT as LATEST, PREVIOUS_CHECKPOINT as PREVIOUS};

/// Why a verified checkpoint does not fit the model it is restored into.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{0} is missing")]
    Missing(String),
    #[error("{name} has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        found: Vec<i64>,
        expected: Vec<i64>,
    },
    #[error("it was trained with {saved} but the config now gives {current}; restore those settings or start a new run (another run.name)")]
    Fingerprint { saved: String, current: String },
}

impl RestoreError {
    /// The named tensor of `ck`, checked against `expected`'s shape.
    pub fn fetch(ck: &Checkpoint, name: &str, expected: &[i64]) -> Result<Tensor, Self> {
        let t = ck
            .get(name)
            .ok_or_else(|| Self::Missing(name.to_string()))?;
        if t.size() != expected {
            return Err(Self::Shape {
                name: name.to_string(),
                found: t.size(),
                expected: expected.to_vec(),
            });
        }
        Ok(t)
    }

    /// Copies the named tensor of `ck` into `dst` (shape checked), in place: `dst` keeps its
    /// device and dtype while the checkpoint's tensors are on the CPU. Call under `no_grad`.
    pub fn copy_into(ck: &Checkpoint, name: &str, dst: &mut Tensor) -> Result<(), Self> {
        dst.copy_(&Self::fetch(ck, name, &dst.size())?);
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {context}: {source}")]
    Io {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid checkpoint: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// Progress and identity stored beside the tensors.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointMeta {
    pub format: String,
    /// Epoch to run next (epochs fully done).
    pub epoch: usize,
    /// Batches of `epoch` already done (non-zero only for a mid-epoch checkpoint).
    pub epoch_batch: usize,
    /// Global iteration to run next.
    pub iteration: usize,
    pub seed: u64,
    /// What a resume must agree on (model shape, channels); see `trainer::train::run`.
    pub fingerprint: String,
    /// The resolved config the run was started with, for the record.
    pub config_yaml: String,
    /// Mean/std the crops were normalised with, per selected channel.
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    /// Running sums of the interrupted epoch, so its `log.txt` line averages all its batches.
    #[serde(default)]
    pub epoch_totals: EpochTotals,
    /// fp16 runs: the dynamic loss scale and its growth counter.
    #[serde(default)]
    pub loss_scaler: Option<crate::precision::LossScaler>,
    /// Training checkpoints: the dataset the run trained on, one spelling per place
    /// ([`crate::config::DatasetLocation::canonical`]), so a resume on other data is refused
    /// (its sample order and schedules are this dataset's). Kept beside the fingerprint, not
    /// in it: the fingerprint is the weights' shape, compared exactly, and
    /// `--allow-new-data` relaxes only this. `None` in checkpoints written before it was
    /// recorded (they resume on any data, as they always did) and in feature bundles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
}

/// Sums behind one epoch's `log.txt` line (scDINO's MetricLogger global averages).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EpochTotals {
    pub loss: f64,
    pub lr: f64,
    pub wd: f64,
    pub steps: usize,
}

/// SHA-256 over (name, kind, shape, bytes) of every tensor in name order.
fn checksum(tensors: &[(String, Tensor)]) -> String {
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = Sha256::new();
    for (name, t) in sorted {
        h.update(name.as_bytes());
        h.update(format!("{:?}{:?}", t.kind(), t.size()).as_bytes());
        h.update(crate::tensor_file::tensor_bytes(t));
    }
    format!("{:x}", h.finalize())
}

/// Writes `tensors` and `meta` to `path` atomically.
pub fn save(
    path: &Path,
    tensors: &[(String, Tensor)],
    meta: &CheckpointMeta,
) -> Result<(), CheckpointError> {
    let mut info = HashMap::new();
    info.insert(
        "meta".to_string(),
        serde_json::to_string(meta).expect("meta serializes"),
    );
    info.insert("sha256".to_string(), checksum(tensors));
    let bytes =
        crate::tensor_file::serialize(tensors, info).map_err(|e| CheckpointError::Invalid {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    let io = |context, source| CheckpointError::Io {
        path: path.to_path_buf(),
        context,
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| io("creating folder", e))?;
    scdino_base::fs::write_atomic(path, &bytes).map_err(|e| io("writing", e))
}

/// A loaded, verified checkpoint.
pub struct Checkpoint {
    pub path: PathBuf,
    pub tensors: HashMap<String, Tensor>,
    pub meta: CheckpointMeta,
}

impl Checkpoint {
    pub fn get(&self, name: &str) -> Option<Tensor> {
        self.tensors.get(name).map(Tensor::shallow_clone)
    }
}

/// The metadata of a checkpoint, from the safetensors header alone: deciding whether training
/// is finished or which epoch a file holds must not read (and checksum) hundreds of MB of
/// weights. The tensors are not verified; [`load`] does that when they are used.
pub fn read_meta(path: &Path) -> Result<CheckpointMeta, CheckpointError> {
    let header = read_header(path)?;
    let invalid = |reason: String| CheckpointError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let meta = header
        .get("__metadata__")
        .and_then(|m| m.get("meta"))
        .and_then(|m| m.as_str())
        .ok_or_else(|| invalid("no `meta`".into()))?;
    let meta: CheckpointMeta =
        serde_json::from_str(meta).map_err(|e| invalid(format!("bad `meta`: {e}")))?;
    if meta.format != FORMAT {
        return Err(invalid(format!(
            "format {:?}, expected {FORMAT:?}",
            meta.format
        )));
    }
    Ok(meta)
}

/// A checkpoint's safetensors header ([`crate::tensor_file::read_header`]), its errors naming
/// the file.
pub fn read_header(
    path: &Path,
) -> Result<serde_json::Map<String, serde_json::Value>, CheckpointError> {
    use crate::tensor_file::HeaderError;
    crate::tensor_file::read_header(path).map_err(|e| match e {
        HeaderError::Io(source) => CheckpointError::Io {
            path: path.to_path_buf(),
            context: "reading header",
            source,
        },
        HeaderError::Invalid(reason) => CheckpointError::Invalid {
            path: path.to_path_buf(),
            reason,
        },
    })
}

/// Reads and verifies one checkpoint file (format, metadata, checksum).
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let invalid = |reason: String| CheckpointError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        context: "reading",
        source,
    })?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| invalid(e.to_string()))?;
    let (_, header) =
        safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| invalid(e.to_string()))?;
    let info = header
        .metadata()
        .clone()
        .ok_or_else(|| invalid("no metadata".into()))?;
    let meta: CheckpointMeta = serde_json::from_str(
        info.get("meta")
            .ok_or_else(|| invalid("no `meta`".into()))?,
    )
    .map_err(|e| invalid(format!("bad `meta`: {e}")))?;
    if meta.format != FORMAT {
        return Err(invalid(format!(
            "format {:?}, expected {FORMAT:?}",
            meta.format
        )));
    }
    let mut tensors = Vec::new();
    for (name, view) in st.tensors() {
        let kind = match view.dtype() {
            safetensors::Dtype::F32 => Kind::Float,
            safetensors::Dtype::F64 => Kind::Double,
            safetensors::Dtype::I64 => Kind::Int64,
            safetensors::Dtype::BF16 => Kind::BFloat16,
            safetensors::Dtype::F16 => Kind::Half,
            d => return Err(invalid(format!("{name} has unsupported dtype {d:?}"))),
        };
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        let t = Tensor::f_from_data_size(view.data(), &shape, kind)
            .map_err(|e| invalid(e.to_string()))?;
        tensors.push((name, t));
    }
    let want = info
        .get("sha256")
        .ok_or_else(|| invalid("no checksum".into()))?;
    let got = checksum(&tensors);
    if &got != want {
        return Err(invalid(format!(
            "checksum mismatch (stored {want}, computed {got}): the file is damaged"
        )));
    }
    Ok(Checkpoint {
        path: path.to_path_buf(),
        tensors: tensors.into_iter().collect(),
        meta,
    })
}

/// Writes the rolling checkpoint of `dir`, keeping the previous one as a fallback.
pub fn save_latest(
    dir: &Path,
    tensors: &[(String, Tensor)],
    meta: &CheckpointMeta,
) -> Result<(), CheckpointError> {
    let latest = dir.join(LATEST);
    if latest.exists() {
        std::fs::rename(&latest, dir.join(PREVIOUS)).map_err(|source| CheckpointError::Io {
            path: latest.clone(),
            context: "keeping the previous checkpoint",
            source,
        })?;
    }
    save(&latest, tensors, meta)
}

/// The newest checkpoint of `dir` that verifies: `checkpoint.safetensors`, else the previous
/// one, else the newest `checkpointNNNN.safetensors`. Damaged candidates are reported through
/// `warn` and skipped. `Ok(None)`: nothing to resume from.
pub fn load_latest(
    dir: &Path,
    warn: &mut dyn FnMut(String),
) -> Result<Option<Checkpoint>, CheckpointError> {
    let mut candidates = vec![dir.join(LATEST), dir.join(PREVIOUS)];
    let mut numbered: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                        n.starts_with("checkpoint0") || n.starts_with("checkpoint1")
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    numbered.sort();
    candidates.extend(numbered.into_iter().rev());
    let mut best: Option<Checkpoint> = None;
    for path in candidates.into_iter().filter(|p| p.exists()) {
        match load(&path) {
            Ok(c) => {
                if best
                    .as_ref()
                    .is_none_or(|b| c.meta.iteration > b.meta.iteration)
                {
                    best = Some(c);
                }
                // The rolling checkpoint is always the newest valid one: stop at it.
                if path.ends_with(LATEST) {
                    break;
                }
            }
            Err(e) => warn(format!("skipping damaged checkpoint: {e}")),
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(iteration: usize) -> CheckpointMeta {
        CheckpointMeta {
            format: FORMAT.into(),
            epoch: 1,
            epoch_batch: 0,
            iteration,
            seed: 40,
            fingerprint: "fp".into(),
            config_yaml: "run: {}".into(),
            mean: vec![0.5],
            std: vec![0.25],
            epoch_totals: EpochTotals::default(),
            loss_scaler: None,
            dataset: None,
        }
    }

    #[test]
    fn round_trip_and_damage_detection() {
        let dir = tempfile::tempdir().unwrap();
        let a = Tensor::randn([3, 4], (Kind::Float, tch::Device::Cpu));
        let tensors = vec![
            ("student.w".to_string(), a.shallow_clone()),
            ("optimizer.w.step".to_string(), Tensor::from_slice(&[7i64])),
        ];
        save_latest(dir.path(), &tensors, &meta(10)).unwrap();
        let c = load(&dir.path().join(LATEST)).unwrap();
        assert_eq!(c.meta, meta(10));
        assert!(c.get("student.w").unwrap().equal(&a));
        assert_eq!(c.get("optimizer.w.step").unwrap().int64_value(&[0]), 7);

        // A second save keeps the first as the fallback; damage the newest.
        save_latest(dir.path(), &tensors, &meta(20)).unwrap();
        let latest = dir.path().join(LATEST);
        let mut bytes = std::fs::read(&latest).unwrap();
        let n = bytes.len();
        bytes[n - 3] ^= 0xff;
        std::fs::write(&latest, &bytes).unwrap();
        let err = load(&latest).err().unwrap().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        // The header is intact: the metadata alone still reads, without the tensors.
        assert_eq!(read_meta(&latest).unwrap(), meta(20));
        // A cut-off header is an error naming the file, not a panic or a huge allocation.
        let cut = dir.path().join("cut.safetensors");
        std::fs::write(&cut, &bytes[..40]).unwrap();
        let err = read_meta(&cut).unwrap_err().to_string();
        assert!(
            err.contains("cut.safetensors") && err.contains("header length"),
            "{err}"
        );
        let mut warnings = vec![];
        let c = load_latest(dir.path(), &mut |w| warnings.push(w))
            .unwrap()
            .unwrap();
        assert_eq!(c.meta.iteration, 10);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(!std::fs::read_dir(dir.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".tmp")));
    }
}
