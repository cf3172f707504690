//! libtorch's CUDA graphs and side streams (`csrc/cuda_graph.cpp`; tch binds neither). A graph
//! records the kernels a closure launches on a side stream once and replays them with one
//! launch; what it reads and writes are the addresses of the tensors it saw at capture, so a
//! caller copies new inputs into those tensors before [`CudaGraph::replay`] and reads the
//! outputs it captured afterwards. Built without the `cuda` feature, every entry point fails
//! with that reason ([`built_with_cuda`] says so beforehand).
use std::ffi::c_void;

extern "C" {
    fn tchx_cuda_available_in_build() -> i32;
    fn tchx_side_stream_enter(device: i32, out: *mut *mut c_void) -> i32;
    fn tchx_side_stream_leave(handle: *mut c_void) -> i32;
    fn tchx_graph_capture_begin(device: i32, out: *mut *mut c_void) -> i32;
    fn tchx_graph_capture_end(handle: *mut c_void) -> i32;
    fn tchx_graph_replay(handle: *mut c_void) -> i32;
    fn tchx_graph_free(handle: *mut c_void);
}

#[derive(Debug, thiserror::Error)]
#[error("CUDA graph: {what}: {message}")]
pub struct GraphError {
    pub what: &'static str,
    pub message: String,
}

fn check(rc: i32, what: &'static str) -> Result<(), GraphError> {
    if rc == 0 {
        return Ok(());
    }
    Err(GraphError {
        what,
        message: crate::shim::last_error(),
    })
}

/// Whether this trainer has the CUDA graph entry points (the `cuda` feature, or `nccl`).
pub fn built_with_cuda() -> bool {
    // SAFETY: a constant of the shim.
    unsafe { tchx_cuda_available_in_build() == 1 }
}

/// Runs `f` with a side stream of `device` current (it first waits for the current stream, and
/// the current stream waits for it afterwards): PyTorch's warm-up before a capture, so lazy
/// initialisations (cuBLAS handles, autograd's device threads) happen outside it.
pub fn on_side_stream<T>(device: usize, f: impl FnOnce() -> T) -> Result<T, GraphError> {
    let mut handle: *mut c_void = std::ptr::null_mut();
    // SAFETY: writes a new handle into `handle` on success.
    check(
        unsafe { tchx_side_stream_enter(device as i32, &mut handle) },
        "side stream",
    )?;
    struct Leave(*mut c_void);
    impl Drop for Leave {
        fn drop(&mut self) {
            // SAFETY: the handle from enter, left once (also when `f` unwinds).
            let _ = unsafe { tchx_side_stream_leave(self.0) };
        }
    }
    let leave = Leave(handle);
    let out = f();
    std::mem::forget(leave);
    // SAFETY: as in Drop, once.
    check(unsafe { tchx_side_stream_leave(handle) }, "side stream")?;
    Ok(out)
}

/// One captured graph and its private memory pool (freed on drop).
pub struct CudaGraph {
    handle: *mut c_void,
}

impl CudaGraph {
    /// Captures what `f` launches on `device` (nothing runs: replay to execute it). `f` must
    /// not synchronise with the host (no `.item()`, no copy to the CPU, no copy from pageable
    /// host memory) and must allocate only on the capturing stream.
    pub fn capture<T>(device: usize, f: impl FnOnce() -> T) -> Result<(Self, T), GraphError> {
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes a new graph handle into `handle` on success.
        check(
            unsafe { tchx_graph_capture_begin(device as i32, &mut handle) },
            "capture begin",
        )?;
        // Owned from here: a panic in `f` ends the capture and frees the graph in drop.
        let graph = Self { handle };
        let out = f();
        // SAFETY: the handle from capture_begin, ended once.
        check(
            unsafe { tchx_graph_capture_end(graph.handle) },
            "capture end",
        )?;
        Ok((graph, out))
    }

    /// Launches the captured work on the current stream (asynchronously).
    pub fn replay(&self) -> Result<(), GraphError> {
        // SAFETY: a live, ended capture.
        check(unsafe { tchx_graph_replay(self.handle) }, "replay")
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: the handle from capture_begin, freed once.
        unsafe { tchx_graph_free(self.handle) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_cuda_feature_capture_fails_with_the_reason() {
        assert_eq!(built_with_cuda(), cfg!(feature = "cuda"));
        if !built_with_cuda() {
            let e = CudaGraph::capture(0, || ())
                .err()
                .expect("no CUDA in this build");
            assert!(e.to_string().contains("--features cuda"), "{e}");
            let e = on_side_stream(0, || ()).unwrap_err();
            assert!(e.to_string().contains("built without CUDA"), "{e}");
        }
    }
}
