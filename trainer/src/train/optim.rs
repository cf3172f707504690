//! AdamW with scDINO's two parameter groups, per-parameter gradient clipping and the
//! last-layer freeze, each as multi-tensor ops (`foreach.rs`): the update is PyTorch's
//! `foreach` AdamW op for op (its default on CUDA), and on CPU within float rounding of the
//! single-tensor loop scDINO runs there.
use crate::checkpoint::{Checkpoint, RestoreError};
use crate::foreach::{self, AdamwGroup};
use tch::{nn, Device, Kind, Tensor};

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

    /// One AdamW step with `lr` for all and `weight_decay` for the regularised group, each
    /// group as one multi-tensor update (PyTorch's `foreach` AdamW). Parameters for which
    /// `frozen(name)` holds, or that have no gradient, are left untouched (scDINO sets their
    /// grad to None, which makes PyTorch skip them entirely).
    pub fn step(&mut self, lr: f64, weight_decay: f64, frozen: &dyn Fn(&str) -> bool) {
        tch::no_grad(|| {
            let [plain, decayed] = self.groups(frozen);
            plain.update(lr, 0.0);
            decayed.update(lr, weight_decay);
        });
        self.advance(frozen);
    }

    /// The parameters the next update changes (those with a gradient, not `frozen`), as the
    /// plain and the regularised group, each with its update count including that update.
    pub fn groups(&self, frozen: &dyn Fn(&str) -> bool) -> [AdamwGroup; 2] {
        let mut groups = [AdamwGroup::default(), AdamwGroup::default()];
        for p in &self.params {
            if !p.tensor.grad().defined() || frozen(&p.name) {
                continue;
            }
            groups[usize::from(p.decay)].push(
                p.tensor.shallow_clone(),
                p.tensor.grad(),
                p.exp_avg.shallow_clone(),
                p.exp_avg_sq.shallow_clone(),
                p.step + 1,
            );
        }
        groups
    }

    /// Counts the update [`AdamW::groups`] describes (after it ran, here or in a replayed
    /// CUDA graph).
    pub fn advance(&mut self, frozen: &dyn Fn(&str) -> bool) {
        for p in &mut self.params {
            if p.tensor.grad().defined() && !frozen(&p.name) {
                p.step += 1;
            }
        }
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

/// scDINO's per-parameter clipping: each gradient is scaled to norm ≤ `clip` on its own
/// (not the global norm). Returns the norms before clipping.
///
/// scDINO decides `if clip_coef < 1` on the host, two syncs per parameter; here the
/// coefficient is replaced by exactly 1 where it is not < 1 (NaN included, as that test),
/// and a multiply by 1 leaves a gradient bit for bit, so the result is the same with one
/// sync for the whole model (the norms, read at the end), and the norms are one multi-tensor
/// op.
pub fn clip_gradients(params: &[AdamParam], clip: f64) -> Vec<f64> {
    tch::no_grad(|| {
        let grads: Vec<Tensor> = params
            .iter()
            .map(|p| p.tensor.grad())
            .filter(Tensor::defined)
            .collect();
        if grads.is_empty() {
            return Vec::new();
        }
        let norms = foreach::clip_per_tensor(&grads, clip)
            .to_kind(Kind::Double)
            .to_device(Device::Cpu);
        Vec::<f64>::try_from(&norms).expect("a vector of norms")
    })
}

/// Teacher EMA: θ_t ← m·θ_t + (1 − m)·θ_s for every parameter (frozen ones included, as
/// PyTorch's `parameters()`), matched by name, as one multi-tensor update. BatchNorm running
/// statistics are buffers, not parameters: the teacher keeps its own.
pub fn ema_update(teacher: &nn::VarStore, student: &nn::VarStore, momentum: f64) {
    let (t, s) = ema_pairs(teacher, student);
    tch::no_grad(|| foreach::ema(&t, &s, momentum));
}

/// The teacher's parameters and the student's (detached) they follow, matched by name.
pub fn ema_pairs(teacher: &nn::VarStore, student: &nn::VarStore) -> (Vec<Tensor>, Vec<Tensor>) {
    let student_vars = student.variables();
    let (mut t, mut s) = (Vec::new(), Vec::new());
    for (name, tv) in teacher.variables() {
        if name.ends_with("running_mean") || name.ends_with("running_var") {
            continue;
        }
        if let Some(sv) = student_vars.get(&name) {
            t.push(tv);
            s.push(sv.detach());
        }
    }
    (t, s)
}
