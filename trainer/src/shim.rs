//! The C++ shim's (csrc/) error message. Every shim function returns -1 on a C++ exception and
//! keeps its message in one thread-local slot (csrc/guarded.h), so the modules binding the shim
//! (autocast, hooks, c10d, the foreach ops, CUDA graphs, TorchScript export) read it here.
use std::ffi::CStr;
use std::os::raw::c_char;

extern "C" {
    fn shim_last_error() -> *const c_char;
}

/// The message of the last shim call that failed on this thread (copied: the slot is
/// overwritten by the next failing call).
pub(crate) fn last_error() -> String {
    // SAFETY: the shim returns a pointer to a thread-local NUL-terminated string that lives
    // until the next shim call on this thread; it is copied at once.
    unsafe { CStr::from_ptr(shim_last_error()) }
        .to_string_lossy()
        .into_owned()
}
