//! What `trainer --version` says beyond the crate version: the libtorch this binary runs on and
//! the CUDA, cuDNN and NCCL that libtorch was built with. An image is checked with it before any
//! GPU is near (the GPU image is built and inspected on a machine without a driver), and a
//! support question starts from it, so every part comes from the loaded libraries, none from a
//! GPU: the versions are compiled into libtorch_cuda (through the C++ shim).
use std::ffi::CStr;
use std::sync::OnceLock;

extern "C" {
    fn shim_torch_version() -> *const std::os::raw::c_char;
    fn shim_cuda_build_version() -> i64;
    fn shim_cudnn_build_version() -> i64;
    fn shim_nccl_build_version() -> u64;
}

/// The libraries' versions; `None` where this build does not load the library that knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildInfo {
    pub torch: String,
    /// `CUDART_VERSION` of libtorch_cuda, e.g. 13000.
    pub cuda: Option<i64>,
    /// `CUDNN_VERSION` of libtorch_cuda, e.g. 91500.
    pub cudnn: Option<i64>,
    /// NCCL of libtorch_cuda as `(major << 32) | (minor << 16) | patch`.
    pub nccl: Option<u64>,
    /// Whether this trainer has ProcessGroupNCCL (the `nccl` feature).
    pub nccl_built: bool,
}

impl BuildInfo {
    pub fn of_this_binary() -> Self {
        // SAFETY: a pointer to a static NUL-terminated string (TORCH_VERSION).
        let torch = unsafe { CStr::from_ptr(shim_torch_version()) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: plain functions without arguments; each catches its C++ exceptions.
        let (cuda, cudnn, nccl) = unsafe {
            (
                shim_cuda_build_version(),
                shim_cudnn_build_version(),
                shim_nccl_build_version(),
            )
        };
        Self {
            torch,
            cuda: (cuda > 0).then_some(cuda),
            cudnn: (cudnn > 0).then_some(cudnn),
            nccl: (nccl > 0).then_some(nccl),
            nccl_built: crate::distributed::backend::NCCL_BUILT,
        }
    }

    /// One line: `torch 2.13.0, CUDA 13.0, cuDNN 9.15.0, NCCL 2.28.9 (nccl feature)`, or for the
    /// build without the nccl feature the reason there is no CUDA.
    pub fn line(&self) -> String {
        let cuda = match self.cuda {
            Some(v) => format!("CUDA {}.{}", v / 1000, v % 1000 / 10),
            None => "CUDA none (libtorch_cuda not linked: built without the nccl feature)".into(),
        };
        let cudnn = self.cudnn.map(|v| {
            // cuDNN 9 encodes major*10000 + minor*100 + patch, cuDNN 8 major*1000 + minor*100.
            let (major, rest) = if v >= 90000 {
                (v / 10000, v % 10000)
            } else {
                (v / 1000, v % 1000)
            };
            format!(", cuDNN {major}.{}.{}", rest / 100, rest % 100)
        });
        let nccl = match (self.nccl, self.nccl_built) {
            (Some(v), true) => format!(
                "NCCL {}.{}.{} (nccl feature)",
                v >> 32,
                (v >> 16) & 0xffff,
                v & 0xffff
            ),
            (Some(_), false) | (None, true) => "NCCL unknown".into(),
            (None, false) => "NCCL none (Gloo only)".into(),
        };
        format!(
            "torch {}, {cuda}{}, {nccl}",
            self.torch,
            cudnn.unwrap_or_default()
        )
    }
}

/// `trainer --version`'s text after the name: the crate version, then [`BuildInfo::line`].
/// Computed once, and only when clap builds the command (every parse); the shim calls are
/// constant lookups that load nothing.
pub fn long_version() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        format!(
            "{}\n{}",
            env!("CARGO_PKG_VERSION"),
            BuildInfo::of_this_binary().line()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_binary_names_its_libtorch() {
        let info = BuildInfo::of_this_binary();
        assert!(info.torch.starts_with("2."), "{info:?}");
        assert_eq!(info.nccl_built, cfg!(feature = "nccl"));
        // The build without the cuda feature (which nccl implies) does not link libtorch_cuda,
        // so it knows no CUDA.
        assert_eq!(info.cuda.is_some(), cfg!(feature = "cuda"), "{info:?}");
        assert!(long_version().contains(&format!("torch {}", info.torch)));
    }

    #[test]
    fn the_line_decodes_each_version() {
        let gpu = BuildInfo {
            torch: "2.13.0".into(),
            cuda: Some(13000),
            cudnn: Some(91500),
            nccl: Some((2 << 32) | (28 << 16) | 9),
            nccl_built: true,
        };
        assert_eq!(
            gpu.line(),
            "torch 2.13.0, CUDA 13.0, cuDNN 9.15.0, NCCL 2.28.9 (nccl feature)"
        );
        let cpu = BuildInfo {
            cuda: None,
            cudnn: None,
            nccl: None,
            nccl_built: false,
            ..gpu
        };
        assert_eq!(
            cpu.line(),
            "torch 2.13.0, CUDA none (libtorch_cuda not linked: built without the nccl feature), NCCL none (Gloo only)"
        );
        assert!(BuildInfo {
            cudnn: Some(8902),
            ..cpu
        }
        .line()
        .contains("cuDNN 8.9.2"));
    }
}
