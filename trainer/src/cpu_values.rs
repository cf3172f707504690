//! Writing a CPU tensor's values in place: the loader fills batch buffers and the profile
//! reader lays a table's feature block out row-major straight into the tensor it returns,
//! where building a `Vec` first and copying it (`Tensor::from_slice`) would cost one more
//! pass over every value.
use tch::{Device, Kind, Tensor};

/// The values of a contiguous CPU `f32` tensor whose storage no other handle is using (a
/// tensor just created by the caller, or a pooled one under `BufferPool::put`'s contract),
/// to fill in place.
pub(crate) fn values_mut(t: &mut Tensor) -> &mut [f32] {
    assert!(
        t.kind() == Kind::Float && t.device() == Device::Cpu && t.is_contiguous(),
        "values_mut wants a contiguous CPU f32 tensor"
    );
    let n = t.numel();
    if n == 0 {
        return &mut [];
    }
    // SAFETY: the tensor is contiguous f32 on the CPU with `n` elements, and by this
    // function's contract no other handle to its storage is in use; the returned slice
    // borrows `t` mutably, so the storage outlives it and nothing else aliases it.
    unsafe { std::slice::from_raw_parts_mut(t.data_ptr() as *mut f32, n) }
}
