//! `trainer bench probe`: the linear probe's L-BFGS fit on a safetensors file of features `x`
//! [n, d] and labels `y` [n] (bench/linear_probe.sh writes it and runs scikit-learn's
//! `LogisticRegression` on the same file).
use super::BenchError;
use crate::analysis::linear_probe;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tch::{Kind, Tensor};

/// What `trainer bench probe` measures.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeOptions {
    #[arg(long)]
    pub data: PathBuf,
    /// λ of mean cross-entropy + λ/2·‖W‖².
    #[arg(long, default_value_t = 1e-4)]
    pub l2: f64,
    #[arg(long, default_value_t = 500)]
    pub max_iterations: usize,
    #[arg(long, default_value_t = 2)]
    pub threads: i32,
}

impl ProbeOptions {
    /// Load and fit timed apart, with the objective reached and the training top-1.
    pub fn run(&self) -> Result<serde_json::Value, BenchError> {
        tch::set_num_threads(self.threads);
        let t0 = Instant::now();
        let mut tensors: HashMap<String, Tensor> = Tensor::read_safetensors(&self.data)
            .map_err(|source| BenchError::Tensors {
                path: self.data.clone(),
                source,
            })?
            .into_iter()
            .collect();
        let x = take(&mut tensors, &self.data, "x")?;
        let y = Vec::<i64>::try_from(take(&mut tensors, &self.data, "y")?.to_kind(Kind::Int64))?;
        if y.is_empty() || y.iter().any(|&label| label < 0) {
            return Err(BenchError::Invalid(format!(
                "{}: y must hold at least one label, each ≥ 0",
                self.data.display()
            )));
        }
        let classes = y.iter().copied().max().unwrap_or(0) as usize + 1;
        let load_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let probe = linear_probe::fit(&x, &y, classes, self.l2, self.max_iterations);
        let fit_s = t1.elapsed().as_secs_f64();
        let pred = Vec::<i64>::try_from(probe.logits(&x).argmax(1, false))?;
        let correct = pred.iter().zip(&y).filter(|(a, b)| a == b).count();
        Ok(serde_json::json!({
            "impl": "rust",
            "bench": "linear_probe",
            "rows": y.len(),
            "dim": x.size()[1],
            "classes": classes,
            "l2": self.l2,
            "threads": self.threads,
            "load_s": load_s,
            "fit_s": fit_s,
            "iterations": probe.iterations,
            "objective": probe.objective,
            "train_top1_percent": correct as f64 * 100.0 / y.len() as f64,
        }))
    }
}

/// Tensor `name` of the file, or an error naming both.
fn take(
    tensors: &mut HashMap<String, Tensor>,
    path: &Path,
    name: &str,
) -> Result<Tensor, BenchError> {
    tensors
        .remove(name)
        .ok_or_else(|| BenchError::Invalid(format!("{}: no tensor {name:?}", path.display())))
}
