//! Distributed training on libtorch's own collectives: process groups (c10d through the C++
//! shim), rank discovery, data-parallel gradient averaging, the storage and hook tricks
//! sharding needs, the local launcher and the collectives benchmark. Nothing here knows about
//! training: the strategies that combine these with the learner live in
//! [`crate::train::strategy`].
pub mod backend;
pub mod collectives_bench;
pub mod ddp;
pub mod env;
pub mod group;
pub mod hooks;
pub mod launch;

use group::DistError;
use tch::Tensor;

/// What one training iteration needs from the other processes. One process: [`Single`].
pub trait Collective {
    fn world_size(&self) -> usize;
    /// This process's rank (0 in a world of one).
    fn rank(&self) -> usize {
        0
    }
    /// Sums `t` across processes, in place.
    fn all_reduce_sum(&mut self, t: &mut Tensor) -> Result<(), DistError>;
    /// Where this group's tensors must be: NCCL reduces CUDA tensors only, so a value made on
    /// the CPU (the stop flag, a checkpoint write's outcome) is moved here first.
    fn device(&self) -> tch::Device {
        tch::Device::Cpu
    }
    /// Called right before backward: overlapped implementations arm their gradient hooks.
    fn begin_backward(&mut self) -> Result<(), DistError> {
        Ok(())
    }
    /// Replaces every parameter's gradient by its mean across processes. `grads` are the
    /// optimizer's gradients in its order; an implementation tracking the parameters itself
    /// (overlapped DDP) writes `.grad` directly, so callers re-read `.grad` afterwards.
    fn average_gradients(&mut self, grads: &mut [Tensor]) -> Result<(), DistError>;
}

/// A world of one: every collective is the identity.
#[derive(Debug, Default, Clone, Copy)]
pub struct Single;

impl Collective for Single {
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&mut self, _: &mut Tensor) -> Result<(), DistError> {
        Ok(())
    }
    fn average_gradients(&mut self, _: &mut [Tensor]) -> Result<(), DistError> {
        Ok(())
    }
}
