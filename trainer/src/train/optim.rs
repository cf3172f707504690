//! AdamW with scDINO's two parameter groups, per-parameter gradient clipping and the
//! last-layer freeze. The update is written op for op as PyTorch's single-tensor AdamW (the
//! CPU default), so results match it bit for bit on CPU.
use crate::checkpoint::{Checkpoint, RestoreError};
use tch::{nn, Device, Kind, Tensor};

const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;

/// One trainable parameter with its AdamW state.
pub struct AdamParam {
    pub name: String,
    pub tensor: Tensor,
    /// scDINO group 0 ("regularized"): not a bias and more than one dimension. Only these get
    /// weight decay; `pos_embed` and `cls_token` are in it.
    pub decay: bool,
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
    /// Updates applied so far (PyTorch keeps one per parameter: a skipped parameter lags).
    pub step: u64,
}

pub struct AdamW {
    pub params: Vec<AdamParam>,
}

impl AdamW {
    /// The trainable variables of `vs`, sorted by name (frozen ones, e.g. `weight_g` with
    /// `norm_last_layer`, belong to no group, as in scDINO).
    pub fn new(vs: &nn::VarStore) -> Self {
        let mut named: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let params = named
            .into_iter()
            .map(|(name, tensor)| AdamParam {
                decay: !name.ends_with(".bias") && tensor.dim() > 1,
                exp_avg: tensor.zeros_like(),
                exp_avg_sq: tensor.zeros_like(),
                step: 0,
                name,
                tensor,
            })
            .collect();
        Self { params }
    }

    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.tensor.zero_grad();
        }
    }

    /// One AdamW step with `lr` for all and `weight_decay` for the regularised group.
    /// Parameters for which `frozen(name)` holds, or that have no gradient, are left
    /// untouched (scDINO sets their grad to None, which makes PyTorch skip them entirely).
    pub fn step(&mut self, lr: f64, weight_decay: f64, frozen: &dyn Fn(&str) -> bool) {
        tch::no_grad(|| {
            for p in &mut self.params {
                let grad = p.tensor.grad();
                if !grad.defined() || frozen(&p.name) {
                    continue;
                }
                let wd = if p.decay { weight_decay } else { 0.0 };
                p.step += 1;
                adamw_update(
                    &mut p.tensor,
                    &grad,
                    &mut p.exp_avg,
                    &mut p.exp_avg_sq,
                    p.step,
                    lr,
                    wd,
                );
            }
        });
    }

    /// Named state tensors for checkpoints: `{param}.exp_avg`, `{param}.exp_avg_sq`, `{param}.step`.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(self.params.len() * 3);
        for p in &self.params {
            out.push((format!("{}.exp_avg", p.name), p.exp_avg.shallow_clone()));
            out.push((
                format!("{}.exp_avg_sq", p.name),
                p.exp_avg_sq.shallow_clone(),
            ));
            out.push((
                format!("{}.step", p.name),
                Tensor::from_slice(&[p.step as i64]),
            ));
        }
        out
    }

    /// Restores what [`AdamW::state_tensors`] wrote; `get` looks a tensor up by that name.
    /// Restores the state saved under `optimizer.{name}.{exp_avg,exp_avg_sq,step}` in `ck`.
    pub fn load_state(&mut self, ck: &Checkpoint) -> Result<(), RestoreError> {
        tch::no_grad(|| {
            for p in &mut self.params {
                let name = |suffix: &str| format!("optimizer.{}.{suffix}", p.name);
                RestoreError::copy_into(ck, &name("exp_avg"), &mut p.exp_avg)?;
                RestoreError::copy_into(ck, &name("exp_avg_sq"), &mut p.exp_avg_sq)?;
                let s = ck
                    .get(&name("step"))
                    .ok_or_else(|| RestoreError::Missing(name("step")))?;
                p.step = s.int64_value(&[0]) as u64;
            }
            Ok(())
        })
    }
}

/// One AdamW update of `param` (any view: FSDP applies it to shard segments) after `step`
/// updates so far including this one, with PyTorch's single-tensor op order. Call under
/// `no_grad`.
pub fn adamw_update(
    param: &mut Tensor,
    grad: &Tensor,
    exp_avg: &mut Tensor,
    exp_avg_sq: &mut Tensor,
    step: u64,
    lr: f64,
    wd: f64,
) {
    if wd != 0.0 {
        let _ = param.g_mul_scalar_(1.0 - lr * wd);
    }
    let _ = exp_avg.lerp_(grad, 1.0 - BETA1);
    // addcmul_(grad, grad, value=1-β2) with the scalar folded into the first factor:
    // the kernel computes self + value·t1·t2 left to right, so this is identical.
    let _ = exp_avg_sq.g_mul_scalar_(BETA2);
    let _ = exp_avg_sq.addcmul_(&(grad * (1.0 - BETA2)), grad);
    let step = step as f64;
    let bias_correction1 = 1.0 - BETA1.powf(step);
    let bias_correction2 = 1.0 - BETA2.powf(step);
    let step_size = lr / bias_correction1;
    let bias_correction2_sqrt = bias_correction2.powf(0.5);
    let denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt) + EPS;
    let _ = param.addcdiv_(&(&*exp_avg * (-step_size)), &denom);
}

/// scDINO's per-parameter clipping: each gradient is scaled to norm ≤ `clip` on its own
/// (not the global norm). Returns the norms before clipping.
///
/// scDINO decides `if clip_coef < 1` on the host, two syncs per parameter; here the
/// coefficient is replaced by exactly 1 where it is not < 1 (NaN included, as that test),
/// and a multiply by 1 leaves a gradient bit for bit, so the result is the same with one
/// sync for the whole model (the norms, read at the end).
pub fn clip_gradients(params: &[AdamParam], clip: f64) -> Vec<f64> {
    tch::no_grad(|| {
        let norms: Vec<Tensor> = params
            .iter()
            .filter_map(|p| {
                let mut grad = p.tensor.grad();
                if !grad.defined() {
                    return None;
                }
                let norm = grad.norm();
                // Python evaluates `clip / (norm + 1e-6)` as reciprocal(norm + 1e-6) · clip.
                let coef = (&norm + 1e-6).reciprocal() * clip;
                let coef = coef.where_scalarother(&coef.lt(1.0), 1.0);
                let _ = grad.g_mul_(&coef);
                Some(norm)
            })
            .collect();
        if norms.is_empty() {
            return Vec::new();
        }
        let norms = Tensor::stack(&norms, 0)
            .to_kind(Kind::Double)
            .to_device(Device::Cpu);
        Vec::<f64>::try_from(&norms).expect("a vector of norms")
    })
}

/// Teacher EMA: θ_t ← m·θ_t + (1 − m)·θ_s for every parameter (frozen ones included, as
/// PyTorch's `parameters()`), matched by name. BatchNorm running statistics are buffers, not
/// parameters: the teacher keeps its own.
pub fn ema_update(teacher: &nn::VarStore, student: &nn::VarStore, momentum: f64) {
    let student_vars = student.variables();
    tch::no_grad(|| {
        for (name, mut t) in teacher.variables() {
            if name.ends_with("running_mean") || name.ends_with("running_var") {
                continue;
            }
            if let Some(s) = student_vars.get(&name) {
                let _ = t.g_mul_scalar_(momentum);
                let _ = t.g_add_(&(s.detach() * (1.0 - momentum)));
            }
        }
    });
}
