//! Fully sharded data parallelism (`train.strategy: fsdp`), ZeRO-3 style on tch.
//!
//! The student's trainable parameters are grouped into *units*, from the structure the model
//! declares (`model::ModelUnits`): one per transformer block and one for everything else
//! (embeddings, final norm and the DINO head). Each unit is one flat f32 vector (parameters in
//! the declared forward order, zero-padded to a multiple of the world size) of which rank r persistently holds
//! only slice r: the student parameters, their averaged gradients, AdamW's `exp_avg` and
//! `exp_avg_sq`, and the teacher's matching parameters. Non-trainable variables (the head's
//! `weight_g` with `norm_last_layer`, BatchNorm running statistics) are tiny and stay full on
//! every rank, as with DDP.
//!
//! How the modules see full parameters: every module variable is re-pointed (`set_data`) at a
//! view of its unit's full-size buffer, and that buffer's *storage* is freed (resized to 0
//! bytes) whenever the unit is not in use and reallocated + all-gathered when it is, the trick
//! PyTorch's FSDP uses. Tensor shapes never change, so the modules and the autograd graph are
//! untouched; only the memory comes and goes.
//!
//! One step (with `reshard_after_forward`, the default):
//! 1. teacher (no grad): the non-block unit is all-gathered for the whole forward, each
//!    block by the teacher's block hooks right before its forward and freed right after;
//! 2. student forward: the non-block unit ("rest") is all-gathered first and stays gathered
//!    until its gradients are accumulated (it is used at both ends of every backbone pass).
//!    Block hooks ([`BlockHooks`]) all-gather each block right before its forward and free it
//!    right after; the backbone runs twice (global, then local crops), so twice per block.
//!    Each block forward registers gradient hooks on its output (and block 0 on its input);
//! 3. backward: the hook on the tensor between blocks b-1 and b fires once its gradient is
//!    complete: block b's backward for that use is done, so block b is freed (unless another
//!    use is in backward), and block b-1's is about to start, so block b-1 is reallocated and
//!    all-gathered into the same storage, which autograd's saved tensors view. A
//!    post-accumulate hook on each parameter counts the unit's gradients; when a unit's last
//!    gradient has been accumulated (after its last use's backward), its full gradients are
//!    flattened, a reduce-scatter starts asynchronously, and the unit's full gradients *and*
//!    full parameters are freed, while backward continues with earlier units;
//! 4. after backward: units some parameter of which got no gradient are flushed (zeros),
//!    every reduce-scatter is waited on and divided by the world size, per-parameter clipping
//!    uses norms all-reduced from the shards' partial sums, and AdamW and the teacher EMA run
//!    on the local shard segments only.
//!
//! Every rank runs the same graph, so hooks fire, and collectives are issued, in the same order
//! everywhere. Between steps a rank holds 1/N of parameters, gradients, optimizer state and
//! teacher; during a step the student parameters gathered at once are the rest unit and one
//! block (forward and backward; [`Fsdp::peak`] measures it), the teacher's rest unit and one
//! block during its forward, and full gradients of the units whose backward is in progress. Without
//! `reshard_after_forward` a block stays gathered from its first forward until its gradients
//! are accumulated: one full student from forward to backward, 1 all-gather per block instead
//! of 4.
use super::fsdp_error::FsdpError;
use crate::checkpoint::{Checkpoint, RestoreError};
use crate::distributed::group::{AsyncGroup, DistError, ProcessGroup, ReduceOp, Work};
use crate::distributed::hooks::{resize_storage, set_grad, storage_bytes, HookError, HookSet};
use crate::foreach::{self, AdamwGroup};
use crate::model::{BlockHooks, ModelUnits, UnitKind};
use crate::train::step::{Learner, StepError, StepParams};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tch::{Kind, Tensor};

/// A shim failure of the storage operation `what`.
fn storage(what: &'static str) -> impl Fn(HookError) -> FsdpError {
    move |source| FsdpError::Storage { what, source }
}

/// One trainable parameter's place in its unit.
struct Param {
    name: String,
    unit: usize,
    /// Offset and length in the unit's flat vector.
    offset: i64,
    numel: i64,
    shape: Vec<i64>,
    decay: bool,
    /// AdamW updates applied so far (identical on every rank).
    step: u64,
    student: Tensor,
    teacher: Tensor,
}

/// A flat group of parameters sharded across ranks.
struct Unit {
    name: String,
    params: Vec<usize>,
    /// Elements per rank (the unit's flat length is world · shard).
    shard: i64,
    student: Tensor,
    teacher: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// Full-size buffers the module variables view; storage freed while not in use.
    student_full: Tensor,
    teacher_full: Tensor,
    /// Gradients still to be accumulated in the current backward.
    pending: usize,
    reduce: Option<Work>,
    /// Whether `student_full` currently holds the gathered parameters.
    gathered: bool,
    /// Backward passes through this unit (one per forward use) between their pre-backward
    /// re-gather and their post-backward free.
    in_backward: usize,
}

impl Unit {
    /// The slice of the unit's flat vector rank `rank` holds, as (start, end).
    fn range(&self, rank: usize) -> (i64, i64) {
        (rank as i64 * self.shard, (rank as i64 + 1) * self.shard)
    }
}

struct Inner {
    rank: usize,
    world: usize,
    group: AsyncGroup,
    units: Vec<Unit>,
    params: Vec<Param>,
    /// Whether param i received a gradient in the current backward.
    used: Vec<bool>,
    armed: bool,
    error: Option<FsdpError>,
    /// Unit of each backbone block (`None` if the block has no trainable parameter).
    blocks: Vec<Option<usize>>,
    /// `train.fsdp_reshard_after_forward`: free a block's parameters after each forward and
    /// re-gather them before its backward (otherwise they stay gathered until its gradients
    /// are accumulated).
    reshard_after_forward: bool,
    /// The current step's pre-/post-backward hooks on block inputs and outputs.
    step_hooks: Option<HookSet>,
    in_backward: bool,
    /// During the teacher's forward: its block hooks gather and free teacher blocks.
    teacher_armed: bool,
    peak: Peak,
}

/// The most parameters held gathered at once during the last step: the student's in forward
/// (and the loss) and in backward, the teacher's in its forward; units gathered and their
/// full buffers' allocated bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peak {
    pub forward_units: usize,
    pub forward_bytes: usize,
    pub backward_units: usize,
    pub backward_bytes: usize,
    /// Teacher units gathered at once during its forward, and their bytes.
    pub teacher_units: usize,
    pub teacher_bytes: usize,
}

impl Inner {
    /// The units that are backbone blocks (gathered one at a time by the block hooks).
    fn block_units(&self) -> Vec<usize> {
        self.blocks.iter().flatten().copied().collect()
    }

    fn full_bytes(&self, u: usize) -> usize {
        self.units[u].shard as usize * self.world * 4
    }

    fn gather(&self, u: usize, teacher: bool) -> Result<(), FsdpError> {
        let unit = &self.units[u];
        let (full, shard) = if teacher {
            (&unit.teacher_full, &unit.teacher)
        } else {
            (&unit.student_full, &unit.student)
        };
        resize_storage(full, self.full_bytes(u)).map_err(storage("gather"))?;
        self.group.all_gather(full, shard)?.wait()?;
        Ok(())
    }

    /// Gathers student unit `u` unless it is gathered. After a collective failed, only
    /// reallocates (so the running forward or backward finishes on garbage instead of freed
    /// memory); the recorded error fails the step.
    fn gather_student(&mut self, u: usize) {
        if self.units[u].gathered {
            return;
        }
        self.units[u].gathered = true;
        let r = if self.error.is_some() {
            resize_storage(&self.units[u].student_full, self.full_bytes(u))
                .map_err(storage("gather"))
        } else {
            self.gather(u, false)
        };
        if let Err(e) = r {
            let _ = resize_storage(&self.units[u].student_full, self.full_bytes(u));
            self.error.get_or_insert(e);
        }
        let units = self.units.iter().filter(|u| u.gathered).count();
        let bytes = self
            .units
            .iter()
            .map(|u| storage_bytes(&u.student_full))
            .sum();
        let (pu, pb) = if self.in_backward {
            (&mut self.peak.backward_units, &mut self.peak.backward_bytes)
        } else {
            (&mut self.peak.forward_units, &mut self.peak.forward_bytes)
        };
        *pu = (*pu).max(units);
        *pb = (*pb).max(bytes);
    }

    /// Gathers teacher unit `u` (after a failed collective: only reallocates, as
    /// [`Self::gather_student`]).
    fn gather_teacher(&mut self, u: usize) {
        let r = if self.error.is_some() {
            resize_storage(&self.units[u].teacher_full, self.full_bytes(u))
                .map_err(storage("gather"))
        } else {
            self.gather(u, true)
        };
        if let Err(e) = r {
            let _ = resize_storage(&self.units[u].teacher_full, self.full_bytes(u));
            self.error.get_or_insert(e);
        }
        let held: Vec<usize> = self
            .units
            .iter()
            .map(|u| storage_bytes(&u.teacher_full))
            .filter(|&b| b > 0)
            .collect();
        self.peak.teacher_units = self.peak.teacher_units.max(held.len());
        self.peak.teacher_bytes = self.peak.teacher_bytes.max(held.iter().sum());
    }

    /// Teacher block hook: block `b`'s teacher parameters, gathered for its forward only.
    fn before_teacher_block(&mut self, b: usize) {
        if let (true, Some(&Some(u))) = (self.teacher_armed, self.blocks.get(b)) {
            self.gather_teacher(u);
        }
    }

    fn after_teacher_block(&mut self, b: usize) {
        if let (true, Some(&Some(u))) = (self.teacher_armed, self.blocks.get(b)) {
            if let Err(e) = self.free(u, true) {
                self.error.get_or_insert(e);
            }
        }
    }

    fn free_student(&mut self, u: usize) -> Result<(), FsdpError> {
        self.units[u].gathered = false;
        self.free(u, false)
    }

    /// Block hook: before block `b`'s forward, its parameters are gathered.
    fn before_block(&mut self, b: usize) {
        if let (true, Some(&Some(u))) = (self.armed, self.blocks.get(b)) {
            self.gather_student(u);
        }
    }

    /// Block hook: after block `b`'s forward on `input` giving `output`. Frees its parameters
    /// (resharding) and registers the backward hooks of this use: on `output` (boundary b+1,
    /// "block b's backward starts") and, for the first block, on `input` (boundary 0).
    fn after_block(&mut self, b: usize, input: &Tensor, output: &Tensor) {
        let Some(&Some(u)) = self.blocks.get(b) else {
            return;
        };
        if !self.armed {
            return;
        }
        if self.reshard_after_forward {
            if let Err(e) = self.free_student(u) {
                self.error.get_or_insert(e);
            }
        }
        let Some(hooks) = self.step_hooks.as_mut() else {
            return;
        };
        let mut r = Ok(());
        if output.requires_grad() {
            r = hooks.on_grad(output, b + 1);
        }
        if b == 0 && input.requires_grad() && r.is_ok() {
            r = hooks.on_grad(input, 0);
        }
        if let Err(e) = r {
            self.error.get_or_insert(storage("block hooks")(e));
        }
    }

    /// Gradient hook on the tensor between blocks `b - 1` and `b` (input of block b, output
    /// of block b-1) of one forward use: its gradient is complete, so block b's backward for
    /// this use is done (its parameters are freed once no other use is in backward) and block
    /// b-1's backward is about to start (its parameters are gathered). Free before gather:
    /// at most one block is gathered at a time in backward.
    fn on_boundary(&mut self, b: usize) {
        if !self.armed {
            return;
        }
        if let Some(&Some(u)) = self.blocks.get(b) {
            let unit = &mut self.units[u];
            unit.in_backward = unit.in_backward.saturating_sub(1);
            if unit.in_backward == 0 && self.reshard_after_forward {
                if let Err(e) = self.free_student(u) {
                    self.error.get_or_insert(e);
                }
            }
        }
        if let Some(&Some(u)) = b.checked_sub(1).and_then(|p| self.blocks.get(p)) {
            self.gather_student(u);
            self.units[u].in_backward += 1;
        }
    }

    fn free(&self, u: usize, teacher: bool) -> Result<(), FsdpError> {
        let unit = &self.units[u];
        let full = if teacher {
            &unit.teacher_full
        } else {
            &unit.student_full
        };
        resize_storage(full, 0).map_err(storage("free"))
    }

    /// Starts unit `u`'s gradient reduce-scatter and frees its full gradients and parameters.
    fn reduce_unit(&mut self, u: usize) -> Result<(), FsdpError> {
        let unit = &self.units[u];
        let flat = Tensor::zeros(
            [unit.shard * self.world as i64],
            (Kind::Float, tch::Device::Cpu),
        )
        .to_device(unit.student.device());
        tch::no_grad(|| {
            for &i in &unit.params {
                let p = &self.params[i];
                let g = p.student.grad();
                if g.defined() {
                    flat.narrow(0, p.offset, p.numel).copy_(&g.reshape([-1]));
                }
                set_grad(&p.student, None).map_err(storage("freeing a gradient"))?;
            }
            Ok::<(), FsdpError>(())
        })?;
        let work = self
            .group
            .reduce_scatter(&unit.grad, &flat, ReduceOp::Sum)?;
        self.units[u].reduce = Some(work);
        self.free_student(u)
    }

    fn on_accumulated(&mut self, i: usize) {
        if !self.armed || self.error.is_some() || self.used[i] {
            return;
        }
        self.used[i] = true;
        let u = self.params[i].unit;
        self.units[u].pending -= 1;
        if self.units[u].pending == 0 {
            if let Err(e) = self.reduce_unit(u) {
                self.error = Some(e);
            }
        }
    }

    /// (param, start in the local shard, start in the parameter, length) for every parameter
    /// segment this rank holds.
    fn local_segments(&self) -> Vec<(usize, i64, i64, i64)> {
        let mut out = vec![];
        for unit in &self.units {
            let (lo, hi) = unit.range(self.rank);
            for &i in &unit.params {
                let p = &self.params[i];
                let (a, b) = (p.offset.max(lo), (p.offset + p.numel).min(hi));
                if a < b {
                    out.push((i, a - lo, a - p.offset, b - a));
                }
            }
        }
        out
    }
}

/// The sharded state of one rank, plus the hooks driving the backward reduce-scatters.
pub struct Fsdp {
    inner: Arc<Mutex<Inner>>,
    /// Names of the variables kept full on every rank (non-trainable).
    replicated: Vec<String>,
    _hooks: HookSet,
}

/// What a rank holds between steps, in bytes (storage actually allocated).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Shards of student, teacher, gradient, exp_avg, exp_avg_sq.
    pub shards: usize,
    /// Full-size unit buffers (0 unless a unit is gathered).
    pub full_buffers: usize,
    /// Non-trainable variables kept full on every rank.
    pub replicated: usize,
}

impl Memory {
    pub fn total(&self) -> usize {
        self.shards + self.full_buffers + self.replicated
    }
}

/// The FSDP unit of a student parameter, from the model's declaration: each transformer
/// block is its own unit, every other declared unit goes into one "rest".
fn fsdp_unit_of(units: &ModelUnits, name: &str) -> String {
    match units.unit_of(name) {
        Some(u) if matches!(u.kind, UnitKind::Block(_)) => u.name.clone(),
        _ => REST.into(),
    }
}

/// What [`Fsdp::new`] reads while it shards: the learner's full state, where each trainable
/// parameter sits in its optimizer, and this rank's place in the group.
struct Sharding<'a> {
    learner: &'a Learner,
    by_name: HashMap<&'a str, usize>,
    teacher_vars: HashMap<String, Tensor>,
    rank: usize,
    world: usize,
}

impl Sharding<'_> {
    /// Unit `u` (`uname`) of `members` in forward order: its parameters appended to `params`
    /// with their offsets, this rank's shard of the flat student, teacher and both moments,
    /// and the module variables re-pointed at views of the (still allocated) full buffers.
    fn unit(
        &self,
        u: usize,
        uname: &str,
        members: &[&String],
        params: &mut Vec<Param>,
    ) -> Result<Unit, FsdpError> {
        let mut offset = 0i64;
        let mut idxs = vec![];
        for n in members {
            let ap = &self.learner.optimizer.params[self.by_name[n.as_str()]];
            let numel = ap.tensor.numel() as i64;
            let teacher = self
                .teacher_vars
                .get(n.as_str())
                .ok_or_else(|| FsdpError::NoTeacherParameter(n.to_string()))?
                .shallow_clone();
            idxs.push(params.len());
            params.push(Param {
                name: n.to_string(),
                unit: u,
                offset,
                numel,
                shape: ap.tensor.size(),
                decay: ap.decay,
                step: ap.step,
                student: ap.tensor.shallow_clone(),
                teacher,
            });
            offset += numel;
        }
        let (device, rank, world) = (self.learner.device, self.rank, self.world);
        let shard = (offset + world as i64 - 1) / world as i64;
        let flat = |get: &dyn Fn(&Param) -> Tensor| -> Tensor {
            let full = Tensor::zeros([shard * world as i64], (Kind::Float, device));
            for &i in &idxs {
                let p: &Param = &params[i];
                full.narrow(0, p.offset, p.numel)
                    .copy_(&get(p).to_kind(Kind::Float).reshape([-1]));
            }
            full.narrow(0, rank as i64 * shard, shard).copy()
        };
        let opt = |n: &str| &self.learner.optimizer.params[self.by_name[n]];
        let student = flat(&|p| p.student.detach());
        let teacher = flat(&|p| p.teacher.detach());
        let exp_avg = flat(&|p| opt(&p.name).exp_avg.shallow_clone());
        let exp_avg_sq = flat(&|p| opt(&p.name).exp_avg_sq.shallow_clone());
        let student_full = Tensor::zeros([shard * world as i64], (Kind::Float, device));
        let teacher_full = Tensor::zeros([shard * world as i64], (Kind::Float, device));
        for &i in &idxs {
            let p = &mut params[i];
            let view = |full: &Tensor| full.narrow(0, p.offset, p.numel).view(p.shape.as_slice());
            p.student.set_data(&view(&student_full));
            p.teacher.set_data(&view(&teacher_full));
        }
        Ok(Unit {
            name: uname.to_string(),
            pending: idxs.len(),
            params: idxs,
            shard,
            grad: student.zeros_like(),
            student,
            teacher,
            exp_avg,
            exp_avg_sq,
            student_full,
            teacher_full,
            reduce: None,
            gathered: false,
            in_backward: 0,
        })
    }
}

/// The unit of everything outside the blocks (embeddings, final norm, head).
const REST: &str = "rest";

impl Fsdp {
    /// Shards `learner`'s current (full, identical on every rank) student, teacher and AdamW
    /// state, re-points the module variables at freed full-size buffers and drops the full
    /// optimizer state. Call after weights were broadcast or restored.
    pub fn new(group: &ProcessGroup, learner: &mut Learner) -> Result<Self, FsdpError> {
        let (rank, world) = (group.rank, group.world);
        let teacher_vars = learner.nets.teacher_vs.variables();
        let trainable: Vec<String> = learner
            .optimizer
            .params
            .iter()
            .map(|p| p.name.clone())
            .collect();
        let replicated: Vec<String> = {
            let mut v: Vec<String> = learner
                .nets
                .student_vs
                .variables()
                .into_keys()
                .filter(|n| !trainable.contains(n))
                .collect();
            v.sort();
            v
        };
        let declared = &learner.nets.units;
        let mut names = trainable.clone();
        declared.sort_forward(&mut names)?;
        // Blocks in forward order, then the rest (the shard files' layout).
        let mut unit_names: Vec<String> = declared.blocks().map(|u| u.name.clone()).collect();
        unit_names.retain(|u| names.iter().any(|n| &fsdp_unit_of(declared, n) == u));
        if names.iter().any(|n| fsdp_unit_of(declared, n) == REST) {
            unit_names.push(REST.into());
        }
        let sharding = Sharding {
            learner: &*learner,
            by_name: learner
                .optimizer
                .params
                .iter()
                .enumerate()
                .map(|(i, p)| (p.name.as_str(), i))
                .collect(),
            teacher_vars,
            rank,
            world,
        };
        let mut params: Vec<Param> = vec![];
        let mut units: Vec<Unit> = vec![];
        tch::no_grad(|| {
            for (u, uname) in unit_names.iter().enumerate() {
                let members: Vec<&String> = names
                    .iter()
                    .filter(|n| &fsdp_unit_of(declared, n) == uname)
                    .collect();
                units.push(sharding.unit(u, uname, &members, &mut params)?);
            }
            Ok::<(), FsdpError>(())
        })?;
        learner.optimizer.params.clear();
        let blocks = learner
            .nets
            .units
            .blocks()
            .map(|b| units.iter().position(|u| u.name == b.name))
            .collect();
        let inner = Inner {
            rank,
            world,
            group: group.async_handle(),
            used: vec![false; params.len()],
            units,
            params,
            armed: false,
            error: None,
            blocks,
            reshard_after_forward: true,
            step_hooks: None,
            in_backward: false,
            teacher_armed: false,
            peak: Peak::default(),
        };
        for u in 0..inner.units.len() {
            inner.free(u, false)?;
            inner.free(u, true)?;
        }
        let students: Vec<Tensor> = inner
            .params
            .iter()
            .map(|p| p.student.shallow_clone())
            .collect();
        let inner = Arc::new(Mutex::new(inner));
        let hook_inner = inner.clone();
        let mut hooks = HookSet::new(Box::new(move |i, _| {
            hook_inner
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .on_accumulated(i);
        }));
        for (i, t) in students.iter().enumerate() {
            hooks.on_accumulated(t, i).map_err(storage("hooks"))?;
        }
        learner
            .nets
            .student
            .backbone
            .set_block_hooks(Some(Arc::new(StudentBlocks(inner.clone()))));
        learner
            .nets
            .teacher
            .backbone
            .set_block_hooks(Some(Arc::new(TeacherBlocks(inner.clone()))));
        Ok(Self {
            inner,
            replicated,
            _hooks: hooks,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `train.fsdp_reshard_after_forward` (default `true`): see [`Inner::reshard_after_forward`].
    pub fn set_reshard_after_forward(&mut self, on: bool) {
        self.lock().reshard_after_forward = on;
    }

    /// The most student parameters gathered at once during the last step.
    pub fn peak(&self) -> Peak {
        self.lock().peak
    }

    /// Unit names and their sizes (elements before padding), in unit order.
    pub fn units(&self) -> Vec<(String, i64)> {
        let g = self.lock();
        g.units
            .iter()
            .map(|u| {
                (
                    u.name.clone(),
                    u.params.iter().map(|&i| g.params[i].numel).sum(),
                )
            })
            .collect()
    }

    /// Every tensor this rank keeps between steps, by role (what the memory test measures,
    /// together with the module variables, which must all be views of freed buffers).
    pub fn memory(&self, learner: &Learner) -> Memory {
        let g = self.lock();
        let mut m = Memory::default();
        for u in &g.units {
            m.shards += [&u.student, &u.teacher, &u.grad, &u.exp_avg, &u.exp_avg_sq]
                .iter()
                .map(|t| storage_bytes(t))
                .sum::<usize>();
            m.full_buffers += storage_bytes(&u.student_full) + storage_bytes(&u.teacher_full);
        }
        for vs in [&learner.nets.student_vs, &learner.nets.teacher_vs] {
            for (n, t) in vs.variables() {
                if self.replicated.contains(&n) {
                    m.replicated += storage_bytes(&t);
                }
            }
        }
        m
    }

    /// Before the teacher's forward: the non-block unit gathered for the whole forward, each
    /// block by the teacher's block hooks for its own forward only.
    pub fn before_teacher(&mut self) -> Result<(), StepError> {
        let mut g = self.lock();
        g.error = None;
        g.peak = Peak::default();
        let blocks = g.block_units();
        for u in 0..g.units.len() {
            if !blocks.contains(&u) {
                g.gather_teacher(u);
            }
        }
        g.teacher_armed = true;
        Ok(())
    }

    /// Between the teacher's and the student's forward: the teacher freed, the student's
    /// non-block unit gathered and the backward hooks armed.
    pub fn before_student(&mut self) -> Result<(), StepError> {
        let mut g = self.lock();
        g.teacher_armed = false;
        let n_units = g.units.len();
        for u in 0..n_units {
            g.free(u, true)?;
            g.units[u].pending = g.units[u].params.len();
            g.units[u].in_backward = 0;
        }
        if let Some(e) = g.error.take() {
            return Err(e.into());
        }
        g.used.iter_mut().for_each(|x| *x = false);
        g.in_backward = false;
        // The non-block unit (embeddings, final norm, head) is needed at both ends of
        // every backbone pass: gathered now, freed when its gradients are accumulated.
        // Blocks are gathered by the block hooks, one at a time.
        let blocks = g.block_units();
        for u in 0..n_units {
            if !blocks.contains(&u) {
                g.gather_student(u);
            }
        }
        if let Some(e) = g.error.take() {
            return Err(e.into());
        }
        let hook_inner = self.inner.clone();
        g.step_hooks = Some(HookSet::new(Box::new(move |b, _| {
            hook_inner
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .on_boundary(b);
        })));
        g.armed = true;
        Ok(())
    }

    /// A collective that failed inside a block hook during the student's forward.
    pub fn after_student(&mut self) -> Result<(), StepError> {
        match self.lock().error.take() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// From the loss to updated shards: backward (the hooks reduce-scatter each unit's
    /// gradients as they complete), fp16 unscaling, clipping with norms all-reduced from the
    /// shards, AdamW and the teacher EMA on this rank's shard segments. Returns the gradient
    /// norms before clipping and whether an fp16 overflow skipped the update.
    pub fn backward_and_update(
        &mut self,
        learner: &mut Learner,
        loss: &Tensor,
        p: &StepParams,
    ) -> Result<(Vec<f64>, bool), StepError> {
        self.lock().in_backward = true;
        match &learner.scaler {
            Some(scaler) => scaler.scale_loss(loss).backward(),
            None => loss.backward(),
        }
        let mut g = self.lock();
        g.armed = false;
        if let Some(e) = g.error.take() {
            return Err(e.into());
        }
        // Units with a parameter that got no gradient, in unit order (the same on all ranks).
        for u in 0..g.units.len() {
            if g.units[u].pending > 0 {
                g.reduce_unit(u)?;
            }
        }
        let used = Tensor::from_slice(
            &g.used
                .iter()
                .map(|&f| f32::from(u8::from(f)))
                .collect::<Vec<_>>(),
        )
        .to_device(g.units[0].grad.device());
        let used_work = g.group.all_reduce(&used, ReduceOp::Sum)?;
        let world = g.world;
        for u in 0..g.units.len() {
            if let Some(w) = g.units[u].reduce.take() {
                w.wait()?;
            }
            let _ = g.units[u].grad.g_div_scalar_(world as f64);
        }
        used_work.wait()?;
        let used: Vec<bool> = Vec::<f32>::try_from(&used.to_device(tch::Device::Cpu))
            .expect("f32 vector")
            .iter()
            .zip(&g.params)
            .map(|(&c, p)| {
                let ranks = c.round() as usize;
                if ranks != 0 && ranks != world {
                    Err(FsdpError::UnevenGradients {
                        name: p.name.clone(),
                        ranks,
                        world,
                    })
                } else {
                    Ok(ranks == world)
                }
            })
            .collect::<Result<_, _>>()?;
        // fp16: unscale the local gradient shards; an overflow on any rank skips the step
        // on every rank (each holds other shards, so the finding is all-reduced).
        let mut skipped = false;
        if let Some(scaler) = &learner.scaler {
            let mut shards: Vec<Tensor> = g.units.iter().map(|u| u.grad.shallow_clone()).collect();
            let local = scaler.unscale(&mut shards);
            let flag = Tensor::from_slice(&[f32::from(u8::from(local))])
                .to_device(g.units[0].grad.device());
            g.group.all_reduce(&flag, ReduceOp::Sum)?.wait()?;
            skipped = flag.to_device(tch::Device::Cpu).double_value(&[0]) > 0.0;
        }
        let segments = g.local_segments();
        let grad_norms = if p.clip_grad > 0.0 {
            clip(&mut g, &segments, &used, p.clip_grad)?
        } else {
            vec![]
        };
        let inner = &mut *g;
        tch::no_grad(|| {
            let frozen = |name: &str| p.freeze_last_layer && learner.nets.units.is_last_layer(name);
            for (i, q) in inner.params.iter_mut().enumerate() {
                if used[i] && !frozen(&q.name) && !skipped {
                    q.step += 1;
                }
            }
            let mut groups = [AdamwGroup::default(), AdamwGroup::default()];
            for &(i, at, _, len) in &segments {
                let q = &inner.params[i];
                if !used[i] || frozen(&q.name) || skipped {
                    continue;
                }
                let unit = &inner.units[q.unit];
                groups[usize::from(q.decay)].push(
                    unit.student.narrow(0, at, len),
                    unit.grad.narrow(0, at, len),
                    unit.exp_avg.narrow(0, at, len),
                    unit.exp_avg_sq.narrow(0, at, len),
                    q.step,
                );
            }
            let [plain, decayed] = groups;
            plain.update(p.lr, 0.0);
            decayed.update(p.lr, p.weight_decay);
            let (teachers, students): (Vec<Tensor>, Vec<Tensor>) = inner
                .units
                .iter()
                .map(|u| (u.teacher.shallow_clone(), u.student.shallow_clone()))
                .unzip();
            foreach::ema(&teachers, &students, p.momentum);
        });
        drop(g);
        if let Some(scaler) = &mut learner.scaler {
            scaler.update(skipped);
        }
        // As the replicated strategies (and scDINO with its GradScaler): the teacher EMA runs
        // also after a skipped step.
        self.ema_replicated(learner, p.momentum);
        Ok((grad_norms, skipped))
    }

    /// After every step, also a failed one: no full buffer outlives the step, and the step's
    /// hooks (holding its activations) go.
    pub fn end_step(&mut self) -> Result<(), StepError> {
        let mut g = self.lock();
        g.armed = false;
        g.teacher_armed = false;
        let step_hooks = g.step_hooks.take();
        drop(g);
        drop(step_hooks);
        let mut g = self.lock();
        for u in 0..g.units.len() {
            g.free(u, true)?;
            g.free_student(u)?;
            if let Some(w) = g.units[u].reduce.take() {
                let _ = w.wait();
            }
        }
        for p in &g.params {
            set_grad(&p.student, None).map_err(storage("freeing a gradient"))?;
        }
        Ok(())
    }

    fn ema_replicated(&self, learner: &Learner, momentum: f64) {
        let student = learner.nets.student_vs.variables();
        tch::no_grad(|| {
            for (name, mut t) in learner.nets.teacher_vs.variables() {
                if !self.replicated.contains(&name)
                    || name.ends_with("running_mean")
                    || name.ends_with("running_var")
                {
                    continue;
                }
                if let Some(s) = student.get(&name) {
                    let _ = t.g_mul_scalar_(momentum);
                    let _ = t.g_add_(&(s.detach() * (1.0 - momentum)));
                }
            }
        });
    }

    /// Σ|θ| over the whole student (shards all-reduced, replicated variables once): the same
    /// number on every rank, comparable with DDP's checksum.
    pub fn checksum(&self, learner: &Learner) -> Result<f64, DistError> {
        let g = self.lock();
        let local: f64 = g
            .units
            .iter()
            .map(|u| u.student.abs().sum(Kind::Double).double_value(&[]))
            .sum();
        let t = Tensor::from_slice(&[local]).to_device(g.units[0].grad.device());
        g.group.all_reduce(&t, ReduceOp::Sum)?.wait()?;
        let replicated: f64 = learner
            .nets
            .student_vs
            .variables()
            .iter()
            .filter(|(n, _)| self.replicated.contains(n))
            .map(|(_, t)| t.abs().sum(Kind::Double).double_value(&[]))
            .sum();
        Ok(t.double_value(&[0]) + replicated)
    }

    /// This rank's shard checkpoint: unit shards, per-parameter step counts and the
    /// replicated variables (the caller adds the loss centre).
    pub fn shard_tensors(&self, learner: &Learner) -> Vec<(String, Tensor)> {
        let g = self.lock();
        let mut out = vec![];
        for u in &g.units {
            for (role, t) in [
                ("student", &u.student),
                ("teacher", &u.teacher),
                ("exp_avg", &u.exp_avg),
                ("exp_avg_sq", &u.exp_avg_sq),
            ] {
                out.push((format!("fsdp.{}.{role}", u.name), t.shallow_clone()));
            }
        }
        for p in &g.params {
            out.push((
                format!("optimizer.{}.step", p.name),
                Tensor::from_slice(&[p.step as i64]),
            ));
        }
        out.extend(self.replicated_tensors(learner));
        out
    }

    fn replicated_tensors(&self, learner: &Learner) -> Vec<(String, Tensor)> {
        let mut out = vec![];
        for (prefix, vs) in [
            ("student", &learner.nets.student_vs),
            ("teacher", &learner.nets.teacher_vs),
        ] {
            let vars = vs.variables();
            for n in &self.replicated {
                if let Some(t) = vars.get(n) {
                    out.push((format!("{prefix}.{n}"), t.shallow_clone()));
                }
            }
        }
        out
    }

    /// Restores what [`Fsdp::shard_tensors`] wrote (same world size and model).
    pub fn load_shards(
        &mut self,
        ck: &Checkpoint,
        learner: &mut Learner,
    ) -> Result<(), RestoreError> {
        let mut g = self.lock();
        tch::no_grad(|| {
            for u in &mut g.units {
                for (role, t) in [
                    ("student", &mut u.student),
                    ("teacher", &mut u.teacher),
                    ("exp_avg", &mut u.exp_avg),
                    ("exp_avg_sq", &mut u.exp_avg_sq),
                ] {
                    let name = format!("fsdp.{}.{role}", u.name);
                    RestoreError::copy_into(ck, &name, t)?;
                }
            }
            for p in &mut g.params {
                let name = format!("optimizer.{}.step", p.name);
                p.step = ck
                    .get(&name)
                    .ok_or(RestoreError::Missing(name))?
                    .int64_value(&[0]) as u64;
            }
            for (name, mut t) in self.replicated_tensors(learner) {
                RestoreError::copy_into(ck, &name, &mut t)?;
            }
            Ok(())
        })
    }

    /// The full state under the names of a single-process checkpoint (`student.*`,
    /// `teacher.*`, `optimizer.*`), gathered unit by unit. Collective: every rank calls it;
    /// all get the tensors (rank 0 writes them).
    pub fn consolidated_tensors(
        &self,
        learner: &Learner,
    ) -> Result<Vec<(String, Tensor)>, DistError> {
        let g = self.lock();
        let mut out = vec![];
        for u in &g.units {
            for (role, shard) in [
                ("student", &u.student),
                ("teacher", &u.teacher),
                ("exp_avg", &u.exp_avg),
                ("exp_avg_sq", &u.exp_avg_sq),
            ] {
                let full = Tensor::zeros([u.shard * g.world as i64], (Kind::Float, shard.device()));
                g.group.all_gather(&full, shard)?.wait()?;
                for &i in &u.params {
                    let p = &g.params[i];
                    let t = full
                        .narrow(0, p.offset, p.numel)
                        .view(p.shape.as_slice())
                        .copy();
                    let name = match role {
                        "student" | "teacher" => format!("{role}.{}", p.name),
                        _ => format!("optimizer.{}.{role}", p.name),
                    };
                    out.push((name, t));
                }
            }
        }
        for p in &g.params {
            out.push((
                format!("optimizer.{}.step", p.name),
                Tensor::from_slice(&[p.step as i64]),
            ));
        }
        out.extend(self.replicated_tensors(learner));
        Ok(out)
    }
}

/// scDINO's per-parameter clipping on shards: each parameter's norm comes from the squared
/// sums of its segments on every rank (one all-reduce), then its segments are scaled alone.
fn clip(
    g: &mut Inner,
    segments: &[(usize, i64, i64, i64)],
    used: &[bool],
    clip: f64,
) -> Result<Vec<f64>, DistError> {
    // Summed on the device in segment order (one sync, after the all-reduce, not one per
    // segment); the same f64 additions in the same order as summing on the host.
    let t = Tensor::zeros(
        [g.params.len() as i64],
        (Kind::Double, g.units[0].grad.device()),
    );
    tch::no_grad(|| {
        for &(i, at, _, len) in segments {
            let unit = &g.units[g.params[i].unit];
            let s = unit.grad.narrow(0, at, len);
            let _ = t
                .narrow(0, i as i64, 1)
                .g_add_(&(&s * &s).sum(Kind::Double).reshape([1]));
        }
    });
    g.group.all_reduce(&t, ReduceOp::Sum)?.wait()?;
    let sums = Vec::<f64>::try_from(&t.to_device(tch::Device::Cpu)).expect("f64 vector");
    // As torch: norm in f32, coef = reciprocal(norm + 1e-6) · clip in f32.
    let coefs: Vec<f32> = sums
        .iter()
        .map(|&s| (1.0f32 / (s.sqrt() as f32 + 1e-6f32)) * clip as f32)
        .collect();
    tch::no_grad(|| {
        for &(i, at, _, len) in segments {
            if used[i] && coefs[i] < 1.0 {
                let unit = &g.units[g.params[i].unit];
                let _ = unit
                    .grad
                    .narrow(0, at, len)
                    .g_mul_scalar_(f64::from(coefs[i]));
            }
        }
    });
    let mut named: Vec<(&str, f64)> = g
        .params
        .iter()
        .zip(&sums)
        .zip(used)
        .filter(|(_, &u)| u)
        .map(|((p, s), _)| (p.name.as_str(), (s.sqrt() as f32) as f64))
        .collect();
    named.sort_by(|a, b| a.0.cmp(b.0));
    Ok(named.into_iter().map(|(_, n)| n).collect())
}

/// The teacher backbone's [`BlockHooks`]: forwards to the FSDP state.
struct TeacherBlocks(Arc<Mutex<Inner>>);

impl BlockHooks for TeacherBlocks {
    fn before(&self, block: usize) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .before_teacher_block(block);
    }

    fn after(&self, block: usize, _input: &Tensor, _output: &Tensor) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .after_teacher_block(block);
    }
}

/// The student backbone's [`BlockHooks`]: forwards to the FSDP state.
struct StudentBlocks(Arc<Mutex<Inner>>);

impl StudentBlocks {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl BlockHooks for StudentBlocks {
    fn before(&self, block: usize) {
        self.lock().before_block(block);
    }

    fn after(&self, block: usize, input: &Tensor, output: &Tensor) {
        self.lock().after_block(block, input, output);
    }
}
