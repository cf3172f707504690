//! Named tensors as safetensors bytes: the one writer behind checkpoints, feature bundles
//! and the timm export, so every file this project writes encodes tensors the same way
//! (CPU, contiguous, little-endian, the tensor's own dtype), and the one reader of a file's
//! header alone, for the questions (which epoch, which network) that must not read hundreds of
//! MB of weights to answer.
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use tch::{Kind, Tensor};

/// Why a safetensors header could not be read (the caller names the file).
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("reading header: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Invalid(String),
}

/// The JSON header of the safetensors file at `path`: an 8-byte little-endian length, then that
/// many bytes of JSON (`{name: {dtype, shape, data_offsets}, "__metadata__": {...}}`). No
/// tensor data is read and nothing is verified; the full read does that when tensors are used.
pub fn read_header(path: &Path) -> Result<serde_json::Map<String, serde_json::Value>, HeaderError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    let size = f.metadata()?.len();
    if len > size.saturating_sub(8) || len > 100 << 20 {
        return Err(HeaderError::Invalid(format!(
            "not a safetensors file: its header length {len} does not fit the file's {size} bytes"
        )));
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header)?;
    serde_json::from_slice(&header)
        .map_err(|e| HeaderError::Invalid(format!("not a safetensors header: {e}")))
}

/// The names and shapes of the tensors a [`read_header`] header lists.
pub fn header_shapes(
    header: &serde_json::Map<String, serde_json::Value>,
) -> Result<BTreeMap<String, Vec<i64>>, HeaderError> {
    header
        .iter()
        .filter(|(n, _)| *n != "__metadata__")
        .map(|(n, v)| {
            let shape = v["shape"]
                .as_array()
                .and_then(|a| a.iter().map(|d| d.as_i64()).collect::<Option<Vec<_>>>())
                .ok_or_else(|| {
                    HeaderError::Invalid(format!("tensor {n} has no shape in the header"))
                })?;
            Ok((n.clone(), shape))
        })
        .collect()
}

/// The raw bytes of `t` (contiguous, in its own dtype); `t` must be on the CPU.
pub fn tensor_bytes(t: &Tensor) -> Vec<u8> {
    let t = t.contiguous();
    let n = t.numel();
    let mut out = vec![0u8; n * t.kind().elt_size_in_bytes()];
    t.copy_data_u8(&mut out, n);
    out
}

/// safetensors bytes of `tensors` (any device; copied to the CPU) with `metadata` in the
/// header.
pub fn serialize(
    tensors: &[(String, Tensor)],
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>, safetensors::SafeTensorError> {
    let views: Vec<(String, View)> = tensors
        .iter()
        .map(|(n, t)| {
            let t = t.detach().to_device(tch::Device::Cpu);
            (
                n.clone(),
                View {
                    bytes: tensor_bytes(&t),
                    shape: t.size().iter().map(|&d| d as usize).collect(),
                    dtype: dtype(t.kind()),
                },
            )
        })
        .collect();
    safetensors::serialize(views, &Some(metadata))
}

struct View {
    bytes: Vec<u8>,
    shape: Vec<usize>,
    dtype: safetensors::Dtype,
}

impl safetensors::View for View {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.bytes[..]).into()
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn dtype(kind: Kind) -> safetensors::Dtype {
    match kind {
        Kind::Float => safetensors::Dtype::F32,
        Kind::Double => safetensors::Dtype::F64,
        Kind::Int64 => safetensors::Dtype::I64,
        Kind::BFloat16 => safetensors::Dtype::BF16,
        Kind::Half => safetensors::Dtype::F16,
        other => panic!("tensors written as safetensors are float or int64, not {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_tensors_read_back_with_dtype_shape_bytes_and_metadata() {
        let f = Tensor::from_slice(&[1.5f32, -2.0, 3.25, 0.0, 7.0, 8.0]).reshape([2, 3]);
        let i = Tensor::from_slice(&[4i64, 5]);
        // A non-contiguous view is written in its logical order.
        let t = f.transpose(0, 1);
        let tensors = [
            ("f".to_string(), f.shallow_clone()),
            ("i".to_string(), i),
            ("t".to_string(), t.shallow_clone()),
        ];
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        let bytes = serialize(&tensors, meta.clone()).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(header.metadata(), &Some(meta));
        let f_view = st.tensor("f").unwrap();
        assert_eq!(f_view.dtype(), safetensors::Dtype::F32);
        assert_eq!(f_view.shape(), &[2, 3]);
        assert_eq!(f_view.data(), tensor_bytes(&f).as_slice());
        assert_eq!(st.tensor("i").unwrap().dtype(), safetensors::Dtype::I64);
        let t_view = st.tensor("t").unwrap();
        assert_eq!(t_view.shape(), &[3, 2]);
        let floats: Vec<f32> = t_view
            .data()
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(floats, [1.5, 0.0, -2.0, 7.0, 3.25, 8.0]);
    }
}
