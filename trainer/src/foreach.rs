//! The step's per-parameter loops as libtorch's multi-tensor (`_foreach_*`) ops, through the
//! C++ shim (`csrc/foreach.cpp`; tch binds none of them). On a GPU a list op costs a few
//! kernel launches for all parameters instead of several per parameter, which is what the
//! step spends its time on at ViT-S size; on CPU libtorch applies the same ops tensor by
//! tensor, so CPU and GPU run the same arithmetic and the CPU tests check it.
//!
//! The shim only fails on a programming error (tensors on different devices or of different
//! dtypes in one list), so, like tch's own ops, these panic with libtorch's message.
use std::ffi::c_void;
use tch::{Device, Kind, Tensor};

extern "C" {
    fn tchx_foreach_adamw(
        params: *const *mut c_void,
        grads: *const *mut c_void,
        exp_avgs: *const *mut c_void,
        exp_avg_sqs: *const *mut c_void,
        steps: *const f64,
        n: i64,
        lr: f64,
        weight_decay: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
    ) -> i32;
    fn tchx_foreach_ema(
        teacher: *const *mut c_void,
        student: *const *mut c_void,
        n: i64,
        momentum: f64,
    ) -> i32;
    fn tchx_foreach_clip(
        grads: *const *mut c_void,
        n: i64,
        clip: f64,
        norms_out: *mut *mut c_void,
    ) -> i32;
    fn tchx_foreach_adamw_dev(
        params: *const *mut c_void,
        grads: *const *mut c_void,
        exp_avgs: *const *mut c_void,
        exp_avg_sqs: *const *mut c_void,
        n: i64,
        decay: *mut c_void,
        step_size: *mut c_void,
        bc2_sqrt: *mut c_void,
        beta1: f64,
        beta2: f64,
        eps: f64,
    ) -> i32;
    fn tchx_foreach_ema_dev(
        teacher: *const *mut c_void,
        student: *const *mut c_void,
        n: i64,
        momentum: *mut c_void,
        rest: *mut c_void,
    ) -> i32;
    fn tchx_foreach_unscale(
        grads: *const *mut c_void,
        n: i64,
        found_inf: *mut c_void,
        inv_scale: *mut c_void,
    ) -> i32;
}

/// AdamW's constants (PyTorch's defaults, which scDINO and DINOv2 keep).
pub const BETA1: f64 = 0.9;
pub const BETA2: f64 = 0.999;
pub const EPS: f64 = 1e-8;

fn ptrs(ts: &[Tensor]) -> Vec<*mut c_void> {
    ts.iter().map(|t| t.as_ptr() as *mut c_void).collect()
}

fn check(rc: i32, what: &str) {
    if rc != 0 {
        panic!("{what}: {}", crate::shim::last_error());
    }
}

/// The tensors of one AdamW parameter group, gathered for one multi-tensor update: parameters
/// (or views of them, as FSDP's shard segments), their gradients and moments, and each one's
/// update count including this update.
#[derive(Default)]
pub struct AdamwGroup {
    params: Vec<Tensor>,
    grads: Vec<Tensor>,
    exp_avgs: Vec<Tensor>,
    exp_avg_sqs: Vec<Tensor>,
    steps: Vec<f64>,
}

impl AdamwGroup {
    pub fn push(
        &mut self,
        param: Tensor,
        grad: Tensor,
        exp_avg: Tensor,
        exp_avg_sq: Tensor,
        step: u64,
    ) {
        self.params.push(param);
        self.grads.push(grad);
        self.exp_avgs.push(exp_avg);
        self.exp_avg_sqs.push(exp_avg_sq);
        self.steps.push(step as f64);
    }

    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// One AdamW update of every tensor in the group, in place, with PyTorch's
    /// `_multi_tensor_adam` op order (decoupled weight decay `weight_decay`). Call under
    /// `no_grad`.
    pub fn update(&self, lr: f64, weight_decay: f64) {
        if self.is_empty() {
            return;
        }
        let (p, g) = (ptrs(&self.params), ptrs(&self.grads));
        let (m, v) = (ptrs(&self.exp_avgs), ptrs(&self.exp_avg_sqs));
        // SAFETY: four arrays of n live tensor handles and n step counts; the shim reads them
        // during the call only.
        let rc = unsafe {
            tchx_foreach_adamw(
                p.as_ptr(),
                g.as_ptr(),
                m.as_ptr(),
                v.as_ptr(),
                self.steps.as_ptr(),
                p.len() as i64,
                lr,
                weight_decay,
                BETA1,
                BETA2,
                EPS,
            )
        };
        check(rc, "multi-tensor AdamW");
    }
}

/// The per-step values of one AdamW group as device tensors, which a captured step reads at
/// replay: `decay` = `1 − lr·weight_decay` (0-d), and per parameter `step_size` =
/// `−lr / (1 − β1^t)` and `bc2_sqrt` = `√(1 − β2^t)` (1-D), all fp32 rounded from the host's
/// doubles as the Scalar version rounds them.
pub struct AdamwDeviceValues<'a> {
    pub decay: &'a Tensor,
    pub step_size: &'a Tensor,
    pub bc2_sqrt: &'a Tensor,
}

impl AdamwGroup {
    /// The per-parameter `(step_size, bc2_sqrt)` of this group's update with `lr`, from each
    /// parameter's step count (host arithmetic of [`AdamwGroup::update`]).
    pub fn bias_corrections(&self, lr: f64) -> (Vec<f32>, Vec<f32>) {
        self.steps
            .iter()
            .map(|&t| {
                let (bc1, bc2) = (1.0 - BETA1.powf(t), 1.0 - BETA2.powf(t));
                // `-(lr / bc1)` is the shim's `(lr / bc1) * -1.0` exactly (negation rounds nothing).
                (-(lr / bc1) as f32, bc2.powf(0.5) as f32)
            })
            .unzip()
    }

    /// [`AdamwGroup::update`] with its values read from device tensors (PyTorch's
    /// capturable AdamW), so that a CUDA graph of it replays with each step's values. Call
    /// under `no_grad`.
    pub fn update_from_device(&self, v: &AdamwDeviceValues) {
        if self.is_empty() {
            return;
        }
        let (p, g) = (ptrs(&self.params), ptrs(&self.grads));
        let (m, s) = (ptrs(&self.exp_avgs), ptrs(&self.exp_avg_sqs));
        // SAFETY: four arrays of n live tensor handles and three live tensors, read during the
        // call only.
        let rc = unsafe {
            tchx_foreach_adamw_dev(
                p.as_ptr(),
                g.as_ptr(),
                m.as_ptr(),
                s.as_ptr(),
                p.len() as i64,
                v.decay.as_ptr() as *mut c_void,
                v.step_size.as_ptr() as *mut c_void,
                v.bc2_sqrt.as_ptr() as *mut c_void,
                BETA1,
                BETA2,
                EPS,
            )
        };
        check(rc, "multi-tensor AdamW (device values)");
    }
}

/// [`ema`] with the momentum `m` and `1 − m` in 0-d fp32 device tensors. Call under `no_grad`.
pub fn ema_from_device(teacher: &[Tensor], student: &[Tensor], momentum: &Tensor, rest: &Tensor) {
    assert_eq!(teacher.len(), student.len(), "EMA lists differ in length");
    if teacher.is_empty() {
        return;
    }
    let (t, s) = (ptrs(teacher), ptrs(student));
    // SAFETY: two arrays of n live tensor handles and two live tensors, read during the call.
    let rc = unsafe {
        tchx_foreach_ema_dev(
            t.as_ptr(),
            s.as_ptr(),
            t.len() as i64,
            momentum.as_ptr() as *mut c_void,
            rest.as_ptr() as *mut c_void,
        )
    };
    check(rc, "multi-tensor EMA (device values)");
}

/// Teacher EMA over matched lists: `t ← m·t + (1 − m)·s`, rounded as scDINO's per-parameter
/// `t.mul_(m).add_((1 - m) * s)`. Call under `no_grad`.
pub fn ema(teacher: &[Tensor], student: &[Tensor], momentum: f64) {
    assert_eq!(teacher.len(), student.len(), "EMA lists differ in length");
    if teacher.is_empty() {
        return;
    }
    let (t, s) = (ptrs(teacher), ptrs(student));
    // SAFETY: two arrays of n live tensor handles, read during the call only.
    let rc = unsafe { tchx_foreach_ema(t.as_ptr(), s.as_ptr(), t.len() as i64, momentum) };
    check(rc, "multi-tensor EMA");
}

/// scDINO's per-parameter clipping of `grads` in place (each to norm ≤ `clip` on its own);
/// returns the norms before clipping as one 1-D fp32 tensor on the gradients' device, so the
/// caller reads them with one sync. Call under `no_grad`.
pub fn clip_per_tensor(grads: &[Tensor], clip: f64) -> Tensor {
    let g = ptrs(grads);
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: an array of n live tensor handles; on success the shim stores a new tensor
    // handle in `out`, owned from here on by the returned Tensor.
    let rc = unsafe { tchx_foreach_clip(g.as_ptr(), g.len() as i64, clip, &mut out) };
    check(rc, "multi-tensor clipping");
    unsafe { Tensor::from_ptr(out as *mut _) }
}

/// `GradScaler.unscale_`: every gradient multiplied by `1/scale` (fp32) in place; returns
/// whether any holds inf or NaN (one sync). Call under `no_grad`.
pub fn unscale(grads: &[Tensor], scale: f64) -> bool {
    let Some(first) = grads.first() else {
        return false;
    };
    let device: Device = first.device();
    let mut found_inf = Tensor::zeros([1], (Kind::Float, device));
    // GradScaler: `inv_scale = scale.double().reciprocal().float()`.
    let mut inv_scale = Tensor::from_slice(&[(1.0 / scale) as f32]).to_device(device);
    let g = ptrs(grads);
    // SAFETY: an array of n live tensor handles and two live 1-element tensors.
    let rc = unsafe {
        tchx_foreach_unscale(
            g.as_ptr(),
            g.len() as i64,
            found_inf.as_mut_ptr() as *mut c_void,
            inv_scale.as_mut_ptr() as *mut c_void,
        )
    };
    check(rc, "multi-tensor unscale");
    found_inf.double_value(&[0]) != 0.0
}
