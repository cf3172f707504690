//! Named tensors as safetensors bytes: the one writer behind checkpoints, feature bundles
//! and the timm export, so every file this project writes encodes tensors the same way
//! (CPU, contiguous, little-endian, the tensor's own dtype).
use std::collections::HashMap;
use tch::{Kind, Tensor};

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
