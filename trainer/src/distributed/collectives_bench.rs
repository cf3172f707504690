//! An nccl-tests-style benchmark of our process group's collectives, so a cluster's fabric can
//! be checked with the very code path training uses (same rendezvous, same c10d backend)
//! instead of a separately built nccl-tests binary.
//!
//! Conventions follow nccl-tests (`doc/PERFORMANCE.md`): `size` is the largest buffer of the
//! operation in bytes (the tensor of all_reduce/broadcast, the gathered output of all_gather,
//! the scattered input of reduce_scatter), `algbw = size / time` with 1 GB = 1e9 B, and
//! `busbw = algbw · factor` with the factors of [`Op::bus_factor`]. Time is the mean over
//! `iters` timed operations, averaged across ranks (nccl-tests' default `-a 1`).
//!
//! Correctness is checked after the timed loop on freshly filled buffers whose reduced values
//! have a closed form; every rank counts its wrong elements and the counts are summed, so all
//! ranks reach the same verdict and exit alike.
//!
//! The gate: every benchmarked op's *average busbw over the sizes* must reach `min_busbw`, as
//! nccl-tests' `NCCL_TESTS_MIN_BW` does (which, unlike us, allows 10 % slack). Small sizes pull
//! the average down, so gate runs should use a narrow range of large sizes.
use super::group::{DistError, ProcessGroup, ReduceOp};
use serde::{Deserialize, Serialize};
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// Bytes per element: every buffer is float32.
pub const ELEMENT_BYTES: u64 = 4;
/// `kind` of the JSON report, so a reader can find it among other log lines.
pub const REPORT_KIND: &str = "scdino.collectives_bench";

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Dist(#[from] DistError),
    #[error("{0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
}

impl Op {
    pub const ALL: [Op; 4] = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
        }
    }

    pub fn parse(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == s)
    }

    /// nccl-tests' bus-bandwidth factor: what each rank must move over its slowest link, per
    /// byte of `size`, for a ring implementation to finish.
    pub fn bus_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather | Op::ReduceScatter => (n - 1.0) / n,
            Op::Broadcast => 1.0,
        }
    }

    /// Whether the buffer is split into one shard per rank (so its size must divide by it).
    fn sharded(self) -> bool {
        matches!(self, Op::AllGather | Op::ReduceScatter)
    }

    fn redop(self) -> &'static str {
        match self {
            Op::AllReduce | Op::ReduceScatter => "sum",
            _ => "none",
        }
    }

    fn root(self) -> i64 {
        if self == Op::Broadcast {
            0
        } else {
            -1
        }
    }
}

/// `min, min·factor, min·factor², …` up to and including `max`, as nccl-tests' `-b -e -f`.
pub fn size_sequence(min: u64, max: u64, factor: u64) -> Result<Vec<u64>, BenchError> {
    if min == 0 {
        return Err(BenchError::Invalid("--min-bytes must be at least 1".into()));
    }
    if max < min {
        return Err(BenchError::Invalid(format!(
            "--max-bytes ({max}) is below --min-bytes ({min})"
        )));
    }
    if factor < 2 && min != max {
        return Err(BenchError::Invalid(
            "--factor must be at least 2 when --min-bytes and --max-bytes differ".into(),
        ));
    }
    let mut out = vec![min];
    let mut s = min;
    while let Some(next) = s.checked_mul(factor).filter(|&n| n <= max && n > s) {
        out.push(next);
        s = next;
    }
    Ok(out)
}

/// The bytes actually moved for a requested size: whole float32 elements and, for sharded ops,
/// a whole number of elements per rank (nccl-tests rounds the same way); at least one element
/// (per rank).
pub fn effective_bytes(op: Op, requested: u64, world: usize) -> u64 {
    let unit = ELEMENT_BYTES * if op.sharded() { world as u64 } else { 1 };
    (requested / unit).max(1) * unit
}

/// Parses `8`, `64K`, `1M`, `2G` (binary multiples, like nccl-tests' `-b`/`-e`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a byte count (e.g. 8, 64K, 1M, 2G)"))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeResult {
    pub size_bytes: u64,
    /// Elements of the `size` buffer (nccl-tests' `count` column).
    pub count: u64,
    pub time_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    /// Elements that differed from the closed form, summed over ranks.
    pub wrong: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpResult {
    pub op: Op,
    pub bus_factor: f64,
    pub sizes: Vec<SizeResult>,
    pub avg_busbw_gbps: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub kind: String,
    pub backend: String,
    pub world: usize,
    pub dtype: String,
    pub iters: usize,
    pub warmup: usize,
    /// What `min_busbw_gbps` is compared with.
    pub gate: String,
    pub min_busbw_gbps: Option<f64>,
    pub ops: Vec<OpResult>,
    pub wrong: u64,
    pub passed: bool,
    /// Why the run failed (empty when it passed).
    pub failures: Vec<String>,
}

pub const GATE_RULE: &str = "average busbw over the sizes, per op";

impl Report {
    /// Fills `wrong`, `passed` and `failures` from the measurements and the gate.
    pub fn judge(&mut self) {
        self.wrong = self
            .ops
            .iter()
            .flat_map(|o| &o.sizes)
            .map(|s| s.wrong)
            .sum();
        let mut failures = Vec::new();
        for o in &self.ops {
            for s in o.sizes.iter().filter(|s| s.wrong > 0) {
                failures.push(format!(
                    "{} of {} B: {} wrong elements",
                    o.op.name(),
                    s.size_bytes,
                    s.wrong
                ));
            }
            if let Some(min) = self.min_busbw_gbps {
                // A NaN average (no finite timing) fails too.
                if o.avg_busbw_gbps.is_nan() || o.avg_busbw_gbps < min {
                    failures.push(format!(
                        "{}: average busbw {:.3} GB/s is below the gate {min} GB/s",
                        o.op.name(),
                        o.avg_busbw_gbps
                    ));
                }
            }
        }
        self.passed = failures.is_empty();
        self.failures = failures;
    }

    /// The nccl-tests-like table rank 0 prints.
    pub fn table(&self) -> String {
        let mut o = String::new();
        o += &format!(
            "# collectives-bench: backend {}, {} ranks, {}, {} timed iterations after {} warm-up\n",
            self.backend, self.world, self.dtype, self.iters, self.warmup
        );
        o += "#\n";
        o += &format!(
            "# {:>14} {:>12} {:>12} {:>6} {:>5} {:>5} {:>11} {:>8} {:>8} {:>7}\n",
            "op", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"
        );
        o += &format!(
            "# {:>14} {:>12} {:>12} {:>6} {:>5} {:>5} {:>11} {:>8} {:>8} {:>7}\n",
            "", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
        for op in &self.ops {
            for s in &op.sizes {
                o += &format!(
                    "  {:>14} {:>12} {:>12} {:>6} {:>5} {:>5} {:>11.1} {:>8.3} {:>8.3} {:>7}\n",
                    op.op.name(),
                    s.size_bytes,
                    s.count,
                    "float",
                    op.op.redop(),
                    op.op.root(),
                    s.time_us,
                    s.algbw_gbps,
                    s.busbw_gbps,
                    s.wrong
                );
            }
        }
        o += &format!(
            "# Out of bounds values : {} {}\n",
            self.wrong,
            if self.wrong == 0 { "OK" } else { "FAILED" }
        );
        for op in &self.ops {
            o += &format!(
                "# Avg bus bandwidth {:<14} : {:.3} GB/s (busbw factor {:.3})\n",
                op.op.name(),
                op.avg_busbw_gbps,
                op.bus_factor
            );
        }
        match self.min_busbw_gbps {
            Some(m) => {
                o += &format!(
                    "# Gate: {} >= {m} GB/s: {}\n",
                    GATE_RULE,
                    if self.passed { "PASSED" } else { "FAILED" }
                )
            }
            None => o += "# Gate: none (--min-busbw not given); correctness only\n",
        }
        for f in &self.failures {
            o += &format!("# FAILED: {f}\n");
        }
        o
    }
}

pub struct BenchOptions {
    pub ops: Vec<Op>,
    pub sizes: Vec<u64>,
    pub iters: usize,
    pub warmup: usize,
    pub min_busbw_gbps: Option<f64>,
    /// Where the buffers live: CPU for Gloo, the rank's GPU for NCCL.
    pub device: Device,
    /// Name of the backend, for the report.
    pub backend: String,
}

/// `i ↦ (i mod 7) + 1` from `start`: small integers, so every sum below is exact in float32.
fn pattern(start: i64, count: i64, device: Device) -> Tensor {
    Tensor::arange_start(start, start + count, (Kind::Float, device)).fmod(7) + 1.0
}

/// The buffers of one op, filled with rank-dependent data: rank r holds `(r+1)·pattern`.
struct Buffers {
    input: Tensor,
    output: Tensor,
}

fn buffers(op: Op, bytes: u64, rank: usize, world: usize, device: Device) -> Buffers {
    let count = (bytes / ELEMENT_BYTES) as i64;
    let w = (rank + 1) as f64;
    let shard = count / world as i64;
    match op {
        Op::AllReduce | Op::Broadcast => {
            let t = pattern(0, count, device) * w;
            Buffers {
                input: t.shallow_clone(),
                output: t,
            }
        }
        Op::AllGather => Buffers {
            input: pattern(0, shard, device) * w,
            output: Tensor::zeros([count], (Kind::Float, device)),
        },
        Op::ReduceScatter => Buffers {
            input: pattern(0, count, device) * w,
            output: Tensor::zeros([shard], (Kind::Float, device)),
        },
    }
}

/// What `output` must hold on `rank` after the op, in closed form.
fn expected(op: Op, bytes: u64, rank: usize, world: usize, device: Device) -> Tensor {
    let count = (bytes / ELEMENT_BYTES) as i64;
    let shard = count / world as i64;
    let rank_sum = (world * (world + 1) / 2) as f64; // Σ (r+1)
    match op {
        Op::AllReduce => pattern(0, count, device) * rank_sum,
        Op::Broadcast => pattern(0, count, device), // root 0 holds 1·pattern
        Op::AllGather => {
            let weights = Tensor::arange_start(1, world as i64 + 1, (Kind::Float, device));
            (weights.unsqueeze(1) * pattern(0, shard, device).unsqueeze(0)).flatten(0, -1)
        }
        Op::ReduceScatter => pattern(rank as i64 * shard, shard, device) * rank_sum,
    }
}

/// Elements of `output` (the result of `op` on `rank` from the benchmark's fill) that differ
/// from the closed form.
pub fn wrong_elements(op: Op, output: &Tensor, rank: usize, world: usize) -> i64 {
    let count = output.numel() as u64
        * if op == Op::ReduceScatter {
            world as u64
        } else {
            1
        };
    let want = expected(op, count * ELEMENT_BYTES, rank, world, output.device());
    output.ne_tensor(&want).sum(Kind::Int64).int64_value(&[])
}

/// Runs `op` once on buffers filled for `rank` and returns the output (for tests of the check).
pub fn run_checked_once(g: &mut ProcessGroup, op: Op, bytes: u64) -> Result<Tensor, DistError> {
    let mut b = buffers(
        op,
        effective_bytes(op, bytes, g.world),
        g.rank,
        g.world,
        Device::Cpu,
    );
    run_once(g, op, &mut b)?;
    Ok(b.output)
}

fn run_once(g: &mut ProcessGroup, op: Op, b: &mut Buffers) -> Result<(), DistError> {
    match op {
        Op::AllReduce => g.all_reduce(std::slice::from_mut(&mut b.output), ReduceOp::Sum),
        Op::Broadcast => g.broadcast(&mut b.output, 0),
        Op::AllGather => g.all_gather(&mut b.output, &b.input),
        Op::ReduceScatter => g.reduce_scatter(&mut b.output, &b.input, ReduceOp::Sum),
    }
}

/// Waits for queued device work: c10d's `wait` only orders CUDA streams, it does not block
/// the host, so a GPU timing without this would measure the enqueueing.
fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Sums one number over the ranks (float64 so counts stay exact).
fn sum_over_ranks(g: &mut ProcessGroup, x: f64, device: Device) -> Result<f64, DistError> {
    let mut t = Tensor::from_slice(&[x]).to_device(device);
    g.all_reduce(std::slice::from_mut(&mut t), ReduceOp::Sum)?;
    Ok(f64::try_from(t.to_device(Device::Cpu)).expect("a one-element float64 tensor"))
}

fn measure(
    g: &mut ProcessGroup,
    op: Op,
    requested: u64,
    o: &BenchOptions,
) -> Result<SizeResult, DistError> {
    let (rank, world) = (g.rank, g.world);
    let bytes = effective_bytes(op, requested, world);
    let mut b = buffers(op, bytes, rank, world, o.device);
    for _ in 0..o.warmup {
        run_once(g, op, &mut b)?;
    }
    sync(o.device);
    g.barrier()?;
    let t0 = Instant::now();
    for _ in 0..o.iters {
        run_once(g, op, &mut b)?;
    }
    sync(o.device);
    let local = t0.elapsed().as_secs_f64() / o.iters.max(1) as f64;
    let sec = sum_over_ranks(g, local, o.device)? / world as f64;

    // The check: fresh buffers (the timed all_reduce has scaled its own), one more op.
    let mut b = buffers(op, bytes, rank, world, o.device);
    run_once(g, op, &mut b)?;
    let local_wrong = wrong_elements(op, &b.output, rank, world);
    let wrong = sum_over_ranks(g, local_wrong as f64, o.device)? as u64;

    let algbw = bytes as f64 / 1e9 / sec;
    Ok(SizeResult {
        size_bytes: bytes,
        count: bytes / ELEMENT_BYTES,
        time_us: sec * 1e6,
        algbw_gbps: algbw,
        busbw_gbps: algbw * op.bus_factor(world),
        wrong,
    })
}

/// Runs every op over every size on this rank; every rank must call it with the same options.
pub fn run(g: &mut ProcessGroup, o: &BenchOptions) -> Result<Report, BenchError> {
    if o.ops.is_empty() || o.sizes.is_empty() {
        return Err(BenchError::Invalid("nothing to benchmark".into()));
    }
    if o.iters == 0 {
        return Err(BenchError::Invalid("--iters must be at least 1".into()));
    }
    let mut ops = Vec::new();
    for &op in &o.ops {
        let mut sizes = Vec::new();
        for &s in &o.sizes {
            sizes.push(measure(g, op, s, o)?);
        }
        let avg = sizes.iter().map(|s| s.busbw_gbps).sum::<f64>() / sizes.len() as f64;
        ops.push(OpResult {
            op,
            bus_factor: op.bus_factor(g.world),
            sizes,
            avg_busbw_gbps: avg,
        });
    }
    let mut report = Report {
        kind: REPORT_KIND.into(),
        backend: o.backend.clone(),
        world: g.world,
        dtype: "float32".into(),
        iters: o.iters,
        warmup: o.warmup,
        gate: GATE_RULE.into(),
        min_busbw_gbps: o.min_busbw_gbps,
        ops,
        wrong: 0,
        passed: false,
        failures: Vec::new(),
    };
    report.judge();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_factors_are_nccl_tests() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        for (n, ar, ag) in [
            (1, 0.0, 0.0),
            (2, 1.0, 0.5),
            (4, 1.5, 0.75),
            (8, 1.75, 0.875),
        ] {
            assert!(close(Op::AllReduce.bus_factor(n), ar), "all_reduce n={n}");
            assert!(close(Op::AllGather.bus_factor(n), ag), "all_gather n={n}");
            assert!(
                close(Op::ReduceScatter.bus_factor(n), ag),
                "reduce_scatter n={n}"
            );
            assert!(close(Op::Broadcast.bus_factor(n), 1.0), "broadcast n={n}");
        }
        for op in Op::ALL {
            assert_eq!(Op::parse(op.name()), Some(op));
        }
        assert_eq!(Op::parse("alltoall"), None);
    }

    #[test]
    fn sizes_are_geometric_and_inclusive() {
        assert_eq!(size_sequence(8, 128, 2).unwrap(), [8, 16, 32, 64, 128]);
        assert_eq!(size_sequence(1024, 5000, 4).unwrap(), [1024, 4096]);
        assert_eq!(size_sequence(1 << 20, 1 << 20, 1).unwrap(), [1 << 20]);
        assert_eq!(size_sequence(3, 10, 3).unwrap(), [3, 9]);
        // No overflow near u64::MAX.
        assert_eq!(size_sequence(u64::MAX / 2, u64::MAX, 4).unwrap().len(), 1);
        assert!(size_sequence(0, 8, 2).is_err());
        assert!(size_sequence(16, 8, 2).is_err());
        assert!(size_sequence(8, 16, 1).is_err());
    }

    #[test]
    fn byte_counts_round_to_whole_elements_per_rank() {
        assert_eq!(effective_bytes(Op::AllReduce, 1000, 3), 1000);
        assert_eq!(effective_bytes(Op::AllReduce, 1001, 3), 1000);
        assert_eq!(effective_bytes(Op::AllReduce, 1, 3), 4);
        assert_eq!(effective_bytes(Op::AllGather, 1000, 3), 996);
        assert_eq!(effective_bytes(Op::ReduceScatter, 8, 4), 16);
        assert_eq!(parse_bytes("8").unwrap(), 8);
        assert_eq!(parse_bytes("64K").unwrap(), 65536);
        assert_eq!(parse_bytes("1m").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("2G").unwrap(), 2 << 30);
        assert!(parse_bytes("1.5M").is_err());
        assert!(parse_bytes("M").is_err());
    }

    fn report(avg: &[f64], wrong: u64, min: Option<f64>) -> Report {
        let ops = avg
            .iter()
            .zip(Op::ALL)
            .map(|(&a, op)| OpResult {
                op,
                bus_factor: 1.0,
                sizes: vec![SizeResult {
                    size_bytes: 4,
                    count: 1,
                    time_us: 1.0,
                    algbw_gbps: a,
                    busbw_gbps: a,
                    wrong,
                }],
                avg_busbw_gbps: a,
            })
            .collect();
        let mut r = Report {
            kind: REPORT_KIND.into(),
            backend: "gloo".into(),
            world: 2,
            dtype: "float32".into(),
            iters: 1,
            warmup: 0,
            gate: GATE_RULE.into(),
            min_busbw_gbps: min,
            ops,
            wrong: 0,
            passed: false,
            failures: vec![],
        };
        r.judge();
        r
    }

    #[test]
    fn the_gate_fails_on_any_slow_op_wrong_values_or_nan() {
        assert!(report(&[2.0, 3.0], 0, Some(2.0)).passed);
        assert!(report(&[2.0, 3.0], 0, None).passed);
        let slow = report(&[2.0, 1.5], 0, Some(2.0));
        assert!(!slow.passed);
        assert_eq!(slow.failures.len(), 1);
        assert!(
            slow.failures[0].starts_with("all_gather:"),
            "{:?}",
            slow.failures
        );
        assert!(slow
            .table()
            .contains("# Gate: average busbw over the sizes, per op >= 2 GB/s: FAILED"));
        let wrong = report(&[5.0], 3, None);
        assert!(!wrong.passed);
        assert_eq!(wrong.wrong, 3);
        assert!(wrong.table().contains("# Out of bounds values : 3 FAILED"));
        assert!(!report(&[f64::NAN], 0, Some(0.0)).passed);
    }
}
