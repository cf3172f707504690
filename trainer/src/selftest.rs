//! `trainer selftest`: can this task, inside this image, on this node, train? One table of
//! checks (pass / fail / skip), each independent: a check that cannot run (a library that does
//! not load, a panic inside libtorch) is a failure with the reason, never a crash. Without a GPU
//! the GPU checks are skipped and say so; the rest still runs.
//!
//! The GPU comparisons (one training step, the device augmentation) run the same code on the
//! CPU and on the GPU from identical weights and inputs; their tolerances are stated in each
//! check's detail. The same comparison functions run CPU against CPU in the tests.
use crate::augment::{DeviceAugment, MultiCropAugment, MultiCropConfig, SampleKey};
use crate::checkpoint::CheckpointMeta;
use crate::config::Strategy;
use crate::config::{Config, Precision};
use crate::distributed::env::DistEnv;
use crate::distributed::group::{ProcessGroup, ReduceOp};
use crate::layout::ModelLayout;
use crate::monitoring::tensorboard::hostname;
use crate::train::step::{Learner, Networks, StepParams};
use crate::train::strategy::{choose, SingleProcess, StrategyOptions};
use serde::Serialize;
use std::ffi::{CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;
use tch::{Device, Kind, Tensor};

/// Marks the JSON line of a report in a log (what `launcher selftest` looks for).
pub const REPORT_KIND: &str = "scdino.selftest";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
}

impl Check {
    fn new(name: &str, status: Status, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            status,
            detail: detail.into(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub kind: &'static str,
    pub host: String,
    pub rank: usize,
    pub local_rank: usize,
    pub world: usize,
    pub checks: Vec<Check>,
    pub passed: bool,
}

impl Report {
    /// The table a person reads.
    pub fn table(&self) -> String {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(5);
        let mut s = format!(
            "# selftest on {} (rank {}/{}, local rank {})\n",
            self.host, self.rank, self.world, self.local_rank
        );
        for c in &self.checks {
            let status = match c.status {
                Status::Pass => "pass",
                Status::Fail => "FAIL",
                Status::Skip => "skip",
            };
            s.push_str(&format!("{:<width$}  {status}  {}\n", c.name, c.detail));
        }
        s.push_str(if self.passed {
            "selftest passed\n"
        } else {
            "selftest FAILED\n"
        });
        s
    }
}

pub struct Options {
    /// Rendezvous and collective timeout of the all-reduce check.
    pub timeout: Duration,
}

/// Runs every check. `env` is how this task found its rank (torchrun or Slurm variables).
pub fn run(env: &DistEnv, opts: &Options) -> Report {
    let gpus = guarded("cuda devices", || Ok(tch::Cuda::device_count() as usize)).unwrap_or(0);
    let gpu = (gpus > 0).then(|| Device::Cuda(env.local_rank % gpus));
    let mut checks = vec![
        cuda_check(gpus),
        nccl_check(gpu),
        efa_check(),
        ofi_nccl_check(),
    ];
    checks.push(run_check("train step cpu", || {
        let step = step_on(Device::Cpu, Precision::Fp32, None)?;
        Ok(format!("loss {:.5}, finite", step.loss))
    }));
    for (precision, name) in [
        (Precision::Fp32, "train step gpu fp32"),
        (Precision::Bf16, "train step gpu bf16"),
        (Precision::Fp16, "train step gpu fp16"),
    ] {
        checks.push(match gpu {
            None => skip_no_gpu(name),
            Some(d) => run_check(name, || step_matches_cpu(d, precision)),
        });
    }
    checks.push(run_check("sdpa backend", || {
        sdpa_backends(gpu.unwrap_or(Device::Cpu))
    }));
    checks.push(match gpu {
        None => skip_no_gpu("augment gpu vs cpu"),
        Some(d) => run_check("augment gpu vs cpu", || augment_matches_cpu(d)),
    });
    checks.push(all_reduce_check(env, gpu, opts.timeout));
    checks.push(run_check("ddp and fsdp step, one rank", || {
        let cuda = gpu.is_some() && crate::distributed::backend::NCCL_BUILT;
        let device = if cuda { gpu.unwrap() } else { Device::Cpu };
        strategies_match_single(device, opts.timeout)
    }));
    checks.push(run_check(
        "ddp step, two ranks on one device (gloo)",
        || two_ranks_match_single(gpu.unwrap_or(Device::Cpu), opts.timeout),
    ));
    let passed = checks.iter().all(|c| c.status != Status::Fail);
    Report {
        kind: REPORT_KIND,
        host: hostname(),
        rank: env.rank,
        local_rank: env.local_rank,
        world: env.world,
        checks,
        passed,
    }
}

/// The kernel `scaled_dot_product_attention` picks for a ViT-S/16 block's attention (6
/// heads of 64, 197 tokens, batch 64) in each training precision, as PyTorch's
/// `_fused_sdp_choice` answers it: the math fallback on a GPU would cost several times the
/// step time of a fused kernel, and nothing else in the logs would show it.
pub fn sdpa_backends(device: Device) -> Result<String, String> {
    let kinds: &[(&str, Kind)] = match device {
        Device::Cpu => &[("fp32", Kind::Float), ("bf16", Kind::BFloat16)],
        _ => &[
            ("fp32", Kind::Float),
            ("bf16", Kind::BFloat16),
            ("fp16", Kind::Half),
        ],
    };
    let names: Vec<String> = kinds
        .iter()
        .map(|&(label, kind)| {
            let q = Tensor::zeros([64, 6, 197, 64], (kind, device));
            let choice = Tensor::internal_fused_sdp_choice(
                &q,
                &q,
                &q,
                None::<Tensor>,
                0.0,
                false,
                None,
                false,
            );
            format!("{label} {}", sdpa_backend_name(choice))
        })
        .collect();
    Ok(format!("{device:?}: {}", names.join(", ")))
}

/// PyTorch's `sdp::SDPBackend` numbering (aten/src/ATen/native/transformers/sdp_utils_cpp.h).
fn sdpa_backend_name(choice: i64) -> &'static str {
    match choice {
        0 => "math",
        1 => "flash_attention",
        2 => "efficient_attention",
        3 => "cudnn_attention",
        4 => "overrideable",
        _ => "none usable",
    }
}

fn skip_no_gpu(name: &str) -> Check {
    Check::new(name, Status::Skip, "no CUDA device visible")
}

/// Runs `f`, turning an error or a panic (tch panics on libtorch errors) into a message.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(format!(
                "{what}: {}",
                msg.lines().next().unwrap_or_default()
            ))
        }
    }
}

fn run_check(name: &str, f: impl FnOnce() -> Result<String, String>) -> Check {
    match guarded(name, f) {
        Ok(detail) => Check::new(name, Status::Pass, detail),
        Err(e) => Check::new(name, Status::Fail, e),
    }
}

/// A shared library opened for this check (kept loaded: closing libraries libtorch also uses
/// is never safe).
struct Library(*mut libc::c_void);

impl Library {
    /// The first of `names` that loads; the error names every one tried and the loader's reason.
    fn open(names: &[&str]) -> Result<(Self, String), String> {
        let mut reasons = Vec::new();
        for name in names {
            let c = CString::new(*name).map_err(|e| e.to_string())?;
            // SAFETY: a NUL-terminated name; dlerror is read right after on this thread.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            if !h.is_null() {
                return Ok((Self(h), name.to_string()));
            }
            // SAFETY: dlerror returns a thread-local message or NULL.
            let e = unsafe { libc::dlerror() };
            reasons.push(if e.is_null() {
                format!("{name}: not found")
            } else {
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            });
        }
        Err(reasons.join("; "))
    }

    fn symbol(&self, name: &str) -> Option<*mut libc::c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: a handle from dlopen and a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// Calls `int f(int*)` (the CUDA and NCCL version getters).
    fn version(&self, name: &str) -> Option<i32> {
        let f = self.symbol(name)?;
        let mut v = 0i32;
        // SAFETY: every symbol read this way has the C signature `int f(int *)`.
        let f: extern "C" fn(*mut i32) -> i32 = unsafe { std::mem::transmute(f) };
        (f(&mut v) == 0).then_some(v)
    }
}

fn cuda_check(gpus: usize) -> Check {
    const NAME: &str = "cuda";
    if gpus == 0 {
        return Check::new(NAME, Status::Skip, "no CUDA device visible (a CPU node)");
    }
    let driver = Library::open(&["libcuda.so.1"])
        .ok()
        .and_then(|(l, _)| l.version("cuDriverGetVersion"));
    let runtime = Library::open(&["libcudart.so.12", "libcudart.so.13", "libcudart.so"])
        .ok()
        .and_then(|(l, _)| l.version("cudaRuntimeGetVersion"));
    let v = |x: Option<i32>| {
        x.map_or("unknown".into(), |v| {
            format!("{}.{}", v / 1000, v % 1000 / 10)
        })
    };
    let status = if driver.is_some() {
        Status::Pass
    } else {
        Status::Fail
    };
    Check::new(
        NAME,
        status,
        format!(
            "{gpus} device(s), driver API {}, runtime {}",
            v(driver),
            v(runtime)
        ),
    )
}

fn nccl_check(gpu: Option<Device>) -> Check {
    const NAME: &str = "nccl";
    if !crate::distributed::backend::NCCL_BUILT {
        return Check::new(
            NAME,
            Status::Skip,
            "this trainer was built without NCCL (Gloo only)",
        );
    }
    match Library::open(&["libnccl.so.2", "libnccl.so"]) {
        Ok((l, name)) => match l.version("ncclGetVersion") {
            Some(v) => Check::new(
                NAME,
                Status::Pass,
                format!("{name}: NCCL {}.{}.{}", v / 10000, v / 100 % 100, v % 100),
            ),
            None => Check::new(NAME, Status::Fail, format!("{name} has no ncclGetVersion")),
        },
        Err(e) if gpu.is_some() => Check::new(NAME, Status::Fail, e),
        Err(e) => Check::new(NAME, Status::Skip, format!("no GPU; {e}")),
    }
}

/// EFA devices of this node (`/sys/class/infiniband/*` whose name starts with `efa`, or
/// `rdmap*` as the EFA driver names them).
fn efa_devices() -> Vec<String> {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("efa") || n.starts_with("rdmap"))
                .collect()
        })
        .unwrap_or_default()
}

fn efa_check() -> Check {
    const NAME: &str = "efa libfabric";
    let devices = efa_devices();
    if devices.is_empty() {
        return Check::new(NAME, Status::Skip, "no EFA device on this node");
    }
    match Library::open(&[
        "libfabric.so.1",
        "/opt/amazon/efa/lib/libfabric.so.1",
        "/opt/amazon/efa/lib64/libfabric.so.1",
    ]) {
        Ok((l, name)) => {
            let version = l.symbol("fi_version").map(|f| {
                // SAFETY: `uint32_t fi_version(void)`.
                let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(f) };
                let v = f();
                format!("{}.{}", v >> 16, v & 0xffff)
            });
            Check::new(
                NAME,
                Status::Pass,
                format!(
                    "{} on {}; {name} (libfabric {})",
                    devices.join(","),
                    hostname(),
                    version.unwrap_or_else(|| "?".into())
                ),
            )
        }
        Err(e) => Check::new(
            NAME,
            Status::Fail,
            format!("EFA device {} but {e}", devices[0]),
        ),
    }
}

fn ofi_nccl_check() -> Check {
    const NAME: &str = "aws-ofi-nccl";
    if efa_devices().is_empty() {
        return Check::new(NAME, Status::Skip, "no EFA device on this node");
    }
    match Library::open(&[
        "libnccl-net.so",
        "libnccl-net-ofi.so",
        "/opt/amazon/ofi-nccl/lib/libnccl-net.so",
        "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so",
        "/opt/amazon/ofi-nccl/lib64/libnccl-net.so",
    ]) {
        Ok((_, name)) => Check::new(NAME, Status::Pass, format!("{name} loads")),
        Err(e) => Check::new(NAME, Status::Fail, e),
    }
}

/// The small model every step check trains: a ViT-tiny/8 student and teacher on 3 channels.
fn step_config() -> Config {
    Config::from_yaml(
        "run:\n  seed: 0\n\
         data:\n  channel_names: [a, b, c]\n  channel_combinations: [\"012\"]\n\
         model:\n  arch: vit_tiny\n  patch_size: 8\n  out_dim: 256\n  drop_path_rate: 0.0\n\
         augment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 2\n",
        "selftest",
    )
    .expect("the selftest config is valid")
}

/// A fixed batch: 4 images, 2 global crops of 32 and 2 local crops of 16.
fn step_batch(device: Device) -> Vec<Tensor> {
    [32i64, 32, 16, 16]
        .iter()
        .enumerate()
        .map(|(k, &s)| {
            let n = 4 * 3 * s * s;
            let v: Vec<f32> = (0..n)
                .map(|i| (((i * 37 + k as i64 * 11) % 101) as f32 / 101.0 - 0.5) * 2.0)
                .collect();
            Tensor::from_slice(&v)
                .reshape([4, 3, s, s])
                .to_device(device)
        })
        .collect()
}

/// The student's parameters around one step: names, values before and after (CPU, fp32).
pub struct StepUpdate {
    pub loss: f64,
    pub names: Vec<String>,
    pub before: Vec<Tensor>,
    pub after: Vec<Tensor>,
}

/// The selftest's learner (training's own, [`Learner::from_config`]) on `device` in
/// `precision`, with the weights of seed 0 or of `from`.
fn step_learner(
    device: Device,
    precision: Precision,
    from: Option<&Networks>,
) -> Result<Learner, String> {
    let cfg = step_config()
        .edit("selftest", |s| s.train.precision = precision)
        .map_err(|e| e.to_string())?;
    learner_of(&cfg, device, from)
}

/// The learner of `cfg` (3 channels) on `device`, with the weights of its seed or of `from`.
fn learner_of(cfg: &Config, device: Device, from: Option<&Networks>) -> Result<Learner, String> {
    let mut learner = Learner::from_config(cfg, 3, device).map_err(|e| e.to_string())?;
    if let Some(src) = from {
        let nets = &mut learner.nets;
        nets.student_vs
            .copy(&src.student_vs)
            .map_err(|e| e.to_string())?;
        nets.teacher_vs
            .copy(&src.teacher_vs)
            .map_err(|e| e.to_string())?;
    }
    Ok(learner)
}

/// One training step on `device` in `precision` from the weights of seed 0 (or of `from`).
fn step_on(
    device: Device,
    precision: Precision,
    from: Option<&Networks>,
) -> Result<StepUpdate, String> {
    let mut learner = step_learner(device, precision, from)?;
    let snapshot = |l: &Learner| -> Vec<Tensor> {
        l.optimizer
            .params
            .iter()
            .map(|q| q.tensor.to_device(Device::Cpu).to_kind(Kind::Float).copy())
            .collect()
    };
    let before = snapshot(&learner);
    let out = learner
        .step(
            &step_batch(device),
            selftest_params(),
            0,
            &mut SingleProcess::default(),
        )
        .map_err(|e| e.to_string())?;
    if !out.loss.is_finite() {
        return Err(format!("loss {}", out.loss));
    }
    Ok(StepUpdate {
        loss: out.loss,
        names: learner
            .optimizer
            .params
            .iter()
            .map(|q| q.name.clone())
            .collect(),
        before,
        after: snapshot(&learner),
    })
}

/// The step's schedule values for every selftest step.
pub fn selftest_params() -> StepParams {
    StepParams {
        lr: 1e-4,
        weight_decay: 0.04,
        momentum: 0.996,
        epoch: 1,
        freeze_last_layer: false,
        clip_grad: 3.0,
        rng_seed: 1,
        channels: None,
        teacher_channels: None,
    }
}

/// Relative loss tolerance of a step in `precision` against the CPU's fp32 step.
pub fn loss_tolerance(precision: Precision) -> f64 {
    match precision {
        Precision::Fp32 => 1e-4,
        Precision::Bf16 => 3e-2,
        Precision::Fp16 => 1e-2,
    }
}

/// How far a step's update (parameters after minus before) may stray from the CPU fp32
/// step's, per parameter tensor, measured relative to the size of that update rather than of
/// the parameters: at lr 1e-4 the update is ~1e-4 per element, far below any absolute
/// parameter tolerance that survives reduced precision. `scale` bounds |a - 1| for the best
/// fit a of the update onto the CPU's (a wrong sign gives a = -1, half the lr 0.5, a skipped
/// tensor 0); `residual` bounds ‖Δ - Δ_cpu‖ / ‖Δ_cpu‖. AdamW's first step is nearly
/// lr·sign(g), so elements whose gradient sits at the noise level of the precision flip; the
/// bf16/fp16 bounds allow that (measured CPU bf16 against CPU fp32: see the tests).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpdateTolerance {
    pub scale: f64,
    pub residual: f64,
}

pub fn update_tolerance(precision: Precision) -> UpdateTolerance {
    match precision {
        Precision::Fp32 => UpdateTolerance {
            scale: 0.02,
            residual: 0.1,
        },
        Precision::Bf16 | Precision::Fp16 => UpdateTolerance {
            scale: 0.15,
            residual: 0.45,
        },
    }
}

/// `candidate` against `reference`, both from the same `before`, tensor by tensor (see
/// [`UpdateTolerance`]). A tensor the reference left exactly unchanged must stay unchanged
/// (within 1e-12). Ok: the worst tensor's figures; Err: every tensor out of bounds, named.
pub fn compare_updates(
    names: &[String],
    before: &[Tensor],
    reference: &[Tensor],
    candidate: &[Tensor],
    tol: UpdateTolerance,
) -> Result<String, String> {
    if names.len() != before.len()
        || reference.len() != before.len()
        || candidate.len() != before.len()
    {
        return Err(format!(
            "{} names, {} parameters before, {} in the reference, {} in the candidate",
            names.len(),
            before.len(),
            reference.len(),
            candidate.len()
        ));
    }
    let (mut worst_scale, mut worst_residual) = ((0.0f64, ""), (0.0f64, ""));
    let mut bad = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut d_ref = (&reference[i] - &before[i]).to_kind(Kind::Double);
        let mut d = (&candidate[i] - &before[i]).to_kind(Kind::Double);
        if name.ends_with("attn.qkv.bias") {
            // The key bias shifts every score of a query equally, which softmax cancels: its
            // gradient is zero in exact arithmetic, so its Adam update is normalised rounding
            // noise in any implementation. Left out (as in the DDP comparisons).
            let third = d.size()[0] / 3;
            let keep = |t: &Tensor| {
                Tensor::cat(&[t.narrow(0, 0, third), t.narrow(0, 2 * third, third)], 0)
            };
            d_ref = keep(&d_ref);
            d = keep(&d);
        }
        let ref_sq = d_ref.square().sum(Kind::Double).double_value(&[]);
        if ref_sq == 0.0 {
            let moved = d.abs().max().double_value(&[]);
            if moved > 1e-12 {
                bad.push(format!(
                    "{name}: moved by {moved:.1e} where the CPU step left it"
                ));
            }
            continue;
        }
        let a = (&d * &d_ref).sum(Kind::Double).double_value(&[]) / ref_sq;
        let residual = (&d - &d_ref)
            .square()
            .sum(Kind::Double)
            .double_value(&[])
            .sqrt()
            / ref_sq.sqrt();
        if (a - 1.0).abs() > worst_scale.0 {
            worst_scale = ((a - 1.0).abs(), name);
        }
        if residual > worst_residual.0 {
            worst_residual = (residual, name);
        }
        if !((a - 1.0).abs() <= tol.scale && residual <= tol.residual) {
            bad.push(format!(
                "{name}: update scale {a:.3} (|a-1| <= {}), residual {residual:.2e} (<= {})",
                tol.scale, tol.residual
            ));
        }
    }
    let summary = format!(
        "update per tensor: worst |a-1| {:.1e} ({}), worst residual {:.1e} ({}), bounds {} / {}",
        worst_scale.0, worst_scale.1, worst_residual.0, worst_residual.1, tol.scale, tol.residual
    );
    if bad.is_empty() {
        Ok(summary)
    } else {
        Err(format!("{}; {summary}", bad.join("; ")))
    }
}

/// One step on `device` in `precision` against the CPU's fp32 step, same weights and batch:
/// loss within [`loss_tolerance`], and every parameter tensor's update within
/// [`update_tolerance`] of the CPU's.
pub fn step_matches_cpu(device: Device, precision: Precision) -> Result<String, String> {
    let cfg = step_config();
    tch::manual_seed(0);
    let reference = Networks::new(&cfg, 3, Device::Cpu);
    let cpu = step_on(Device::Cpu, Precision::Fp32, Some(&reference))?;
    let dev = step_on(device, precision, Some(&reference))?;
    let rel = (dev.loss - cpu.loss).abs() / cpu.loss.abs().max(1e-12);
    let tol = loss_tolerance(precision);
    let loss_text = format!(
        "loss {:.5} vs cpu fp32 {:.5} (rel {rel:.1e} <= {tol:.0e})",
        dev.loss, cpu.loss
    );
    let updates = compare_updates(
        &cpu.names,
        &cpu.before,
        &cpu.after,
        &dev.after,
        update_tolerance(precision),
    );
    match updates {
        Ok(u) if rel <= tol => Ok(format!("{loss_text}; {u}")),
        Ok(u) | Err(u) => Err(format!("{loss_text}; {u}")),
    }
}

/// The device augmentation of one batch on `device` against the same on the CPU: every crop
/// within 1e-4 (absolute, pixels scaled to [0, 1] before normalisation).
pub fn augment_matches_cpu(device: Device) -> Result<String, String> {
    let aug = Arc::new(
        MultiCropAugment::new(MultiCropConfig::scdino(vec![0.0; 3], vec![1.0; 3]))
            .map_err(|e| e.to_string())?,
    );
    let dev = DeviceAugment::new(aug);
    let n = 8i64;
    let v: Vec<f32> = (0..n * 3 * 64 * 64)
        .map(|i| ((i * 13) % 97) as f32 / 96.0)
        .collect();
    let images = Tensor::from_slice(&v).reshape([n, 3, 64, 64]);
    let keys: Vec<SampleKey> = (0..n as u64).map(|i| SampleKey::new(3, 0, i)).collect();
    let cpu = dev.apply(&images, &keys).map_err(|e| e.to_string())?;
    let other = dev
        .apply(&images.to_device(device), &keys)
        .map_err(|e| e.to_string())?;
    let max = cpu
        .iter()
        .zip(&other)
        .map(|(a, b)| (a - b.to_device(Device::Cpu)).abs().max().double_value(&[]))
        .fold(0.0f64, f64::max);
    let detail = format!(
        "{} crops of {n} images, max |diff| {max:.1e} <= 1e-4",
        cpu.len()
    );
    if max <= 1e-4 {
        Ok(detail)
    } else {
        Err(detail)
    }
}

/// One fp32 step on `device` under DDP (overlapped with backward, as configured by default)
/// and under FSDP, each over a process group of one rank (NCCL on a GPU, else Gloo), against
/// the single-process step there: the hooks, buckets and shard storage on that device must
/// change nothing a world of one can see. Every checkpoint tensor (student, teacher, both
/// AdamW moments, the centre) within 1e-6 of its scale.
pub fn strategies_match_single(device: Device, timeout: Duration) -> Result<String, String> {
    let cfg = step_config();
    tch::manual_seed(0);
    let reference = Networks::new(&cfg, 3, Device::Cpu);
    let (single_loss, single) = strategy_step(device, &reference, None, timeout)?;
    let mut details = vec![];
    for kind in [Strategy::Ddp, Strategy::Fsdp] {
        let (loss, state) = strategy_step(device, &reference, Some(kind), timeout)?;
        // Worst relative difference among the weights (student, teacher, centre) and among
        // AdamW's moments. After one step AdamW's update is ±lr almost whatever the
        // gradient, so only the moments show the gradients. Under FSDP the head's first
        // moment differs by up to 1.8e-4 of its scale on the CPU (DDP: below 1e-6) while the
        // loss agrees to 1e-7: the clipping norm of the 2048 × 2048 `head.mlp.2.weight` (no
        // other parameter, and none without clipping). One process takes it as PyTorch (and
        // scDINO) do, libtorch's fp32 norm, which on a low-rank matrix of that size is about
        // 1e-4 off (measured on `b.T @ gelu(a)`; 1e-7 on random values); FSDP sums its
        // shards' squares in f64. Without clipping FSDP's
        // moments agree to 1e-6 (`two_ranks_match_single_with` with `clip_grad: 0`). So the
        // bound on FSDP's moments is 1e-3, stated in the line.
        let mut worst = [(0.0f64, String::new()), (0.0f64, String::new())];
        for (name, ours) in &single {
            let theirs = state
                .get(name)
                .ok_or_else(|| format!("{kind:?} checkpoint lacks {name}"))?;
            if theirs.size() != ours.size() {
                return Err(format!(
                    "{kind:?} {name}: shape {:?} vs {:?}",
                    theirs.size(),
                    ours.size()
                ));
            }
            let scale = ours.abs().max().double_value(&[]).max(1e-3);
            let rel = (theirs - ours).abs().max().double_value(&[]) / scale;
            let w = &mut worst[usize::from(name.starts_with("optimizer."))];
            if rel > w.0 || w.1.is_empty() {
                *w = (rel, name.clone());
            }
        }
        let moments_bound = if kind == Strategy::Fsdp { 1e-3 } else { 1e-6 };
        let text = format!(
            "{kind:?} loss {loss:.6} vs {single_loss:.6}, weights: worst {} rel {:.1e} <= 1e-6, \
             moments: worst {} rel {:.1e} <= {moments_bound:.0e}",
            worst[0].1, worst[0].0, worst[1].1, worst[1].0
        );
        if worst[0].0 > 1e-6
            || worst[1].0 > moments_bound
            || (loss - single_loss).abs() > 1e-6 * single_loss.abs()
        {
            return Err(text);
        }
        details.push(text);
    }
    Ok(format!(
        "{} on {device:?}: {}",
        single.len(),
        details.join("; ")
    ))
}

/// A rank's loss and its student parameters after the step: name, weights, first moment.
type RankState = (f64, Vec<(String, Tensor, Tensor)>);

/// One fp32 DDP step of two ranks on the same `device` over a Gloo group (with CUDA tensors on
/// a GPU: the path a job takes when ranks share a GPU or NCCL is unavailable), each rank on
/// half of the batch, against one process stepping on the whole batch: the loss to 1e-6 and
/// every AdamW first moment within 1e-5 of its tensor's scale on both ranks (the two halves'
/// gradients are summed in another order than one batch's, so not bit for bit; after one step
/// the moments carry the gradients), the weights within two learning rates, the loss terms'
/// centres as the moments.
pub fn two_ranks_match_single(device: Device, timeout: Duration) -> Result<String, String> {
    let cfg = step_config()
        .edit("selftest", |s| s.train.precision = Precision::Fp32)
        .map_err(|e| e.to_string())?;
    two_ranks_match_single_with(&cfg, selftest_params(), Strategy::Ddp, device, timeout)
}

/// [`two_ranks_match_single`] for another fp32 configuration of 3 channels (a `tokens`
/// model with its loss terms, say), step values and strategy: the selftest's batch, one step
/// of two ranks on its halves against one process on the whole of it, the same bounds, but
/// FSDP's first moments within 1e-3 of scale when gradients are clipped (the clipping norm
/// of one process is libtorch's fp32 one, FSDP's exact: [`strategies_match_single`]) and
/// within 1e-5 when `params.clip_grad` is 0. Terms whose value is not a mean
/// over the batch's rows (KoLeo's nearest neighbours, a BatchNorm head) differ between halves
/// and the whole by design and do not belong here.
pub fn two_ranks_match_single_with(
    cfg: &Config,
    params: StepParams,
    strategy: Strategy,
    device: Device,
    timeout: Duration,
) -> Result<String, String> {
    let mut single = learner_of(cfg, device, None)?;
    let inits = [initial_weights(&single), initial_weights(&single)];
    let single_loss = single
        .step(
            &step_batch(device),
            params,
            0,
            &mut SingleProcess::default(),
        )
        .map_err(|e| e.to_string())?
        .loss;
    let want = comparable_state(&single);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let ranks: Vec<Result<RankState, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = inits
            .into_iter()
            .enumerate()
            .map(|(rank, init)| {
                s.spawn(move || {
                    let learner = learner_from_weights(cfg, device, init)?;
                    let group = ProcessGroup::new("127.0.0.1", port, rank, 2, timeout, false)
                        .map_err(|e| e.to_string())?;
                    match strategy {
                        Strategy::Ddp => ddp_rank_step(learner, group, params, device),
                        Strategy::Fsdp => fsdp_rank_step(learner, group, params, device),
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    let mut details = vec![];
    for (rank, result) in ranks.into_iter().enumerate() {
        let (loss, got) = result.map_err(|e| format!("rank {rank}: {e}"))?;
        let clipped_fsdp = strategy == Strategy::Fsdp && params.clip_grad > 0.0;
        let moments_bound = if clipped_fsdp { 1e-3 } else { 1e-5 };
        details.push(compare_rank(
            rank,
            (loss, &got),
            (single_loss, &want),
            (params.lr, moments_bound),
        )?);
    }
    Ok(format!(
        "{strategy:?} over Gloo on {device:?}: {}",
        details.join("; ")
    ))
}

/// The student's and the teacher's weights, copied, by "student."/"teacher." + name. Every
/// rank starts from the single process's: a construction seeds and draws from the
/// process-wide generator, which other threads (tests running beside this one) may draw from
/// meanwhile, and a [`Networks`] cannot be shared across threads for [`learner_of`]'s copy.
fn initial_weights(l: &Learner) -> Vec<(String, Tensor)> {
    let nets = &l.nets;
    [
        ("student.", &nets.student_vs),
        ("teacher.", &nets.teacher_vs),
    ]
    .into_iter()
    .flat_map(|(side, vs)| {
        vs.variables()
            .into_iter()
            .map(move |(name, t)| (format!("{side}{name}"), t.copy()))
    })
    .collect()
}

/// The learner of `cfg` with the weights `init` ([`initial_weights`] of another one).
fn learner_from_weights(
    cfg: &Config,
    device: Device,
    init: Vec<(String, Tensor)>,
) -> Result<Learner, String> {
    let learner = learner_of(cfg, device, None)?;
    let nets = &learner.nets;
    let (student, teacher) = (nets.student_vs.variables(), nets.teacher_vs.variables());
    if student.len() + teacher.len() != init.len() {
        return Err(format!(
            "{} weights against the single process's {}",
            student.len() + teacher.len(),
            init.len()
        ));
    }
    tch::no_grad(|| {
        for (name, value) in &init {
            let t = match name.split_once('.') {
                Some(("student", key)) => student.get(key),
                Some(("teacher", key)) => teacher.get(key),
                _ => None,
            };
            let mut t = t
                .ok_or_else(|| format!("the rank's learner has no {name}"))?
                .shallow_clone();
            t.copy_(value);
        }
        Ok::<(), String>(())
    })?;
    Ok(learner)
}

/// Every parameter with its first moment, then every loss term's state (the centres the step
/// updated from the all-reduced teacher outputs) as a moment; on the CPU in fp32.
fn comparable_state(l: &Learner) -> Vec<(String, Tensor, Tensor)> {
    let params = l
        .optimizer
        .params
        .iter()
        .map(|q| (q.name.clone(), cpu_f32(&q.tensor), cpu_f32(&q.exp_avg)));
    params.chain(term_states(l)).collect()
}

/// Every loss term's state (the centres), as a weight and a moment, for [`compare_rank`].
fn term_states(l: &Learner) -> impl Iterator<Item = (String, Tensor, Tensor)> + '_ {
    l.terms
        .state()
        .into_iter()
        .map(|(name, t)| (name.to_string(), cpu_f32(&t), cpu_f32(&t)))
}

/// A copy of `t` on the CPU in fp32.
fn cpu_f32(t: &Tensor) -> Tensor {
    t.to_device(Device::Cpu).to_kind(Kind::Float).copy()
}

/// [`choose`] as the selftest's steps use it: overlapped DDP, FSDP resharding after forward,
/// no resume.
fn selftest_strategy(
    kind: Strategy,
    group: Option<ProcessGroup>,
    learner: &mut Learner,
    files: &ModelLayout,
) -> Result<crate::train::strategy::Chosen, String> {
    let options = StrategyOptions {
        ddp_overlap: true,
        fsdp_reshard_after_forward: true,
    };
    choose(kind, group, learner, files, "selftest", None, options).map_err(|e| e.to_string())
}

/// The rank's half of the selftest's batch (of two ranks).
fn half_batch(rank: usize, device: Device) -> Vec<Tensor> {
    step_batch(device)
        .iter()
        .map(|c| c.narrow(0, 2 * rank as i64, 2))
        .collect()
}

/// A rank of two: one FSDP step on its half of the selftest's batch; the state gathered from
/// every rank's shards ([`comparable_state`]'s names and order).
fn fsdp_rank_step(
    mut learner: Learner,
    group: ProcessGroup,
    params: StepParams,
    device: Device,
) -> Result<RankState, String> {
    let rank = group.rank;
    let names: Vec<String> = learner
        .optimizer
        .params
        .iter()
        .map(|q| q.name.clone())
        .collect();
    let mut sharded = crate::train::strategy::FullySharded::new(
        crate::distributed::ddp::Ddp::new(group).on(device),
        &mut learner,
    )
    .map_err(|e| e.to_string())?;
    let out = learner
        .step(&half_batch(rank, device), params, 0, &mut sharded)
        .map_err(|e| e.to_string())?;
    let mut full: std::collections::HashMap<String, Tensor> = sharded
        .fsdp()
        .consolidated_tensors(&learner)
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();
    let mut take = |key: String| {
        full.remove(&key)
            .map(|t| cpu_f32(&t))
            .ok_or_else(|| format!("the gathered state lacks {key}"))
    };
    let mut state = vec![];
    for name in names {
        let weight = take(format!("student.{name}"))?;
        let moment = take(format!("optimizer.{name}.exp_avg"))?;
        state.push((name, weight, moment));
    }
    state.extend(term_states(&learner));
    Ok((out.loss, state))
}

/// A rank of two: one DDP step on its half of the selftest's batch.
fn ddp_rank_step(
    mut learner: Learner,
    group: ProcessGroup,
    params: StepParams,
    device: Device,
) -> Result<RankState, String> {
    let rank = group.rank;
    let dir = std::env::temp_dir().join(format!(
        "scdino-selftest-{}-two-ranks-{rank}",
        std::process::id()
    ));
    let files = ModelLayout::beside(&dir.join("scDINO_ViTs").join("selftest"))
        .expect("a scDINO_ViTs model folder");
    let result = (|| {
        let mut chosen = selftest_strategy(Strategy::Ddp, Some(group), &mut learner, &files)?;
        let out = learner
            .step(
                &half_batch(rank, device),
                params,
                0,
                chosen.strategy.as_mut(),
            )
            .map_err(|e| e.to_string())?;
        Ok((out.loss, comparable_state(&learner)))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A rank's loss and state against the single process's, within
/// [`two_ranks_match_single`]'s bounds; the line that says how close, or the error.
fn compare_rank(
    rank: usize,
    (loss, got): (f64, &[(String, Tensor, Tensor)]),
    (single_loss, want): (f64, &[(String, Tensor, Tensor)]),
    (lr, moments_bound): (f64, f64),
) -> Result<String, String> {
    let got_names: Vec<&String> = got.iter().map(|g| &g.0).collect();
    let want_names: Vec<&String> = want.iter().map(|w| &w.0).collect();
    if got_names != want_names {
        return Err(format!(
            "rank {rank}: compared {} tensors against the single process's {} (other names or order)",
            got.len(),
            want.len()
        ));
    }
    // The first moments (0.1 × the gradient) relative to their tensor's scale; the
    // weights absolutely, within two learning rates: where a gradient is about AdamW's
    // eps (zero-initialised biases), its update lr·g/(|g| + eps) follows the rounding of g.
    let (mut moment, mut weight) = ((0.0f64, String::new()), (0.0f64, String::new()));
    for ((name, w, m), (_, gw, gm)) in want.iter().zip(got) {
        let scale = m.abs().max().double_value(&[]).max(1e-12);
        let rel = (gm - m).abs().max().double_value(&[]) / scale;
        if rel > moment.0 || moment.1.is_empty() {
            moment = (rel, name.clone());
        }
        let abs = (gw - w).abs().max().double_value(&[]);
        if abs > weight.0 || weight.1.is_empty() {
            weight = (abs, name.clone());
        }
    }
    let text = format!(
        "rank {rank}: loss {loss:.6} vs {single_loss:.6}, exp_avg: worst {} rel {:.1e} <= \
         {moments_bound:.0e}, weights: worst {} |diff| {:.1e} <= 2 lr",
        moment.1, moment.0, weight.1, weight.0
    );
    if moment.0 > moments_bound
        || weight.0 > 2.0 * lr
        || (loss - single_loss).abs() > 1e-6 * single_loss.abs()
    {
        return Err(text);
    }
    Ok(text)
}

/// One step from `reference`'s weights with `kind` over a fresh one-rank group (`None`: a
/// single process); returns the loss and the checkpoint the strategy writes, read back.
fn strategy_step(
    device: Device,
    reference: &Networks,
    kind: Option<Strategy>,
    timeout: Duration,
) -> Result<(f64, std::collections::HashMap<String, Tensor>), String> {
    let mut learner = step_learner(device, Precision::Fp32, Some(reference))?;
    let dir = std::env::temp_dir().join(format!(
        "scdino-selftest-{}-{}",
        std::process::id(),
        kind.map_or("single".into(), |k| format!("{k:?}"))
    ));
    let files = ModelLayout::beside(&dir.join("scDINO_ViTs").join("selftest"))
        .expect("a scDINO_ViTs model folder");
    let group = match kind {
        None => None,
        Some(_) => {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("no free port: {e}"))?
                .port();
            let cuda = device.is_cuda();
            Some(
                ProcessGroup::new("127.0.0.1", port, 0, 1, timeout, cuda)
                    .map_err(|e| e.to_string())?,
            )
        }
    };
    let result = (|| {
        let mut chosen =
            selftest_strategy(kind.unwrap_or(Strategy::Ddp), group, &mut learner, &files)?;
        let out = learner
            .step(
                &step_batch(device),
                selftest_params(),
                0,
                chosen.strategy.as_mut(),
            )
            .map_err(|e| e.to_string())?;
        let meta = CheckpointMeta {
            format: crate::checkpoint::FORMAT.into(),
            epoch: 0,
            epoch_batch: 1,
            iteration: 1,
            seed: 0,
            fingerprint: "selftest".into(),
            config_yaml: String::new(),
            mean: vec![0.0; 3],
            std: vec![1.0; 3],
            epoch_totals: Default::default(),
            loss_scaler: None,
            dataset: None,
        };
        chosen
            .strategy
            .save(&learner, &files, &meta, None)
            .map_err(|e| e.to_string())?;
        let state = Tensor::read_safetensors(files.latest_checkpoint())
            .map_err(|e| e.to_string())?
            .into_iter()
            .collect();
        Ok((out.loss, state))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// All-reduce across every task of the job (NCCL on a GPU, else Gloo): rank r sends
/// `(r + 1) · i` for i < n; every element must be `i · W(W+1)/2` exactly (integers below 2^24
/// are exact in fp32).
fn all_reduce_check(env: &DistEnv, gpu: Option<Device>, timeout: Duration) -> Check {
    const NAME: &str = "all-reduce";
    if env.world < 2 {
        return Check::new(NAME, Status::Skip, "one task: nothing to reduce across");
    }
    let cuda = gpu.is_some() && crate::distributed::backend::NCCL_BUILT;
    run_check(NAME, || {
        let mut g = ProcessGroup::new(
            &env.master_addr,
            env.master_port,
            env.rank,
            env.world,
            timeout,
            cuda,
        )
        .map_err(|e| e.to_string())?;
        let n = 1i64 << 20;
        let device = if cuda { gpu.unwrap() } else { Device::Cpu };
        let mut t =
            (Tensor::arange(n, (Kind::Float, device)) * (env.rank as f64 + 1.0)).contiguous();
        g.all_reduce(std::slice::from_mut(&mut t), ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        let w = env.world as f64;
        let want = Tensor::arange(n, (Kind::Float, device)) * (w * (w + 1.0) / 2.0);
        let wrong = t.ne_tensor(&want).sum(Kind::Int64).int64_value(&[]);
        let detail = format!(
            "{} over {} ranks, {n} float32 elements, {wrong} wrong",
            if cuda { "NCCL" } else { "Gloo" },
            env.world
        );
        if wrong == 0 {
            Ok(detail)
        } else {
            Err(detail)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_checks_pass_and_the_gpu_ones_skip_on_a_cpu_node() {
        let r = run(
            &DistEnv::single(),
            &Options {
                timeout: Duration::from_secs(30),
            },
        );
        assert!(r.passed, "{}", r.table());
        let status = |name: &str| r.checks.iter().find(|c| c.name == name).unwrap().status;
        assert_eq!(status("train step cpu"), Status::Pass);
        // DDP and FSDP over a one-rank Gloo group on the CPU, against the single process.
        assert_eq!(status("ddp and fsdp step, one rank"), Status::Pass);
        // Two ranks as threads over Gloo on the CPU, each on half the batch, against one
        // process on the whole batch.
        assert_eq!(
            status("ddp step, two ranks on one device (gloo)"),
            Status::Pass
        );
        if tch::Cuda::device_count() == 0 {
            for name in ["cuda", "train step gpu fp32", "augment gpu vs cpu"] {
                assert_eq!(status(name), Status::Skip, "{name}");
            }
        }
        assert_eq!(status("all-reduce"), Status::Skip);
    }

    /// The comparison itself, CPU against CPU: identical in fp32, and bf16 autocast (which
    /// the CPU has too) within the stated tolerance.
    #[test]
    fn step_comparison_accepts_equal_steps_and_bf16_within_its_tolerance() {
        let d = step_matches_cpu(Device::Cpu, Precision::Fp32).unwrap();
        assert!(d.contains("worst |a-1| 0.0e0"), "{d}");
        assert!(d.contains("worst residual 0.0e0"), "{d}");
        let b = step_matches_cpu(Device::Cpu, Precision::Bf16).unwrap();
        eprintln!("cpu bf16 against cpu fp32: {b}");
    }

    /// A wrong update fails the comparison in every precision's bounds, naming the tensor: the
    /// sign flipped, half the lr, one of scDINO's two parameter groups not updated, one
    /// tensor not updated. (The old check, every parameter within 1e-3 absolute, passed all
    /// of these: the update itself is ~1e-4.)
    #[test]
    fn step_comparison_fails_a_wrong_update() {
        let cfg = step_config();
        tch::manual_seed(0);
        let reference = Networks::new(&cfg, 3, Device::Cpu);
        let cpu = step_on(Device::Cpu, Precision::Fp32, Some(&reference)).unwrap();
        let decay: Vec<bool> = {
            let nets = Networks::new(&cfg, 3, Device::Cpu);
            crate::train::optim::AdamW::new(&nets.student_vs)
                .params
                .iter()
                .map(|q| q.decay)
                .collect()
        };
        assert_eq!(decay.len(), cpu.names.len());
        assert!(decay.iter().any(|&d| d) && decay.iter().any(|&d| !d));
        let with = |f: &dyn Fn(usize, &Tensor, &Tensor) -> Tensor| -> Vec<Tensor> {
            (0..cpu.names.len())
                .map(|i| f(i, &cpu.before[i], &cpu.after[i]))
                .collect()
        };
        let old_check = |cand: &[Tensor]| {
            cpu.after
                .iter()
                .zip(cand)
                .map(|(a, b)| (a - b).abs().max().double_value(&[]))
                .fold(0.0f64, f64::max)
                <= 1e-3
        };
        let wrong: [(&str, Vec<Tensor>, Option<usize>); 4] = [
            ("sign", with(&|_, b, a| b - (a - b)), None),
            ("half lr", with(&|_, b, a| b + (a - b) * 0.5), None),
            (
                "no-decay group skipped",
                with(&|i, b, a| if decay[i] { a.copy() } else { b.copy() }),
                decay.iter().position(|&d| !d),
            ),
            (
                "one tensor skipped",
                with(&|i, b, a| if i == 3 { b.copy() } else { a.copy() }),
                Some(3),
            ),
        ];
        for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
            let tol = update_tolerance(precision);
            compare_updates(&cpu.names, &cpu.before, &cpu.after, &cpu.after, tol).unwrap();
            for (what, cand, names_tensor) in &wrong {
                assert!(
                    old_check(cand),
                    "{what}: the old check would have caught it"
                );
                let e = compare_updates(&cpu.names, &cpu.before, &cpu.after, cand, tol)
                    .expect_err(what);
                if let Some(i) = names_tensor {
                    assert!(e.contains(&format!("{}:", cpu.names[*i])), "{what}: {e}");
                }
            }
        }
    }

    #[test]
    fn augmentation_comparison_is_exact_on_one_device() {
        let d = augment_matches_cpu(Device::Cpu).unwrap();
        assert!(d.contains("max |diff| 0.0e0"), "{d}");
    }

    #[test]
    fn a_missing_library_fails_with_its_name_and_a_panic_is_a_failure() {
        let e = Library::open(&["libscdino-does-not-exist.so.9"])
            .err()
            .unwrap();
        assert!(e.contains("libscdino-does-not-exist.so.9"), "{e}");
        let c = run_check("boom", || panic!("inside libtorch"));
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("inside libtorch"), "{}", c.detail);
    }
}
