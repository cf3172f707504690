//! Autograd hooks through the C++ shim (tch has none): a callback when a tensor's gradient is
//! computed during backward, a callback after a leaf accumulated it, plus the two storage
//! tricks FSDP needs (set a `.grad`, free and reallocate a tensor's memory in place).
//!
//! Callbacks run on the thread that executes backward (on CPU, the caller of `backward`).
//! A panic cannot unwind through libtorch's C++ frames, so a panicking callback aborts.
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use tch::Tensor;

type RawCallback = extern "C" fn(*mut c_void, i64, *mut c_void);

extern "C" {
    fn tchx_register_grad_hook(t: *mut c_void, cb: RawCallback, ctx: *mut c_void, idx: i64) -> i64;
    fn tchx_remove_grad_hook(t: *mut c_void, handle: i64) -> i32;
    fn tchx_set_post_accumulate_hook(
        t: *mut c_void,
        cb: Option<RawCallback>,
        ctx: *mut c_void,
        idx: i64,
    ) -> i32;
    fn tchx_set_grad(t: *mut c_void, g: *mut c_void) -> i32;
    fn tchx_resize_storage(t: *mut c_void, nbytes: i64) -> i32;
    fn tchx_storage_nbytes(t: *mut c_void) -> i64;
}

#[derive(Debug, thiserror::Error)]
#[error("{what}: {message}")]
pub struct HookError {
    pub what: String,
    pub message: String,
}

fn shim_error(what: impl Into<String>) -> HookError {
    HookError {
        what: what.into(),
        message: crate::shim::last_error(),
    }
}

fn check(rc: i32, what: &str) -> Result<(), HookError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(shim_error(what))
    }
}

/// What a hook callback receives: the index it was registered with, and the gradient for
/// [`HookSet::on_grad`] hooks (`None` after accumulation: read the tensor's `.grad`).
pub type Callback = dyn Fn(usize, Option<&Tensor>) + Send + Sync;

extern "C" fn trampoline(ctx: *mut c_void, idx: i64, grad: *mut c_void) {
    // SAFETY: `ctx` is the `Arc<Box<Callback>>` payload of a live HookSet (hooks are removed
    // before it is dropped); `grad` is a valid at::Tensor* for the duration of the call.
    let f = unsafe { &*(ctx as *const Box<Callback>) };
    let result = catch_unwind(AssertUnwindSafe(|| {
        let g = (!grad.is_null()).then(|| unsafe { Tensor::clone_from_ptr(grad as *mut _) });
        f(idx as usize, g.as_ref());
    }));
    if result.is_err() {
        tracing::error!("a gradient hook panicked inside backward; aborting");
        std::process::abort();
    }
}

enum Registered {
    Grad(Tensor, i64),
    PostAccumulate(Tensor),
}

/// A set of hooks sharing one callback; dropping it removes them all.
pub struct HookSet {
    callback: Arc<Box<Callback>>,
    hooks: Vec<Registered>,
}

// SAFETY: the callback is Send + Sync; the tensors are only used to remove the hooks.
unsafe impl Send for HookSet {}

impl HookSet {
    pub fn new(callback: Box<Callback>) -> Self {
        Self {
            callback: Arc::new(callback),
            hooks: Vec::new(),
        }
    }

    fn ctx(&self) -> *mut c_void {
        Arc::as_ptr(&self.callback) as *mut c_void
    }

    /// Calls back with `idx` and the gradient each time the gradient of `t` is computed.
    pub fn on_grad(&mut self, t: &Tensor, idx: usize) -> Result<(), HookError> {
        // SAFETY: `t` is a live tensor; ctx outlives the hook (removed in Drop).
        let h = unsafe {
            tchx_register_grad_hook(
                t.as_ptr() as *mut c_void,
                trampoline,
                self.ctx(),
                idx as i64,
            )
        };
        if h < 0 {
            return Err(shim_error("registering a gradient hook"));
        }
        self.hooks.push(Registered::Grad(t.shallow_clone(), h));
        Ok(())
    }

    /// Calls back with `idx` once the leaf `t` has accumulated its gradient into `.grad`.
    pub fn on_accumulated(&mut self, t: &Tensor, idx: usize) -> Result<(), HookError> {
        // SAFETY: as above.
        let rc = unsafe {
            tchx_set_post_accumulate_hook(
                t.as_ptr() as *mut c_void,
                Some(trampoline),
                self.ctx(),
                idx as i64,
            )
        };
        check(rc, "registering a post-accumulate hook")?;
        self.hooks
            .push(Registered::PostAccumulate(t.shallow_clone()));
        Ok(())
    }
}

impl Drop for HookSet {
    fn drop(&mut self) {
        for h in self.hooks.drain(..) {
            // SAFETY: the tensors are alive (we hold handles); errors are not actionable here.
            unsafe {
                match h {
                    Registered::Grad(t, handle) => {
                        tchx_remove_grad_hook(t.as_ptr() as *mut c_void, handle);
                    }
                    Registered::PostAccumulate(t) => {
                        tchx_set_post_accumulate_hook(
                            t.as_ptr() as *mut c_void,
                            None,
                            std::ptr::null_mut(),
                            0,
                        );
                    }
                }
            }
        }
    }
}

/// Sets `t.grad` (`None` drops the gradient and its memory).
pub fn set_grad(t: &Tensor, g: Option<&Tensor>) -> Result<(), HookError> {
    let gp = g.map_or(std::ptr::null_mut(), |g| g.as_ptr() as *mut c_void);
    // SAFETY: both tensors are alive for the call.
    check(
        unsafe { tchx_set_grad(t.as_ptr() as *mut c_void, gp) },
        "setting a gradient",
    )
}

/// Resizes the memory under `t` and all its views to `nbytes` without touching their shapes:
/// 0 frees it, the full size brings it back (contents undefined until written).
pub fn resize_storage(t: &Tensor, nbytes: usize) -> Result<(), HookError> {
    // SAFETY: `t` is alive; the shim checks the storage is resizable.
    check(
        unsafe { tchx_resize_storage(t.as_ptr() as *mut c_void, nbytes as i64) },
        "resizing a storage",
    )
}

/// Bytes actually allocated under `t` (0 for a freed storage, whatever its shape says).
pub fn storage_bytes(t: &Tensor) -> usize {
    if !t.defined() {
        return 0;
    }
    // SAFETY: `t` is alive.
    unsafe { tchx_storage_nbytes(t.as_ptr() as *mut c_void) }.max(0) as usize
}
