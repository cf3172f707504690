//! `train.cuda_graphs`: the whole single-process step (teacher and student forward, loss,
//! centre update, backward, clipping, AdamW, teacher EMA) captured once per crop-shape set as
//! a CUDA graph ([`crate::cuda_graph`]) and replayed, so a step costs one launch instead of
//! thousands at ViT-S size, where launches, not math, bound the step.
//!
//! A graph replays fixed addresses and fixed kernel arguments, so the step it captures (the
//! "static step", [`static_step`]) differs from [`Learner::step`] in what changes per step:
//! - the schedules' values (AdamW's `1 − lr·wd`, its per-parameter bias-corrected step sizes,
//!   the EMA momentum) live in device tensors written before each replay (PyTorch's
//!   capturable AdamW op order, so within float rounding of the eager update, not bit for bit);
//! - the batch is copied into input tensors the graph was captured with, and the loss, its
//!   terms, the gradient norms and the teacher's collapse signals are read after the replay
//!   from tensors it wrote: no host sync inside;
//! - the loss centre is updated in place (the eager step makes a new tensor);
//! - the teacher temperature is a constant of the loss's arithmetic: a change of it (once per
//!   epoch during `warmup_teacher_temp_epochs`), of the crop shapes or of the last-layer freeze
//!   makes a new capture;
//! - a non-finite loss is seen after the update it caused; the run stops as it would (the
//!   last checkpoint is kept).
//!
//! Before a capture the static step runs eagerly on a side stream for [`WARMUP_STEPS`]
//! consecutive steps of the same shape (PyTorch's rule: lazy initialisations must not happen
//! during capture); those are real training steps, so every step trains exactly once.
//! On a CPU the static step always runs eagerly: what the CPU tests compare with the eager
//! step, and `trainer bench step --cuda-graphs` times on a GPU.
use super::loss::{DinoTerm, TeacherTargets};
use super::loss_term::StepContext;
use super::optim::ema_pairs;
use super::step::{Learner, NonFiniteLoss, StepError, StepOutput, StepParams};
use crate::config::{Config, Precision};
use crate::cuda_graph::{self, CudaGraph, GraphError};
use crate::distributed::Single;
use crate::foreach::{self, AdamwDeviceValues, AdamwGroup};
use crate::model::channels::for_mode;
use tch::{Device, Kind, Tensor};

/// Eager steps of one crop-shape set before it is captured (`make_graphed_callables`' 3).
pub const WARMUP_STEPS: usize = 3;

/// Why this run's step cannot be captured, or None when it can: the reason the one warning
/// line of a run with `train.cuda_graphs: true` gives before it trains without graphs.
pub fn unsupported(cfg: &Config, device: Device, world: usize) -> Option<String> {
    let reason = if !device.is_cuda() {
        "the device is the CPU (CUDA graphs capture GPU kernels)"
    } else if !cuda_graph::built_with_cuda() {
        "this trainer was built without the `cuda` feature"
    } else {
        return unsupported_step(cfg, world).map(str::to_string);
    };
    Some(reason.to_string())
}

/// The reasons of [`unsupported`] that lie in the step itself, whatever the device.
pub fn unsupported_step(cfg: &Config, world: usize) -> Option<&'static str> {
    let t = &cfg.train;
    Some(if world > 1 {
        "several ranks: the DDP/FSDP gradient all-reduce, its hooks and the collectives of the \
         loss and stop agreement run outside the captured stream"
    } else if t.precision == Precision::Fp16 {
        "fp16 loss scaling decides on the host, after each backward, whether to skip the update"
    } else {
        // Each loss term and the channel mode answer for themselves (the term list is built
        // on the CPU only to be asked: a term's state is small).
        let terms = crate::train::loss_terms::LossTerms::from_config(cfg, Device::Cpu);
        let first = terms.iter().find_map(|term| term.uncapturable());
        return first.or_else(|| for_mode(cfg.model.channels).uncapturable());
    })
}

/// The per-step values the captured step reads from the device.
struct DeviceValues {
    /// Per AdamW group (plain, regularised): `1 − lr·wd`, step sizes, `√(1 − β2^t)`.
    decay: [Tensor; 2],
    step_size: [Tensor; 2],
    bc2_sqrt: [Tensor; 2],
    momentum: Tensor,
    rest: Tensor,
}

impl DeviceValues {
    fn new(device: Device) -> Self {
        let scalar = || Tensor::ones([], (Kind::Float, device));
        let empty = || Tensor::zeros([0], (Kind::Float, device));
        Self {
            decay: [scalar(), scalar()],
            step_size: [empty(), empty()],
            bc2_sqrt: [empty(), empty()],
            momentum: scalar(),
            rest: scalar(),
        }
    }

    /// Writes this step's values (in place, so a captured graph sees them; a group whose size
    /// changed gets new tensors, which only happens before a new capture).
    fn fill(&mut self, groups: &[AdamwGroup; 2], p: &StepParams) {
        let device = self.momentum.device();
        let set = |t: &mut Tensor, host: &[f32], scalar: bool| {
            let mut src = Tensor::from_slice(host).to_device(device);
            if scalar {
                src = src.reshape([]);
            }
            if t.size() == src.size() {
                tch::no_grad(|| t.copy_(&src));
            } else {
                *t = src;
            }
        };
        for (g, wd) in [0.0, p.weight_decay].into_iter().enumerate() {
            let (steps, bc2) = groups[g].bias_corrections(p.lr);
            set(&mut self.step_size[g], &steps, false);
            set(&mut self.bc2_sqrt[g], &bc2, false);
            set(&mut self.decay[g], &[(1.0 - p.lr * wd) as f32], true);
        }
        set(&mut self.momentum, &[p.momentum as f32], true);
        set(&mut self.rest, &[(1.0 - p.momentum) as f32], true);
    }

    fn group(&self, g: usize) -> AdamwDeviceValues<'_> {
        AdamwDeviceValues {
            decay: &self.decay[g],
            step_size: &self.step_size[g],
            bc2_sqrt: &self.bc2_sqrt[g],
        }
    }
}

/// What the static step leaves on the device for the host to read after it ran.
struct StaticOutputs {
    /// [`super::step::StepLoss::packed`]: the total and (several terms) each term, f64.
    packed: Tensor,
    /// Gradient norms before clipping (None without clipping).
    norms: Option<Tensor>,
    /// The teacher logits and the centre before this step's update, for collapse detection.
    teacher: Tensor,
    center_before: Tensor,
    temp: f64,
}

/// Everything that makes a step's kernels differ: a new value means a new capture.
#[derive(Debug, Clone, PartialEq)]
struct GraphKey {
    shapes: Vec<Vec<i64>>,
    kinds: Vec<Kind>,
    freeze_last_layer: bool,
    clip: bool,
    teacher_temp: u64,
}

impl GraphKey {
    fn of(crops: &[Tensor], p: &StepParams, learner: &Learner) -> Self {
        Self {
            shapes: crops.iter().map(Tensor::size).collect(),
            kinds: crops.iter().map(Tensor::kind).collect(),
            freeze_last_layer: p.freeze_last_layer,
            clip: p.clip_grad > 0.0,
            teacher_temp: learner.terms.teacher_temp(p.epoch).to_bits(),
        }
    }
}

struct Captured {
    key: GraphKey,
    graph: CudaGraph,
    inputs: Vec<Tensor>,
    out: StaticOutputs,
}

/// The step of a run with `train.cuda_graphs` where [`unsupported`] found no reason against
/// it; on a CPU (tests, the bench) the static step without capture.
pub struct GraphedStep {
    values: DeviceValues,
    /// The key of the last eager steps and how many ran in a row.
    pending: Option<(GraphKey, usize)>,
    captured: Option<Captured>,
    /// The CUDA device index, None on a CPU (never captures).
    cuda: Option<usize>,
}

impl GraphedStep {
    pub fn new(device: Device) -> Self {
        Self {
            values: DeviceValues::new(device),
            pending: None,
            captured: None,
            cuda: match device {
                Device::Cuda(i) => Some(i),
                _ => None,
            },
        }
    }

    /// Whether the last step replayed a graph (for the bench and the tests).
    pub fn replaying(&self) -> bool {
        self.captured.is_some() && self.pending.is_none()
    }

    /// One iteration, as [`Learner::step`] with a world of one: replays the graph of these
    /// crops' shapes, or runs the static step eagerly (warm-up, or a CPU), or captures it
    /// after [`WARMUP_STEPS`] eager steps of the same shapes.
    pub fn step(
        &mut self,
        learner: &mut Learner,
        crops: &[Tensor],
        p: StepParams,
        iteration: usize,
    ) -> Result<StepOutput, StepError> {
        let key = GraphKey::of(crops, &p, learner);
        if let Some(c) = self.captured.as_ref().filter(|c| c.key == key) {
            tch::no_grad(|| {
                for (input, crop) in c.inputs.iter().zip(crops) {
                    input.shallow_clone().copy_(crop);
                }
            });
            self.pending = None;
            return self.replay(learner, &p, iteration);
        }
        let run = match &self.pending {
            Some((k, n)) if *k == key => n + 1,
            _ => 1,
        };
        self.pending = Some((key.clone(), run));
        match self.cuda {
            Some(device) if run > WARMUP_STEPS => {
                self.capture(learner, crops, &p, key, device)?;
                self.pending = None;
                self.replay(learner, &p, iteration)
            }
            cuda => {
                tch::manual_seed(p.rng_seed);
                let mut eager = || static_step(learner, crops, &p, &mut self.values, true);
                let out = match cuda {
                    Some(device) => cuda_graph::on_side_stream(device, eager).map_err(graph_err)?,
                    None => eager(),
                };
                let frozen = frozen_fn(learner, &p);
                learner.optimizer.advance(&frozen);
                read(learner, &out, &p, iteration)
            }
        }
    }

    /// Captures the static step on copies of `crops` (the graph's inputs), replacing the
    /// previous graph and its memory.
    fn capture(
        &mut self,
        learner: &mut Learner,
        crops: &[Tensor],
        p: &StepParams,
        key: GraphKey,
        device: usize,
    ) -> Result<(), StepError> {
        self.captured = None;
        let inputs: Vec<Tensor> = tch::no_grad(|| crops.iter().map(Tensor::copy).collect());
        tch::manual_seed(p.rng_seed);
        let values = &mut self.values;
        let (graph, out) =
            CudaGraph::capture(device, || static_step(learner, &inputs, p, values, false))
                .map_err(graph_err)?;
        self.captured = Some(Captured {
            key,
            graph,
            inputs,
            out,
        });
        Ok(())
    }

    /// This step's values into the device tensors, the replay, and its outputs read back.
    fn replay(
        &mut self,
        learner: &mut Learner,
        p: &StepParams,
        iteration: usize,
    ) -> Result<StepOutput, StepError> {
        let c = self.captured.as_ref().expect("a captured graph");
        let frozen = frozen_fn(learner, p);
        self.values.fill(&learner.optimizer.groups(&frozen), p);
        // The generator's state at replay seeds the graph's draws (drop path) as at the
        // start of an eager step.
        tch::manual_seed(p.rng_seed);
        c.graph.replay().map_err(graph_err)?;
        learner.optimizer.advance(&frozen);
        read(learner, &c.out, p, iteration)
    }
}

fn graph_err(e: GraphError) -> StepError {
    StepError::Graph(e)
}

/// The last-layer freeze of this step as [`super::optim::AdamW`] takes it, owning the names
/// so that the optimizer can be borrowed mutably beside it.
fn frozen_fn(learner: &Learner, p: &StepParams) -> impl Fn(&str) -> bool {
    let names: std::collections::HashSet<String> = learner
        .optimizer
        .params
        .iter()
        .filter(|q| p.freeze_last_layer && learner.nets.units.is_last_layer(&q.name))
        .map(|q| q.name.clone())
        .collect();
    move |name: &str| names.contains(name)
}

/// The step's outputs on the host (the one sync of a step), as [`Learner::step`] returns them.
fn read(
    learner: &Learner,
    out: &StaticOutputs,
    p: &StepParams,
    iteration: usize,
) -> Result<StepOutput, StepError> {
    let packed = Vec::<f64>::try_from(out.packed.to_device(Device::Cpu))
        .expect("the packed loss terms are f64");
    let (loss, terms) = learner.term_values(&packed);
    if !loss.is_finite() {
        return Err(NonFiniteLoss {
            loss,
            epoch: p.epoch,
            iteration,
        }
        .into());
    }
    let grad_norms = match &out.norms {
        Some(n) => Vec::<f64>::try_from(n.to_kind(Kind::Double).to_device(Device::Cpu))
            .expect("a vector of norms"),
        None => vec![],
    };
    Ok(StepOutput {
        loss,
        terms,
        grad_norms,
        skipped: false,
        teacher: TeacherTargets::Centred {
            teacher: out.teacher.shallow_clone(),
            center: out.center_before.shallow_clone(),
            temp: out.temp,
        },
    })
}

/// The step with no host sync, in [`Learner::step`]'s order: teacher, targets, student and
/// loss, centre update (in place), backward, clipping, AdamW and EMA from the device values
/// (`fill`: written here from `p`, after the backward made the gradients; a capture finds
/// them written and the replay writes them first).
fn static_step(
    learner: &mut Learner,
    crops: &[Tensor],
    p: &StepParams,
    values: &mut DeviceValues,
    fill: bool,
) -> StaticOutputs {
    let mut single = Single;
    let temp = learner.terms.teacher_temp(p.epoch);
    let ctx = StepContext {
        epoch: p.epoch,
        teacher_temp: temp,
        batch: crops[0].size()[0],
        masks: None,
        // Channel tokens cannot be captured (`ChannelModeKind::uncapturable`).
        tokens: None,
    };
    let teacher = learner.teacher_forward(crops, None, None);
    let one_rank = "a world of one has no failing collective";
    learner
        .terms
        .targets(&teacher, &ctx, &mut single)
        .expect(one_rank);
    let loss = learner.student_loss(crops, None, &teacher, &ctx);
    let center = learner.terms.dino().loss.center.shallow_clone();
    let center_before = tch::no_grad(|| center.copy());
    learner
        .terms
        .update(&teacher, &ctx, &mut single)
        .expect(one_rank);
    let dino = learner
        .terms
        .find_mut::<DinoTerm>()
        .expect("the DINO term is always on");
    tch::no_grad(|| center.shallow_clone().copy_(&dino.loss.center));
    dino.loss.center = center;
    let packed = loss.packed();
    learner.optimizer.zero_grad();
    loss.total.backward();
    let norms = (p.clip_grad > 0.0).then(|| {
        let grads: Vec<Tensor> = learner
            .optimizer
            .params
            .iter()
            .map(|q| q.tensor.grad())
            .filter(Tensor::defined)
            .collect();
        tch::no_grad(|| foreach::clip_per_tensor(&grads, p.clip_grad))
    });
    let frozen = frozen_fn(learner, p);
    let groups = learner.optimizer.groups(&frozen);
    if fill {
        values.fill(&groups, p);
    }
    let (t, s) = ema_pairs(&learner.nets.teacher_vs, &learner.nets.student_vs);
    tch::no_grad(|| {
        groups[0].update_from_device(&values.group(0));
        groups[1].update_from_device(&values.group(1));
        foreach::ema_from_device(&t, &s, &values.momentum, &values.rest);
    });
    StaticOutputs {
        packed,
        norms,
        teacher: teacher.logits,
        center_before,
        temp,
    }
}
