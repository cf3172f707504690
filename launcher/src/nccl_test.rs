//! `launcher nccl-test`: one job that runs `trainer collectives-bench` with one task per GPU
//! across the nodes, through the same script renderer (srun, Pyxis, env, rendezvous) as
//! training, so a passing test means training's own collectives work on that allocation.
//! The verdict is read back from the JSON report rank 0 prints into the job's log.
use crate::cluster::Cluster;
use crate::render::{self, Allocation, Rendered};
use serde::Deserialize;
use std::path::Path;

pub const JOB_NAME: &str = "nccl-test";
/// The `kind` field of the trainer's report (`trainer::distributed::bench::REPORT_KIND`).
pub const REPORT_KIND: &str = "scdino.collectives_bench";

/// What to measure; the byte counts are passed through as written (`64M`, `1G`, ...).
#[derive(Debug, Clone)]
pub struct Options {
    /// Default: `slurm.nodes`.
    pub nodes: Option<u32>,
    /// Default: `slurm.tasks_per_node` (one task per GPU, or 1 on clusters without GPUs).
    pub tasks_per_node: Option<u32>,
    pub op: String,
    pub min_bytes: String,
    pub max_bytes: String,
    pub factor: u32,
    pub iters: u32,
    pub warmup: u32,
    pub min_busbw: Option<f64>,
    /// `--backend` for the trainer; None lets it choose (NCCL on GPUs, else Gloo).
    pub backend: Option<String>,
}

impl Options {
    pub fn allocation(&self, cluster: &Cluster) -> Allocation {
        Allocation::of(cluster, self.nodes, self.tasks_per_node)
    }

    /// The trainer's words, one option per line of the script.
    fn trainer_args(&self) -> Vec<Vec<String>> {
        let mut a: Vec<Vec<String>> = vec![
            vec!["collectives-bench".into()],
            vec!["--op".into(), self.op.clone()],
            vec!["--min-bytes".into(), self.min_bytes.clone()],
            vec!["--max-bytes".into(), self.max_bytes.clone()],
            vec!["--factor".into(), self.factor.to_string()],
            vec!["--iters".into(), self.iters.to_string()],
            vec!["--warmup".into(), self.warmup.to_string()],
        ];
        if let Some(m) = self.min_busbw {
            a.push(vec!["--min-busbw".into(), m.to_string()]);
        }
        if let Some(b) = &self.backend {
            a.push(vec!["--backend".into(), b.clone()]);
        }
        a.push(vec!["--json".into(), "-".into()]);
        a
    }
}

/// The script and a one-job manifest (so `launcher status/cancel --out` work on it too).
pub fn render(
    cluster: &Cluster,
    opts: &Options,
    out: &Path,
    cwd: &Path,
) -> anyhow::Result<Rendered> {
    anyhow::ensure!(
        opts.factor >= 1 && opts.iters >= 1,
        "--factor and --iters must be at least 1"
    );
    if let Some(m) = opts.min_busbw {
        anyhow::ensure!(
            m.is_finite() && m >= 0.0,
            "--min-busbw must be a number >= 0"
        );
    }
    render::one_job(
        cluster,
        JOB_NAME,
        opts.allocation(cluster),
        &opts.trainer_args(),
        out,
        cwd,
    )
}

/// The parts of the trainer's JSON report the verdict needs.
#[derive(Debug, Clone, Deserialize)]
pub struct Report {
    pub kind: String,
    pub backend: String,
    pub world: usize,
    pub ops: Vec<OpReport>,
    pub wrong: u64,
    pub passed: bool,
    #[serde(default)]
    pub failures: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct OpReport {
    pub op: String,
    pub sizes: Vec<SizeReport>,
    pub avg_busbw_gbps: f64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SizeReport {
    pub size_bytes: u64,
    pub time_us: f64,
    pub busbw_gbps: f64,
    pub wrong: u64,
}

/// The last report line of a job log (other lines: the table, the batch script's echoes, the
/// ranks' stderr).
pub fn find_report(log: &str) -> Option<Report> {
    log.lines()
        .rev()
        .filter(|l| l.trim_start().starts_with('{'))
        .filter_map(|l| serde_json::from_str::<Report>(l.trim()).ok())
        .find(|r| r.kind == REPORT_KIND)
}

/// The launcher's own verdict from the report: every rank took part, no wrong element, and
/// every op's average busbw reaches the gate. Returns the reasons for failing.
pub fn judge(report: &Report, world: usize, min_busbw: Option<f64>) -> Vec<String> {
    let mut why = Vec::new();
    if report.world != world {
        why.push(format!(
            "{} ranks took part, the allocation has {world} tasks",
            report.world
        ));
    }
    if report.ops.is_empty() {
        why.push("the report holds no measurement".into());
    }
    if report.wrong > 0 {
        why.push(format!("{} wrong elements", report.wrong));
    }
    if let Some(min) = min_busbw {
        for o in &report.ops {
            if o.avg_busbw_gbps.is_nan() || o.avg_busbw_gbps < min {
                why.push(format!(
                    "{}: average busbw {:.3} GB/s is below the gate {min} GB/s",
                    o.op, o.avg_busbw_gbps
                ));
            }
        }
    }
    if why.is_empty() && !report.passed {
        // The trainer failed for a reason we did not see: trust the stricter side.
        why.extend(report.failures.iter().cloned());
        if why.is_empty() {
            why.push("the trainer reported a failure".into());
        }
    }
    why
}

/// A short table of the report for the terminal.
pub fn summary(r: &Report) -> String {
    let mut o = format!(
        "{:<15} {:>12} {:>11} {:>9} {:>7}\n",
        "op", "size (B)", "time (us)", "busbw", "#wrong"
    );
    for op in &r.ops {
        for s in &op.sizes {
            o += &format!(
                "{:<15} {:>12} {:>11.1} {:>9.3} {:>7}\n",
                op.op, s.size_bytes, s.time_us, s.busbw_gbps, s.wrong
            );
        }
        o += &format!(
            "{:<15} average busbw {:.3} GB/s\n",
            op.op, op.avg_busbw_gbps
        );
    }
    o
}

#[cfg(test)]
mod tests;
