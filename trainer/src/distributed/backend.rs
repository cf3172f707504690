//! Which c10d backend a run uses: NCCL needs both a GPU and a trainer built with the `nccl`
//! cargo feature; Gloo works everywhere. Asking for NCCL where it cannot work is an error
//! that says which of the two is missing, rather than a C++ exception from deep in c10d.
use std::fmt;

/// What the user asked for (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// NCCL when a GPU is visible and NCCL is built in, else Gloo.
    Auto,
    Gloo,
    Nccl,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Gloo,
    Nccl,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
        })
    }
}

/// Whether this trainer was built with `--features nccl`.
pub const NCCL_BUILT: bool = cfg!(feature = "nccl");

pub fn select(
    choice: BackendChoice,
    cuda_available: bool,
    nccl_built: bool,
) -> Result<Backend, String> {
    match choice {
        BackendChoice::Gloo => Ok(Backend::Gloo),
        BackendChoice::Auto if cuda_available && nccl_built => Ok(Backend::Nccl),
        BackendChoice::Auto => Ok(Backend::Gloo),
        BackendChoice::Nccl if !nccl_built => Err(
            "the NCCL backend was requested but this trainer was built without it: rebuild with `cargo build --release -p trainer --features nccl`".into(),
        ),
        BackendChoice::Nccl if !cuda_available => Err(
            "the NCCL backend was requested but CUDA is not available here (no GPU visible to libtorch); use --backend gloo".into(),
        ),
        BackendChoice::Nccl => Ok(Backend::Nccl),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BackendChoice::*;

    #[test]
    fn nccl_only_with_a_gpu_and_the_feature() {
        assert_eq!(select(Auto, true, true), Ok(Backend::Nccl));
        assert_eq!(select(Auto, false, true), Ok(Backend::Gloo));
        assert_eq!(select(Auto, true, false), Ok(Backend::Gloo));
        assert_eq!(select(Gloo, true, true), Ok(Backend::Gloo));
        assert_eq!(select(Nccl, true, true), Ok(Backend::Nccl));
        assert!(select(Nccl, true, false)
            .unwrap_err()
            .contains("--features nccl"));
        assert!(select(Nccl, false, true)
            .unwrap_err()
            .contains("CUDA is not available"));
    }
}
