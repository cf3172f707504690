//! PyTorch `.pth` checkpoints (the `torch.save` zip format, torch >= 1.6) read without Python:
//! scDINO/DINO training checkpoints (`student`, `teacher`, `optimizer`, `epoch`, `args`,
//! `dino_loss`) and bare state dicts such as DINO's released weights.
//!
//! The archive holds `{root}/data.pkl` (the object tree, pickled) and one `{root}/data/{key}`
//! record per storage. We unpickle the tree without running code, and read a storage only
//! when one of its tensors is asked for.
mod pickle;
mod value;
mod zip;

pub use pickle::PickleError;
pub use value::{DType, Object, StorageRef, TensorRef, Value};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::Tensor;

#[derive(Debug, thiserror::Error)]
pub enum PthError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: legacy (pre-1.6, non-zip) torch.save format is not supported; re-save it with torch>=1.6: torch.save(torch.load(f, weights_only=False), f)")]
    Legacy { path: PathBuf },
    #[error(
        "{path}: not a PyTorch checkpoint (neither a torch.save zip archive nor a legacy pickle)"
    )]
    NotPth { path: PathBuf },
    #[error("{path}: damaged checkpoint: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{path}: {record}: {source}")]
    Pickle {
        path: PathBuf,
        record: String,
        #[source]
        source: PickleError,
    },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
}

/// What the first bytes of a checkpoint file say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `torch.save` zip archive (torch >= 1.6), or any other zip.
    Zip,
    /// A bare pickle: `torch.save(..., _use_new_zipfile_serialization=False)` or torch < 1.6.
    LegacyPickle,
    Other,
}

/// Sniffs the format from the magic bytes (extensions lie: `.pth`, `.pt`, `.tar` all occur).
pub fn sniff(path: &Path) -> Result<FileKind, PthError> {
    use std::io::Read;
    let mut head = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(|source| PthError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let n = f.read(&mut head).map_err(|source| PthError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(match &head[..n] {
        [b'P', b'K', 3, 4] | [b'P', b'K', 5, 6] => FileKind::Zip,
        [0x80, 2..=5, ..] => FileKind::LegacyPickle,
        _ => FileKind::Other,
    })
}

/// An opened checkpoint: the unpickled object tree and the archive its storages live in.
pub struct PthFile {
    pub path: PathBuf,
    root: Value,
    archive: std::cell::RefCell<zip::ZipArchive>,
    /// The archive's top folder, e.g. `checkpoint/`.
    prefix: String,
    big_endian: bool,
    /// Storages already read, by key: views of one storage share its bytes.
    storages: std::cell::RefCell<HashMap<String, Tensor>>,
}

impl PthFile {
    pub fn open(path: &Path) -> Result<Self, PthError> {
        match sniff(path)? {
            FileKind::Zip => {}
            FileKind::LegacyPickle => {
                return Err(PthError::Legacy {
                    path: path.to_path_buf(),
                })
            }
            FileKind::Other => {
                return Err(PthError::NotPth {
                    path: path.to_path_buf(),
                })
            }
        }
        let mut archive = zip::ZipArchive::open(path)?;
        let pkl = archive
            .names()
            .iter()
            .find(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
            .cloned()
            .ok_or_else(|| PthError::Invalid {
                path: path.to_path_buf(),
                what: "a zip archive without `*/data.pkl`: not a torch.save checkpoint (a TorchScript archive?)".into(),
            })?;
        let prefix = pkl.trim_end_matches("data.pkl").to_string();
        let big_endian = if archive.contains(&format!("{prefix}byteorder")) {
            match archive.read(&format!("{prefix}byteorder"))?.as_slice() {
                b"little" => false,
                b"big" => true,
                other => {
                    return Err(PthError::Invalid {
                        path: path.to_path_buf(),
                        what: format!("byteorder record says {:?}", String::from_utf8_lossy(other)),
                    })
                }
            }
        } else {
            // Writers before the byteorder record existed were little-endian machines.
            false
        };
        let bytes = archive.read(&pkl)?;
        let root = pickle::unpickle(&bytes).map_err(|source| PthError::Pickle {
            path: path.to_path_buf(),
            record: pkl.clone(),
            source,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            root,
            archive: std::cell::RefCell::new(archive),
            prefix,
            big_endian,
            storages: Default::default(),
        })
    }

    /// The object `torch.save` was given.
    pub fn root(&self) -> &Value {
        &self.root
    }

    fn invalid(&self, what: String) -> PthError {
        PthError::Invalid {
            path: self.path.clone(),
            what,
        }
    }

    fn storage(&self, s: &StorageRef) -> Result<Tensor, PthError> {
        if let Some(t) = self.storages.borrow().get(&s.key) {
            return Ok(t.shallow_clone());
        }
        let record = format!("{}data/{}", self.prefix, s.key);
        let mut bytes = self.archive.borrow_mut().read(&record)?;
        let elt = s.dtype.size();
        let want = s.numel.checked_mul(elt as u64);
        if want != Some(bytes.len() as u64) {
            return Err(PthError::Corrupt {
                path: self.path.clone(),
                reason: format!(
                    "record {record:?} holds {} bytes but its {} {:?} elements need {}",
                    bytes.len(),
                    s.numel,
                    s.dtype,
                    s.numel * elt as u64
                ),
            });
        }
        if self.big_endian && elt > 1 {
            for chunk in bytes.chunks_exact_mut(elt) {
                chunk.reverse();
            }
        }
        let t = Tensor::f_from_data_size(&bytes, &[s.numel as i64], s.dtype.kind())
            .map_err(|e| self.invalid(format!("record {record:?}: {e}")))?;
        self.storages
            .borrow_mut()
            .insert(s.key.clone(), t.shallow_clone());
        Ok(t)
    }

    /// Materialises `t` as a contiguous CPU tensor of its own dtype, honouring its storage
    /// offset and strides (views saved through a shared storage come out as the view).
    pub fn tensor(&self, t: &TensorRef) -> Result<Tensor, PthError> {
        if t.size.iter().any(|&d| d < 0) || t.stride.iter().any(|&s| s < 0) || t.offset < 0 {
            return Err(self.invalid(format!(
                "tensor with negative size/stride/offset: size {:?} stride {:?} offset {}",
                t.size, t.stride, t.offset
            )));
        }
        let empty = t.size.contains(&0);
        // The last element a view touches must lie inside its storage.
        let last = t
            .size
            .iter()
            .zip(&t.stride)
            .try_fold(t.offset, |acc, (&n, &s)| {
                acc.checked_add((n - 1).max(0).checked_mul(s)?)
            });
        if !empty && last.is_none_or(|l| l as u64 >= t.storage.numel) {
            return Err(self.invalid(format!(
                "tensor of size {:?}, stride {:?}, offset {} reaches past its storage {:?} of {} elements",
                t.size, t.stride, t.offset, t.storage.key, t.storage.numel
            )));
        }
        let base = self.storage(&t.storage)?;
        if empty {
            return Ok(Tensor::zeros(
                &t.size,
                (t.storage.dtype.kind(), tch::Device::Cpu),
            ));
        }
        base.f_as_strided(&t.size, &t.stride, Some(t.offset))
            .and_then(|v| v.f_contiguous())
            .map_err(|e| self.invalid(format!("tensor of size {:?}: {e}", t.size)))
    }

    /// The tensors of a state dict (a dict whose values are tensors; other entries skipped).
    pub fn tensors_of(&self, dict: &Value) -> Vec<(String, TensorRef)> {
        dict.dict_items()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.as_tensor()?.clone())))
            .collect()
    }
}

/// The `args` of an scDINO checkpoint (`argparse.Namespace`), as far as a report needs it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TrainingArgs {
    pub arch: Option<String>,
    pub patch_size: Option<i64>,
    /// As pickled: ints or digit strings, rendered as text.
    pub selected_channels: Option<String>,
    /// Every attribute, rendered briefly (`name` -> repr), in pickle order.
    pub all: Vec<(String, String)>,
}

impl TrainingArgs {
    /// Reads a pickled `argparse.Namespace` (or a plain dict, as some forks save).
    pub fn from_value(v: &Value) -> Option<Self> {
        let state = match v {
            Value::Object(o) => o.borrow().state.clone()?,
            Value::Dict(_) => v.clone(),
            _ => return None,
        };
        let all: Vec<(String, String)> = state
            .dict_items()?
            .into_iter()
            .map(|(k, v)| (k, v.short_repr()))
            .collect();
        Some(Self {
            arch: state
                .get("arch")
                .and_then(|a| a.as_str().map(str::to_string)),
            patch_size: state.get("patch_size").and_then(|p| p.as_int()),
            selected_channels: state.get("selected_channels").map(|s| match s.items() {
                Some(items) => items
                    .iter()
                    .map(|i| match i {
                        Value::Str(s) => s.clone(),
                        other => other.short_repr(),
                    })
                    .collect::<Vec<_>>()
                    .join(","),
                None => s.as_str().map(str::to_string).unwrap_or(s.short_repr()),
            }),
            all,
        })
    }

    /// `arch=vit_small patch_size=16 selected_channels=0,1,2`.
    pub fn summary(&self) -> String {
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "?".into());
        format!(
            "arch={} patch_size={} selected_channels={}",
            opt(&self.arch),
            self.patch_size.map(|p| p.to_string()).unwrap_or("?".into()),
            opt(&self.selected_channels)
        )
    }
}
