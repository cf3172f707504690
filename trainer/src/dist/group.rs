//! A safe handle on a libtorch c10d process group (Gloo on CPU, NCCL on CUDA), created by
//! rendezvous through a TCPStore. Every collective waits with the group's timeout, so a dead
//! peer becomes an error instead of a hang.
use std::ffi::{c_void, CStr, CString};
use std::os::raw::c_char;
use std::time::Duration;
use tch::Tensor;

extern "C" {
    fn c10d_last_error() -> *const c_char;
    fn c10d_group_new(
        host: *const c_char,
        port: i32,
        rank: i32,
        world: i32,
        timeout_ms: i32,
        cuda: i32,
        gloo_threads: i32,
    ) -> *mut c_void;
    fn c10d_group_free(group: *mut c_void);
    fn c10d_all_reduce(
        group: *mut c_void,
        tensors: *mut *mut c_void,
        n: i32,
        op: i32,
    ) -> *mut c_void;
    fn c10d_broadcast(group: *mut c_void, tensor: *mut c_void, root: i32) -> *mut c_void;
    fn c10d_all_gather(group: *mut c_void, output: *mut c_void, input: *mut c_void) -> *mut c_void;
    fn c10d_reduce_scatter(
        group: *mut c_void,
        output: *mut c_void,
        input: *mut c_void,
        op: i32,
    ) -> *mut c_void;
    fn c10d_barrier(group: *mut c_void) -> *mut c_void;
    fn c10d_work_wait(work: *mut c_void, timeout_ms: i32) -> i32;
    fn c10d_work_free(work: *mut c_void);
}

#[derive(Debug, thiserror::Error)]
#[error("{what}: {message}")]
pub struct DistError {
    pub what: String,
    pub message: String,
}

fn last_error(what: &str) -> DistError {
    // SAFETY: the shim keeps a thread-local NUL-terminated message; copied at once.
    let message = unsafe { CStr::from_ptr(c10d_last_error()) }
        .to_string_lossy()
        .into_owned();
    DistError {
        what: what.to_string(),
        message,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum = 0,
    Avg = 1,
    Max = 2,
    Min = 3,
    Product = 4,
}

/// One process's membership in a group of `world` processes.
pub struct ProcessGroup {
    raw: *mut c_void,
    pub rank: usize,
    pub world: usize,
    timeout: Duration,
}

// SAFETY: c10d backends are thread-safe for enqueuing collectives; we use the handle from one
// thread at a time (`&mut self` on every collective).
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Rendezvous at `host:port` (rank 0 serves the store) and build the backend. `cuda`
    /// selects NCCL (needs the `nccl` build feature) instead of Gloo.
    pub fn new(
        host: &str,
        port: u16,
        rank: usize,
        world: usize,
        timeout: Duration,
        cuda: bool,
    ) -> Result<Self, DistError> {
        let c_host = CString::new(host).map_err(|_| DistError {
            what: "rendezvous".into(),
            message: format!("host {host:?} contains a NUL byte"),
        })?;
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: valid C string and plain integers; NULL signals an error.
        let raw = unsafe {
            c10d_group_new(
                c_host.as_ptr(),
                i32::from(port),
                rank as i32,
                world as i32,
                ms,
                i32::from(cuda),
                0,
            )
        };
        if raw.is_null() {
            return Err(last_error(&format!(
                "rendezvous of rank {rank}/{world} at {host}:{port}"
            )));
        }
        Ok(Self {
            raw,
            rank,
            world,
            timeout,
        })
    }

    fn wait(&self, work: *mut c_void, what: &str) -> Result<(), DistError> {
        if work.is_null() {
            return Err(last_error(what));
        }
        let ms = self.timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `work` came from the shim and is freed exactly once here.
        let rc = unsafe { c10d_work_wait(work, ms) };
        let result = if rc == 0 {
            Ok(())
        } else {
            Err(last_error(what))
        };
        unsafe { c10d_work_free(work) };
        result
    }

    /// In-place all-reduce of each tensor (one coalesced call for several).
    pub fn all_reduce(&mut self, tensors: &mut [Tensor], op: ReduceOp) -> Result<(), DistError> {
        if tensors.is_empty() {
            return Ok(());
        }
        let mut ptrs: Vec<*mut c_void> =
            tensors.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        // SAFETY: the tensors outlive the call (we wait before returning).
        let work =
            unsafe { c10d_all_reduce(self.raw, ptrs.as_mut_ptr(), ptrs.len() as i32, op as i32) };
        self.wait(work, "all_reduce")
    }

    pub fn broadcast(&mut self, tensor: &mut Tensor, root: usize) -> Result<(), DistError> {
        // SAFETY: as above.
        let work = unsafe { c10d_broadcast(self.raw, tensor.as_ptr() as *mut c_void, root as i32) };
        self.wait(work, "broadcast")
    }

    /// `output` (world·n elements) receives every rank's `input` (n elements), rank order.
    pub fn all_gather(&mut self, output: &mut Tensor, input: &Tensor) -> Result<(), DistError> {
        // SAFETY: as above.
        let work = unsafe {
            c10d_all_gather(
                self.raw,
                output.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
            )
        };
        self.wait(work, "all_gather")
    }

    /// `output` (n elements) receives the reduction of shard `rank` of every rank's `input`.
    pub fn reduce_scatter(
        &mut self,
        output: &mut Tensor,
        input: &Tensor,
        op: ReduceOp,
    ) -> Result<(), DistError> {
        // SAFETY: as above.
        let work = unsafe {
            c10d_reduce_scatter(
                self.raw,
                output.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
                op as i32,
            )
        };
        self.wait(work, "reduce_scatter")
    }

    pub fn barrier(&mut self) -> Result<(), DistError> {
        // SAFETY: as above.
        let work = unsafe { c10d_barrier(self.raw) };
        self.wait(work, "barrier")
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: `raw` came from c10d_group_new and is freed once.
        unsafe { c10d_group_free(self.raw) }
    }
}
