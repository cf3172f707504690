//! Which device a process trains on (`train.device`).
//!
//! A GPU process uses the GPU numbered by its local rank, as torchrun and scDINO's
//! `init_distributed_mode` do (`torch.cuda.set_device(args.gpu)`), so one Slurm task or one
//! `trainer launch` rank per GPU needs no further setting. The choice is resolved once, at the
//! start, from facts passed in (not read here), so the rules are tested on a machine without a
//! GPU and the CPU path runs the very same code.
use tch::Device;

pub use scdino_config::DeviceChoice;

/// What libtorch can see in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaFacts {
    /// `torch.cuda.device_count()`; 0 without a GPU, and also in a trainer built without the
    /// `nccl` feature, whose binary does not load libtorch_cuda at all.
    pub devices: usize,
    pub cuda_built: bool,
}

impl CudaFacts {
    /// This process's view.
    pub fn probe() -> Self {
        Self {
            devices: if tch::Cuda::is_available() {
                tch::Cuda::device_count().max(0) as usize
            } else {
                0
            },
            cuda_built: crate::distributed::backend::NCCL_BUILT,
        }
    }
}

/// Why the configured device cannot be used, with what to check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// `setting` names what asked for the GPU (`train.device`, `--device`).
    #[error("{setting} is cuda but this trainer was built without CUDA: rebuild with `cargo build --release -p trainer --features nccl` (it links libtorch_cuda)")]
    NotBuiltWithCuda { setting: &'static str },
    #[error("{setting} is cuda but libtorch sees no GPU in this process (check the driver, CUDA_VISIBLE_DEVICES, and --gpus/--gres in the job)")]
    NoGpu { setting: &'static str },
    #[error("local rank {local_rank} has no GPU: this node shows {devices} to the process (one task per GPU; check CUDA_VISIBLE_DEVICES and --ntasks-per-node)")]
    NoGpuForRank { local_rank: usize, devices: usize },
    #[error(transparent)]
    Env(#[from] crate::distributed::env::DistEnvError),
}

impl DeviceError {
    /// The same error for a device asked for by `setting` instead of `train.device`.
    pub fn asked_by(self, setting: &'static str) -> Self {
        match self {
            Self::NotBuiltWithCuda { .. } => Self::NotBuiltWithCuda { setting },
            Self::NoGpu { .. } => Self::NoGpu { setting },
            other => other,
        }
    }
}

/// The device for the process with `local_rank`.
pub fn resolve(
    choice: DeviceChoice,
    local_rank: usize,
    facts: CudaFacts,
) -> Result<Device, DeviceError> {
    let gpu = || -> Result<Device, DeviceError> {
        if !facts.cuda_built {
            return Err(DeviceError::NotBuiltWithCuda {
                setting: "train.device",
            });
        }
        if facts.devices == 0 {
            return Err(DeviceError::NoGpu {
                setting: "train.device",
            });
        }
        if local_rank >= facts.devices {
            return Err(DeviceError::NoGpuForRank {
                local_rank,
                devices: facts.devices,
            });
        }
        Ok(Device::Cuda(local_rank))
    };
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda => gpu(),
        DeviceChoice::Auto if facts.cuda_built && facts.devices > 0 => gpu(),
        DeviceChoice::Auto => Ok(Device::Cpu),
    }
}

/// The device of this process for `choice`: its local rank (torchrun, `trainer launch` or
/// Slurm variables) picks the GPU. For the analyses, which do not set up a process group.
pub fn resolve_for_this_process(choice: DeviceChoice) -> Result<Device, DeviceError> {
    let local_rank = crate::distributed::env::DistEnv::from_process_env()?.local_rank;
    resolve(choice, local_rank, CudaFacts::probe())
}

#[cfg(test)]
mod tests {
    use super::*;
    use DeviceChoice::*;

    const NO_GPU: CudaFacts = CudaFacts {
        devices: 0,
        cuda_built: true,
    };
    const CPU_BUILD: CudaFacts = CudaFacts {
        devices: 0,
        cuda_built: false,
    };
    const FOUR: CudaFacts = CudaFacts {
        devices: 4,
        cuda_built: true,
    };

    #[test]
    fn each_rank_takes_its_local_gpu() {
        assert_eq!(resolve(Auto, 0, FOUR), Ok(Device::Cuda(0)));
        assert_eq!(resolve(Auto, 3, FOUR), Ok(Device::Cuda(3)));
        assert_eq!(resolve(Cuda, 2, FOUR), Ok(Device::Cuda(2)));
        assert_eq!(resolve(Cpu, 2, FOUR), Ok(Device::Cpu));
    }

    #[test]
    fn auto_falls_back_to_cpu_but_cuda_says_what_is_missing() {
        assert_eq!(resolve(Auto, 0, NO_GPU), Ok(Device::Cpu));
        assert_eq!(resolve(Auto, 1, CPU_BUILD), Ok(Device::Cpu));
        let e = resolve(Cuda, 0, CPU_BUILD).unwrap_err().to_string();
        assert!(e.contains("--features nccl"), "{e}");
        let e = resolve(Cuda, 0, NO_GPU).unwrap_err().to_string();
        assert!(e.contains("sees no GPU"), "{e}");
        // More tasks than GPUs on a node is an error, not two ranks on one GPU (NCCL
        // would refuse that later with a less helpful message).
        let e = resolve(Auto, 4, FOUR).unwrap_err().to_string();
        assert!(
            e.contains("local rank 4 has no GPU") && e.contains("shows 4"),
            "{e}"
        );
    }

    #[test]
    fn this_process_matches_its_build() {
        let facts = CudaFacts::probe();
        assert_eq!(facts.cuda_built, cfg!(feature = "nccl"));
        if !facts.cuda_built {
            assert_eq!(facts.devices, 0, "a CPU build must not see a GPU");
        }
    }
}
