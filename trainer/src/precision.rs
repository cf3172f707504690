//! Mixed precision: autocast regions (through the C++ shim, since tch's own `autocast` is
//! CUDA-only and fp16-only) and a dynamic loss scaler with `torch.cuda.amp.GradScaler`
//! semantics for fp16.
use crate::config::Precision;
use tch::{Device, Kind, Tensor};

extern "C" {
    fn shim_autocast_enter(cuda: i32, bf16: i32) -> i32;
    fn shim_autocast_exit(cuda: i32, previous: i32) -> i32;
}

/// Runs `f` under autocast for `device` when `precision` asks for it (fp32: plain call).
/// Inside, matmuls and convolutions run in bf16/fp16 while reductions stay in fp32, as
/// `torch.autocast` does.
pub fn autocast<T>(precision: Precision, device: Device, f: impl FnOnce() -> T) -> T {
    let bf16 = match precision {
        Precision::Fp32 => return f(),
        Precision::Bf16 => 1,
        Precision::Fp16 => 0,
    };
    let cuda = i32::from(device.is_cuda());
    // SAFETY: plain C calls into libtorch's thread-local autocast state; errors are reported
    // through return codes.
    let previous = unsafe { shim_autocast_enter(cuda, bf16) };
    assert!(previous >= 0, "autocast: {}", crate::shim::last_error());
    struct Exit(i32, i32);
    impl Drop for Exit {
        fn drop(&mut self) {
            // SAFETY: as above; restoring on unwind keeps the thread's state consistent.
            let rc = unsafe { shim_autocast_exit(self.0, self.1) };
            debug_assert_eq!(rc, 0, "autocast exit: {}", crate::shim::last_error());
        }
    }
    let _exit = Exit(cuda, previous);
    f()
}

/// Dynamic loss scaling, as `torch.cuda.amp.GradScaler` with its defaults: the loss is
/// multiplied by `scale` before backward; gradients are unscaled before clipping; a step
/// with any non-finite gradient is skipped and the scale halved; after `growth_interval`
/// good steps in a row the scale doubles.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossScaler {
    pub scale: f64,
    pub growth_tracker: u64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u64,
}

impl Default for LossScaler {
    fn default() -> Self {
        Self {
            scale: 65536.0,
            growth_tracker: 0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

impl LossScaler {
    pub fn scale_loss(&self, loss: &Tensor) -> Tensor {
        loss * self.scale
    }

    /// Divides every gradient by the scale in place (`GradScaler.unscale_`, in fp32:
    /// grad · (1/scale)) and reports whether any of them holds inf/NaN.
    ///
    /// One multi-tensor op (`_amp_foreach_non_finite_check_and_unscale_`, as GradScaler) with
    /// the inf/NaN flag read once: reading each tensor's flag made one host sync per
    /// parameter, which cost fp16 steps 12 % on an H200 (BENCHMARKS, "The training step on a
    /// GPU").
    pub fn unscale(&self, grads: &mut [Tensor]) -> bool {
        let defined: Vec<Tensor> = grads
            .iter()
            .filter(|g| g.defined())
            .map(Tensor::shallow_clone)
            .collect();
        tch::no_grad(|| crate::foreach::unscale(&defined, self.scale))
    }

    /// Updates the scale after a step; `found_inf` means the step was skipped.
    pub fn update(&mut self, found_inf: bool) {
        if found_inf {
            self.scale *= self.backoff_factor;
            self.growth_tracker = 0;
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == self.growth_interval {
                self.scale *= self.growth_factor;
                self.growth_tracker = 0;
            }
        }
    }
}

/// A precision the device cannot train in, with what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrecisionError {
    #[error("train.precision fp16 needs a CUDA GPU (loss-scaled half precision); use bf16 or fp32 on CPU")]
    Fp16OnCpu,
}

/// Checks that `precision` can run on `device`.
pub fn check_supported(precision: Precision, device: Device) -> Result<(), PrecisionError> {
    match (precision, device) {
        (Precision::Fp16, Device::Cpu) => Err(PrecisionError::Fp16OnCpu),
        _ => Ok(()),
    }
}

/// The dtype autocast computes matmuls in, for reporting.
pub fn compute_kind(precision: Precision) -> Kind {
    match precision {
        Precision::Fp32 => Kind::Float,
        Precision::Bf16 => Kind::BFloat16,
        Precision::Fp16 => Kind::Half,
    }
}
