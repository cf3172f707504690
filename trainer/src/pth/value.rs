//! The Python objects a torch checkpoint unpickles to, as far as we need them.
//!
//! Containers are shared (`Rc<RefCell<..>>`) because pickle's memo hands out references: a
//! dict memoized before its items are set must show those items when fetched again.
use std::cell::RefCell;
use std::rc::Rc;

/// Element type of a torch storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl DType {
    /// From a legacy typed-storage class name (`torch.FloatStorage`, ...).
    pub fn from_storage_class(name: &str) -> Option<Self> {
        Some(match name {
            "DoubleStorage" => Self::F64,
            "FloatStorage" => Self::F32,
            "HalfStorage" => Self::F16,
            "BFloat16Storage" => Self::BF16,
            "LongStorage" => Self::I64,
            "IntStorage" => Self::I32,
            "ShortStorage" => Self::I16,
            "CharStorage" => Self::I8,
            "ByteStorage" | "UntypedStorage" => Self::U8,
            "BoolStorage" => Self::Bool,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Self::F64 | Self::I64 => 8,
            Self::F32 | Self::I32 => 4,
            Self::F16 | Self::BF16 | Self::I16 => 2,
            Self::I8 | Self::U8 | Self::Bool => 1,
        }
    }

    pub fn kind(self) -> tch::Kind {
        use tch::Kind;
        match self {
            Self::F64 => Kind::Double,
            Self::F32 => Kind::Float,
            Self::F16 => Kind::Half,
            Self::BF16 => Kind::BFloat16,
            Self::I64 => Kind::Int64,
            Self::I32 => Kind::Int,
            Self::I16 => Kind::Int16,
            Self::I8 => Kind::Int8,
            Self::U8 => Kind::Uint8,
            Self::Bool => Kind::Bool,
        }
    }
}

/// A storage record of the archive (`{archive}/data/{key}`), as a persistent id names it.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageRef {
    pub key: String,
    pub dtype: DType,
    /// Elements (not bytes) in the storage.
    pub numel: u64,
}

/// A tensor as `_rebuild_tensor_v2` describes it: a strided view into a storage. The bytes
/// are read only when the tensor is materialised (see [`super::PthFile::tensor`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    pub storage: StorageRef,
    pub offset: i64,
    pub size: Vec<i64>,
    pub stride: Vec<i64>,
}

/// An instance of a class we do not model (`argparse.Namespace`, `torch.device`, ...): kept
/// with its constructor arguments and the state BUILD gave it, so nothing is lost.
#[derive(Debug, Clone)]
pub struct Object {
    pub module: String,
    pub name: String,
    pub args: Vec<Value>,
    pub state: Option<Value>,
}

#[derive(Debug, Clone)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits, little-endian two's complement as LONG1/LONG4 store it.
    BigInt(Vec<u8>),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Rc<Vec<Value>>),
    List(Rc<RefCell<Vec<Value>>>),
    /// Insertion-ordered (Python dicts and OrderedDicts alike).
    Dict(Rc<RefCell<Vec<(Value, Value)>>>),
    Set(Rc<RefCell<Vec<Value>>>),
    /// A class or function reference (`GLOBAL module name`).
    Global {
        module: String,
        name: String,
    },
    Object(Rc<RefCell<Object>>),
    Storage(StorageRef),
    Tensor(Rc<TensorRef>),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    pub fn as_tensor(&self) -> Option<&TensorRef> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The entries of a dict (string keys only; others are skipped).
    pub fn dict_items(&self) -> Option<Vec<(String, Value)>> {
        match self {
            Value::Dict(d) => Some(
                d.borrow()
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.clone())))
                    .collect(),
            ),
            _ => None,
        }
    }

    /// `self[key]` for a dict with string keys.
    pub fn get(&self, key: &str) -> Option<Value> {
        match self {
            Value::Dict(d) => d
                .borrow()
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v.clone()),
            _ => None,
        }
    }

    /// `getattr(self, name)` for an object whose state is a dict (`argparse.Namespace`).
    pub fn attr(&self, name: &str) -> Option<Value> {
        match self {
            Value::Object(o) => o.borrow().state.as_ref()?.get(name),
            _ => None,
        }
    }

    /// The elements of a list or tuple.
    pub fn items(&self) -> Option<Vec<Value>> {
        match self {
            Value::List(l) => Some(l.borrow().clone()),
            Value::Tuple(t) => Some(t.as_ref().clone()),
            _ => None,
        }
    }

    /// A short Python-like rendering for messages and reports (containers abbreviated).
    pub fn short_repr(&self) -> String {
        match self {
            Value::None => "None".into(),
            Value::Bool(b) => if *b { "True" } else { "False" }.into(),
            Value::Int(i) => i.to_string(),
            Value::BigInt(_) => "<big int>".into(),
            Value::Float(f) => format!("{f:?}"),
            Value::Str(s) => format!("{s:?}"),
            Value::Bytes(b) => format!("<{} bytes>", b.len()),
            Value::Tuple(_) | Value::List(_) => {
                let items = self.items().unwrap_or_default();
                let shown: Vec<String> = items.iter().take(8).map(Value::short_repr).collect();
                let more = if items.len() > 8 { ", ..." } else { "" };
                let (open, close) = if matches!(self, Value::Tuple(_)) {
                    ("(", ")")
                } else {
                    ("[", "]")
                };
                format!("{open}{}{more}{close}", shown.join(", "))
            }
            Value::Dict(d) => format!("<dict of {}>", d.borrow().len()),
            Value::Set(s) => format!("<set of {}>", s.borrow().len()),
            Value::Global { module, name } => format!("{module}.{name}"),
            Value::Object(o) => {
                let o = o.borrow();
                format!("<{}.{}>", o.module, o.name)
            }
            Value::Storage(s) => format!("<storage {} {:?}>", s.key, s.dtype),
            Value::Tensor(t) => format!("<tensor {:?} {:?}>", t.storage.dtype, t.size),
        }
    }
}
