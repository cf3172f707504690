//! A safe handle on a libtorch c10d process group (Gloo on CPU, NCCL on CUDA), created by
//! rendezvous through a TCPStore. Every collective waits with the group's timeout, so a dead
//! peer becomes an error instead of a hang.
use std::collections::BTreeMap;
use std::ffi::{c_void, CString};
use std::os::raw::c_char;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tch::Tensor;

extern "C" {
    fn c10d_group_new(
        host: *const c_char,
        port: i32,
        rank: i32,
        world: i32,
        timeout_ms: i32,
        cuda: i32,
        gloo_threads: i32,
        generation: i32,
        stop: *const u8,
        stopped: *mut i32,
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
    DistError {
        what: what.to_string(),
        message: crate::shim::last_error(),
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

/// The shim's group handle, freed when the last owner (group or async handle) goes.
struct RawGroup(*mut c_void);

// SAFETY: c10d backends are thread-safe for enqueuing collectives; ranks must still enqueue
// them in the same order, which the owners guarantee by issuing from one thread.
unsafe impl Send for RawGroup {}
unsafe impl Sync for RawGroup {}

impl Drop for RawGroup {
    fn drop(&mut self) {
        // SAFETY: the pointer came from c10d_group_new and is freed once.
        unsafe { c10d_group_free(self.0) }
    }
}

/// One process's membership in a group of `world` processes.
pub struct ProcessGroup {
    raw: Arc<RawGroup>,
    pub rank: usize,
    pub world: usize,
    timeout: Duration,
}

/// A collective in flight. It keeps the tensors it reads and writes alive until it is waited
/// on: dropping it unwaited waits (ignoring errors), so the backend never writes into freed
/// memory.
pub struct Work {
    raw: *mut c_void,
    tensors: Vec<Tensor>,
    timeout: Duration,
    what: &'static str,
}

// SAFETY: a c10d work handle may be waited on from any thread.
unsafe impl Send for Work {}

impl Work {
    fn start(
        raw: *mut c_void,
        tensors: Vec<Tensor>,
        timeout: Duration,
        what: &'static str,
    ) -> Result<Self, DistError> {
        if raw.is_null() {
            return Err(last_error(what));
        }
        Ok(Self {
            raw,
            tensors,
            timeout,
            what,
        })
    }

    /// Blocks until done or the group's timeout passed; returns the tensors it used.
    pub fn wait(mut self) -> Result<Vec<Tensor>, DistError> {
        self.wait_raw()?;
        Ok(std::mem::take(&mut self.tensors))
    }

    fn wait_raw(&mut self) -> Result<(), DistError> {
        if self.raw.is_null() {
            return Ok(());
        }
        let ms = self.timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `raw` came from the shim and is freed exactly once (then nulled).
        let rc = unsafe { c10d_work_wait(self.raw, ms) };
        let result = if rc == 0 {
            Ok(())
        } else {
            Err(last_error(self.what))
        };
        unsafe { c10d_work_free(self.raw) };
        self.raw = std::ptr::null_mut();
        result
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = self.wait_raw();
    }
}

/// A cheap, sendable handle that can start collectives without blocking (used from inside
/// backward, by gradient hooks). Every rank must start them in the same order.
#[derive(Clone)]
pub struct AsyncGroup {
    raw: Arc<RawGroup>,
    timeout: Duration,
    pub rank: usize,
    pub world: usize,
}

impl AsyncGroup {
    /// Starts an in-place all-reduce of `t`.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        let mut ptrs = [t.as_ptr() as *mut c_void];
        // SAFETY: the Work keeps `t` alive until waited on.
        let work = unsafe { c10d_all_reduce(self.raw.0, ptrs.as_mut_ptr(), 1, op as i32) };
        Work::start(work, vec![t.shallow_clone()], self.timeout, "all_reduce")
    }

    /// Starts a reduce-scatter: `output` (n elements) gets shard `rank` of the reduction of
    /// every rank's `input` (world·n elements).
    pub fn reduce_scatter(
        &self,
        output: &Tensor,
        input: &Tensor,
        op: ReduceOp,
    ) -> Result<Work, DistError> {
        // SAFETY: as above.
        let work = unsafe {
            c10d_reduce_scatter(
                self.raw.0,
                output.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
                op as i32,
            )
        };
        Work::start(
            work,
            vec![output.shallow_clone(), input.shallow_clone()],
            self.timeout,
            "reduce_scatter",
        )
    }

    /// Starts an all-gather: `output` (world·n elements) gets every rank's `input` in rank order.
    pub fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<Work, DistError> {
        // SAFETY: as above.
        let work = unsafe {
            c10d_all_gather(
                self.raw.0,
                output.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
            )
        };
        Work::start(
            work,
            vec![output.shallow_clone(), input.shallow_clone()],
            self.timeout,
            "all_gather",
        )
    }
}

/// The number of the next group that `rank` creates at `host:port` in this process.
fn next_generation(host: &str, port: u16, rank: usize) -> i32 {
    static CREATED: Mutex<BTreeMap<(String, u16, usize), i32>> = Mutex::new(BTreeMap::new());
    let mut created = CREATED.lock().unwrap_or_else(|e| e.into_inner());
    let n = created.entry((host.to_string(), port, rank)).or_insert(0);
    *n += 1;
    *n - 1
}

impl ProcessGroup {
    /// Rendezvous at `host:port` (rank 0 serves the store) and build the backend. `cuda`
    /// selects NCCL (needs the `nccl` build feature) instead of Gloo.
    ///
    /// Groups are numbered in creation order per (host, port, rank), and a rank only joins
    /// the store that announces its number: ranks that create their groups in the same order
    /// (every stage of a job is entered by all ranks) can reuse one port stage after stage,
    /// even when a fast rank reaches the port while rank 0 still serves the previous stage's
    /// store. (Per rank, not per process, so ranks run as threads of one test agree too.)
    pub fn new(
        host: &str,
        port: u16,
        rank: usize,
        world: usize,
        timeout: Duration,
        cuda: bool,
    ) -> Result<Self, DistError> {
        Self::join_unless_stopped(host, port, rank, world, timeout, cuda, None)?.ok_or_else(|| {
            DistError {
                what: "rendezvous".into(),
                message: "stopped without a stop flag".into(),
            }
        })
    }

    /// [`Self::new`] that gives up when `stop` is set (a stop signal arrived while this rank
    /// waits for the others): `None` then. A multi-rank pipeline's ranks wait here for the
    /// next collective stage while rank 0 runs the single-rank ones, possibly for hours; a
    /// signal must end that wait as it ends a training step, not after the group's timeout.
    pub fn join_unless_stopped(
        host: &str,
        port: u16,
        rank: usize,
        world: usize,
        timeout: Duration,
        cuda: bool,
        stop: Option<&AtomicBool>,
    ) -> Result<Option<Self>, DistError> {
        let c_host = CString::new(host).map_err(|_| DistError {
            what: "rendezvous".into(),
            message: format!("host {host:?} contains a NUL byte"),
        })?;
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        let generation = next_generation(host, port, rank);
        let mut stopped = 0i32;
        // An AtomicBool is one byte, read by the shim with an atomic load.
        let stop_ptr = stop.map_or(std::ptr::null(), |s| s.as_ptr() as *const u8);
        // SAFETY: valid C string, plain integers, a flag that outlives the call (or NULL) and
        // an out-parameter; NULL signals an error.
        let raw = unsafe {
            c10d_group_new(
                c_host.as_ptr(),
                i32::from(port),
                rank as i32,
                world as i32,
                ms,
                i32::from(cuda),
                0,
                generation,
                stop_ptr,
                &mut stopped,
            )
        };
        if raw.is_null() {
            if stopped != 0 {
                return Ok(None);
            }
            return Err(last_error(&format!(
                "rendezvous of rank {rank}/{world} at {host}:{port}"
            )));
        }
        Ok(Some(Self {
            raw: Arc::new(RawGroup(raw)),
            rank,
            world,
            timeout,
        }))
    }

    /// A handle for starting collectives asynchronously (it shares this group).
    pub fn async_handle(&self) -> AsyncGroup {
        AsyncGroup {
            raw: self.raw.clone(),
            timeout: self.timeout,
            rank: self.rank,
            world: self.world,
        }
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
            unsafe { c10d_all_reduce(self.raw.0, ptrs.as_mut_ptr(), ptrs.len() as i32, op as i32) };
        self.wait(work, "all_reduce")
    }

    pub fn broadcast(&mut self, tensor: &mut Tensor, root: usize) -> Result<(), DistError> {
        // SAFETY: as above.
        let work =
            unsafe { c10d_broadcast(self.raw.0, tensor.as_ptr() as *mut c_void, root as i32) };
        self.wait(work, "broadcast")
    }

    /// `output` (world·n elements) receives every rank's `input` (n elements), rank order.
    pub fn all_gather(&mut self, output: &mut Tensor, input: &Tensor) -> Result<(), DistError> {
        // SAFETY: as above.
        let work = unsafe {
            c10d_all_gather(
                self.raw.0,
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
                self.raw.0,
                output.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
                op as i32,
            )
        };
        self.wait(work, "reduce_scatter")
    }

    pub fn barrier(&mut self) -> Result<(), DistError> {
        // SAFETY: as above.
        let work = unsafe { c10d_barrier(self.raw.0) };
        self.wait(work, "barrier")
    }
}
