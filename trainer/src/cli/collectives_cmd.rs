//! `trainer collectives-bench`: nccl-tests-style bandwidth and correctness of the collectives,
//! over the process group training uses, with the ranks found the way training finds them
//! (torchrun variables from `trainer launch`, or Slurm's under srun).
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;
use tch::Device;
use trainer::distributed::backend::{self, Backend, BackendChoice};
use trainer::distributed::collectives_bench::{self as bench, BenchOptions, Op};
use trainer::distributed::env::DistEnv;
use trainer::distributed::group::ProcessGroup;

/// Spelled like nccl-tests' binaries and torch.distributed (`all_reduce`).
#[derive(Debug, Clone, Copy, ValueEnum)]
#[value(rename_all = "snake_case")]
enum OpArg {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    All,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BackendArg {
    Auto,
    Gloo,
    Nccl,
}

#[derive(Debug, Args)]
pub struct CollectivesArgs {
    /// The collective to measure (`all`: each in turn).
    #[arg(long, value_enum, default_value = "all")]
    op: OpArg,
    /// Smallest buffer in bytes (suffixes K, M, G are binary, as in nccl-tests' -b).
    #[arg(long, default_value = "1M", value_parser = bench::parse_bytes)]
    min_bytes: u64,
    /// Largest buffer in bytes (nccl-tests' -e).
    #[arg(long, default_value = "64M", value_parser = bench::parse_bytes)]
    max_bytes: u64,
    /// Multiply the size by this between steps (nccl-tests' -f).
    #[arg(long, default_value_t = 2)]
    factor: u64,
    /// Timed operations per size (nccl-tests' -n).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed operations per size before the timed ones (nccl-tests' -w).
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Fail (exit 1) if any op's busbw averaged over the sizes is below this many GB/s.
    #[arg(long)]
    min_busbw: Option<f64>,
    /// `auto`: NCCL on GPUs when built with the `nccl` feature, else Gloo.
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendArg,
    /// Also write the report as one JSON line to this file (`-`: stdout, after the table).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Seconds a rendezvous or a collective may take before the run fails.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

impl CollectivesArgs {
    pub fn run(self) -> Result<()> {
        let denv = DistEnv::from_process_env()?;
        let choice = match self.backend {
            BackendArg::Auto => BackendChoice::Auto,
            BackendArg::Gloo => BackendChoice::Gloo,
            BackendArg::Nccl => BackendChoice::Nccl,
        };
        let backend = backend::select(choice, tch::Cuda::is_available(), backend::NCCL_BUILT)
            .map_err(anyhow::Error::msg)?;
        let device = match backend {
            Backend::Gloo => Device::Cpu,
            Backend::Nccl => Device::Cuda(denv.local_rank),
        };
        let ops = match self.op {
            OpArg::AllReduce => vec![Op::AllReduce],
            OpArg::AllGather => vec![Op::AllGather],
            OpArg::ReduceScatter => vec![Op::ReduceScatter],
            OpArg::Broadcast => vec![Op::Broadcast],
            OpArg::All => Op::ALL.to_vec(),
        };
        let sizes = bench::size_sequence(self.min_bytes, self.max_bytes, self.factor)?;
        if let Some(m) = self.min_busbw {
            anyhow::ensure!(
                m.is_finite() && m >= 0.0,
                "--min-busbw must be a number >= 0"
            );
        }
        let mut group = ProcessGroup::new(
            &denv.master_addr,
            denv.master_port,
            denv.rank,
            denv.world,
            Duration::from_secs(self.timeout),
            backend == Backend::Nccl,
        )
        .with_context(|| format!("joining the process group ({})", denv.source))?;
        if denv.rank == 0 {
            tracing::info!(
                "collectives-bench: {} ranks ({}), master {}:{}, backend {backend}",
                denv.world,
                denv.source,
                denv.master_addr,
                denv.master_port
            );
            // Gloo's reduce_scatter reduces with ATen ops on its worker threads, whose OpenMP
            // pool size comes from the environment at start-up: with every rank using every
            // core it ran 14× slower on 2 vCPUs. torchrun sets 1 for the same reason.
            if backend == Backend::Gloo
                && denv.world > 1
                && std::env::var_os("OMP_NUM_THREADS").is_none()
            {
                tracing::warn!(
                    "OMP_NUM_THREADS is not set, so every rank's Gloo reductions use every core; set OMP_NUM_THREADS=1 (as torchrun does) for representative numbers"
                );
            }
        }
        let report = bench::run(
            &mut group,
            &BenchOptions {
                ops,
                sizes,
                iters: self.iters,
                warmup: self.warmup,
                min_busbw_gbps: self.min_busbw,
                device,
                backend: backend.to_string(),
            },
        )?;
        if denv.rank == 0 {
            print!("{}", report.table());
            let line = serde_json::to_string(&report)?;
            match &self.json {
                Some(p) if p.as_os_str() == "-" => println!("{line}"),
                Some(p) => std::fs::write(p, line + "\n")
                    .with_context(|| format!("writing {}", p.display()))?,
                None => {}
            }
        }
        // Every rank has the same summed counts and times, so every rank fails alike.
        if !report.passed {
            bail!("collectives-bench FAILED: {}", report.failures.join("; "));
        }
        Ok(())
    }
}
