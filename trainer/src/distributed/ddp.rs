//! Data parallelism: every rank holds the full model; gradients are averaged across ranks in
//! buckets of about 25 MB (one flat all-reduce each), and the initial parameters are broadcast
//! from rank 0 so all ranks start identical.
//!
//! Overlapped mode (the default, `train.ddp_overlap`) works like PyTorch's DDP: parameters are
//! bucketed in reverse model order (roughly the order backward produces their gradients), a
//! gradient hook copies each gradient into its bucket's flat buffer the moment backward
//! computes it, and a bucket's all-reduce starts asynchronously as soon as its last gradient
//! arrived, while backward goes on with earlier layers. Buckets start strictly in bucket order
//! so every rank issues the same sequence of collectives. After backward, buckets still
//! incomplete (parameters that received no gradient) are flushed with zeros in their slots,
//! all work is waited on, and the mean is copied into `.grad`. A parameter keeps "no gradient"
//! only if no rank computed one (PyTorch's `find_unused_parameters` outcome); one that got a
//! gradient on some ranks only is an error, because the ranks' hooks then started different
//! collective sequences.
use super::group::{AsyncGroup, DistError, ProcessGroup, ReduceOp, Work};
use super::hooks::{set_grad, HookSet};
use super::Collective;
use std::sync::{Arc, Mutex};
use tch::{nn, Tensor};

pub const BUCKET_BYTES: usize = 25 * 1024 * 1024;
/// PyTorch DDP's first bucket is small so communication starts early in backward.
pub const FIRST_BUCKET_BYTES: usize = 1024 * 1024;

pub struct Ddp {
    pub group: ProcessGroup,
    pub bucket_bytes: usize,
    pub first_bucket_bytes: usize,
    overlap: Option<Overlap>,
    /// The model's device ([`Collective::device`]).
    device: tch::Device,
}

/// What happened during the last backward, in order (tests prove the overlap with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapEvent {
    /// The gradient of parameter `i` (registration order) was computed.
    GradReady(usize),
    /// Bucket `b`'s all-reduce was started; `in_backward` is false for the flush afterwards.
    Launched { bucket: usize, in_backward: bool },
    /// Backward returned.
    BackwardDone,
}

struct Bucket {
    /// Parameter indices, with their offset in `flat`.
    members: Vec<(usize, i64)>,
    flat: Tensor,
    remaining: usize,
    work: Option<Work>,
}

struct OverlapState {
    group: AsyncGroup,
    buckets: Vec<Bucket>,
    /// Per parameter: (bucket, offset, numel).
    slot: Vec<(usize, i64, i64)>,
    fired: Vec<bool>,
    next_launch: usize,
    armed: bool,
    events: Vec<OverlapEvent>,
    error: Option<DistError>,
}

impl OverlapState {
    fn on_grad(&mut self, idx: usize, grad: &Tensor) {
        if !self.armed || self.error.is_some() {
            return;
        }
        let (b, offset, numel) = self.slot[idx];
        let mut dst = self.buckets[b].flat.narrow(0, offset, numel);
        tch::no_grad(|| {
            if self.fired[idx] {
                let _ = dst.g_add_(&grad.reshape([-1]));
            } else {
                dst.copy_(&grad.reshape([-1]));
            }
        });
        self.events.push(OverlapEvent::GradReady(idx));
        if !self.fired[idx] {
            self.fired[idx] = true;
            self.buckets[b].remaining -= 1;
        }
        while self.next_launch < self.buckets.len() && self.buckets[self.next_launch].remaining == 0
        {
            if let Err(e) = self.launch(self.next_launch, true) {
                self.error = Some(e);
                return;
            }
        }
    }

    fn launch(&mut self, b: usize, in_backward: bool) -> Result<(), DistError> {
        let work = self
            .group
            .all_reduce(&self.buckets[b].flat, ReduceOp::Sum)?;
        self.buckets[b].work = Some(work);
        self.events.push(OverlapEvent::Launched {
            bucket: b,
            in_backward,
        });
        self.next_launch = b + 1;
        Ok(())
    }
}

struct Overlap {
    state: Arc<Mutex<OverlapState>>,
    names: Vec<String>,
    params: Vec<Tensor>,
    _hooks: HookSet,
}

impl Ddp {
    pub fn new(group: ProcessGroup) -> Self {
        Self {
            group,
            bucket_bytes: BUCKET_BYTES,
            first_bucket_bytes: FIRST_BUCKET_BYTES,
            overlap: None,
            device: tch::Device::Cpu,
        }
    }

    /// The group for a model on `device`: the CPU-made values it reduces go there (NCCL
    /// reduces CUDA tensors only).
    pub fn on(mut self, device: tch::Device) -> Self {
        self.device = device;
        self
    }

    /// Overwrites every variable of `vs` (sorted by name) with rank 0's values.
    pub fn broadcast_parameters(&mut self, vs: &nn::VarStore) -> Result<(), DistError> {
        let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        tch::no_grad(|| {
            for (_, mut t) in vars {
                self.group.broadcast(&mut t, 0)?;
            }
            Ok(())
        })
    }

    /// Switches to overlapped gradient averaging for these parameters (name, leaf tensor),
    /// given in the model's forward order (the model declares it: `model::ModelUnits`):
    /// buckets are laid out in reverse, the order gradients become ready in backward, and
    /// hooks registered on every parameter.
    pub fn enable_overlap(&mut self, params: &[(String, Tensor)]) -> Result<(), DistError> {
        let names: Vec<String> = params.iter().map(|(n, _)| n.clone()).collect();
        let ordered: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
        // Buckets fill in reverse model order.
        let mut buckets: Vec<Vec<usize>> = vec![];
        let mut bytes = 0usize;
        for i in (0..ordered.len()).rev() {
            let cap = if buckets.len() <= 1 {
                self.first_bucket_bytes
            } else {
                self.bucket_bytes
            };
            if buckets.is_empty() || bytes >= cap {
                buckets.push(vec![]);
                bytes = 0;
            }
            bytes += ordered[i].numel() * ordered[i].kind().elt_size_in_bytes();
            buckets.last_mut().expect("just pushed").push(i);
        }
        let mut slot = vec![(0, 0, 0); ordered.len()];
        let buckets: Vec<Bucket> = buckets
            .into_iter()
            .enumerate()
            .map(|(b, idxs)| {
                let mut offset = 0i64;
                let members: Vec<(usize, i64)> = idxs
                    .iter()
                    .map(|&i| {
                        let n = ordered[i].numel() as i64;
                        slot[i] = (b, offset, n);
                        offset += n;
                        (i, offset - n)
                    })
                    .collect();
                let t = &ordered[idxs[0]];
                Bucket {
                    remaining: members.len(),
                    members,
                    flat: Tensor::zeros([offset], (t.kind(), t.device())),
                    work: None,
                }
            })
            .collect();
        let state = Arc::new(Mutex::new(OverlapState {
            group: self.group.async_handle(),
            fired: vec![false; ordered.len()],
            buckets,
            slot,
            next_launch: 0,
            armed: false,
            events: vec![],
            error: None,
        }));
        let hook_state = state.clone();
        let mut hooks = HookSet::new(Box::new(move |idx, grad| {
            if let Some(g) = grad {
                hook_state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .on_grad(idx, g);
            }
        }));
        for (i, t) in ordered.iter().enumerate() {
            hooks.on_grad(t, i).map_err(|e| DistError {
                what: format!("DDP hook on {}", names[i]),
                message: e.to_string(),
            })?;
        }
        self.overlap = Some(Overlap {
            state,
            names,
            params: ordered,
            _hooks: hooks,
        });
        Ok(())
    }

    /// The overlapped buckets as parameter names (bucket order), for tests and logs.
    pub fn bucket_layout(&self) -> Vec<Vec<String>> {
        let Some(o) = &self.overlap else {
            return vec![];
        };
        let st = o.state.lock().unwrap_or_else(|p| p.into_inner());
        st.buckets
            .iter()
            .map(|b| b.members.iter().map(|(i, _)| o.names[*i].clone()).collect())
            .collect()
    }

    /// The events of the last backward (overlapped mode).
    pub fn last_events(&self) -> Vec<OverlapEvent> {
        self.overlap.as_ref().map_or(vec![], |o| {
            o.state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .events
                .clone()
        })
    }

    fn finish_overlapped(&mut self) -> Result<(), DistError> {
        let world = self.group.world;
        let o = self.overlap.as_mut().expect("overlapped mode");
        let mut st = o.state.lock().unwrap_or_else(|p| p.into_inner());
        st.armed = false;
        st.events.push(OverlapEvent::BackwardDone);
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        // Flush what backward did not complete, in bucket order (zeros for missing grads).
        for b in st.next_launch..st.buckets.len() {
            for &(i, offset) in &st.buckets[b].members {
                if !st.fired[i] {
                    let n = st.slot[i].2;
                    let _ = st.buckets[b].flat.narrow(0, offset, n).zero_();
                }
            }
            st.launch(b, false)?;
        }
        let used = Tensor::from_slice(
            &st.fired
                .iter()
                .map(|&f| f32::from(u8::from(f)))
                .collect::<Vec<_>>(),
        )
        .to_device(st.buckets[0].flat.device());
        let used_work = st.group.all_reduce(&used, ReduceOp::Sum)?;
        for b in &mut st.buckets {
            if let Some(w) = b.work.take() {
                w.wait()?;
            }
        }
        used_work.wait()?;
        let used = Vec::<f32>::try_from(&used.to_device(tch::Device::Cpu)).expect("f32 vector");
        tch::no_grad(|| {
            for (i, p) in o.params.iter().enumerate() {
                let ranks = used[i].round() as usize;
                if ranks == 0 {
                    continue;
                }
                if ranks != world {
                    return Err(DistError {
                        what: "DDP".into(),
                        message: format!(
                            "parameter {} received a gradient on {ranks} of {world} ranks; every rank must use the same parameters",
                            o.names[i]
                        ),
                    });
                }
                let (b, offset, n) = st.slot[i];
                let mean = st.buckets[b].flat.narrow(0, offset, n) / world as f64;
                let mut g = p.grad();
                if g.defined() {
                    g.copy_(&mean.view_as(&g));
                } else {
                    set_grad(p, Some(&mean.view_as(p))).map_err(|e| DistError {
                        what: "DDP".into(),
                        message: e.to_string(),
                    })?;
                }
            }
            Ok(())
        })
    }
}

impl Collective for Ddp {
    fn world_size(&self) -> usize {
        self.group.world
    }

    fn rank(&self) -> usize {
        self.group.rank
    }

    fn all_reduce_sum(&mut self, t: &mut Tensor) -> Result<(), DistError> {
        self.group
            .all_reduce(std::slice::from_mut(t), ReduceOp::Sum)
    }

    fn device(&self) -> tch::Device {
        self.device
    }

    fn begin_backward(&mut self) -> Result<(), DistError> {
        let Some(o) = &self.overlap else {
            return Ok(());
        };
        let mut st = o.state.lock().unwrap_or_else(|p| p.into_inner());
        for b in &mut st.buckets {
            b.remaining = b.members.len();
            if let Some(w) = b.work.take() {
                w.wait()?;
            }
        }
        st.fired.iter_mut().for_each(|f| *f = false);
        st.next_launch = 0;
        st.events.clear();
        st.error = None;
        st.armed = true;
        Ok(())
    }

    fn average_gradients(&mut self, grads: &mut [Tensor]) -> Result<(), DistError> {
        if self.overlap.is_some() {
            return self.finish_overlapped();
        }
        let world = self.group.world as f64;
        let defined: Vec<&mut Tensor> = grads.iter_mut().filter(|g| g.defined()).collect();
        let mut bucket: Vec<&mut Tensor> = Vec::new();
        let mut bytes = 0;
        let flush =
            |bucket: &mut Vec<&mut Tensor>, group: &mut ProcessGroup| -> Result<(), DistError> {
                if bucket.is_empty() {
                    return Ok(());
                }
                tch::no_grad(|| {
                    let flats: Vec<Tensor> = bucket.iter().map(|g| g.flatten(0, -1)).collect();
                    let mut flat = Tensor::cat(&flats, 0);
                    group.all_reduce(std::slice::from_mut(&mut flat), ReduceOp::Sum)?;
                    let flat = flat / world;
                    let mut offset = 0;
                    for g in bucket.iter_mut() {
                        let n = g.numel() as i64;
                        g.copy_(&flat.narrow(0, offset, n).view_as(g));
                        offset += n;
                    }
                    Ok::<(), DistError>(())
                })?;
                bucket.clear();
                Ok(())
            };
        for g in defined {
            bytes += g.numel() * g.kind().elt_size_in_bytes();
            bucket.push(g);
            if bytes >= self.bucket_bytes {
                flush(&mut bucket, &mut self.group)?;
                bytes = 0;
            }
        }
        flush(&mut bucket, &mut self.group)
    }
}
