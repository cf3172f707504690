//! `trainer bench matmul`: fp32 matmul throughput (n×n · n×n), the ceiling the step's GFLOP/s
//! are read against (peer: bench/matmul.py).
use super::BenchError;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// What `trainer bench matmul` measures.
#[derive(Debug, Clone, clap::Args)]
pub struct MatmulOptions {
    #[arg(long, default_value_t = 2048)]
    pub n: i64,
    #[arg(long, default_value_t = 2)]
    pub threads: i32,
    #[arg(long, default_value_t = 10)]
    pub reps: usize,
}

impl MatmulOptions {
    /// The best of `reps` products into one preallocated output, after one warm-up.
    pub fn run(&self) -> Result<serde_json::Value, BenchError> {
        tch::set_num_threads(self.threads);
        tch::manual_seed(0);
        let opts = (Kind::Float, Device::Cpu);
        let a = Tensor::randn([self.n, self.n], opts);
        let b = Tensor::randn([self.n, self.n], opts);
        let out = Tensor::empty([self.n, self.n], opts);
        let _ = a.f_matmul_out(&out, &b)?; // warm-up
        let mut best = f64::INFINITY;
        for _ in 0..self.reps.max(1) {
            let t = Instant::now();
            let _ = a.f_matmul_out(&out, &b)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        let flops = 2.0 * (self.n as f64).powi(3);
        Ok(serde_json::json!({
            "impl": "rust-tch",
            "bench": "matmul",
            "n": self.n,
            "threads": self.threads,
            "best_s": best,
            "gflops": flops / best / 1e9,
        }))
    }
}
