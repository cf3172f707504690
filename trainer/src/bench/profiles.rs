//! `trainer bench profiles`: the features of `--rows` images written and read back as scDINO's
//! `%.18e` CSV and as the Parquet profile table, timed and sized; bench/profiles.sh runs the
//! Python side (numpy/pandas/polars) on the same files and sizes.
use super::BenchError;
use crate::analysis::features::{self, FeatureSet};
use crate::analysis::knn::read_features_csv;
use crate::analysis::profiles::{self, ProfileRows};
use crate::config::DatasetLocation;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tch::Tensor;

/// What `trainer bench profiles` measures.
#[derive(Debug, Clone, clap::Args)]

pub struct ProfilesOptions {
    /// Images (rows); 90,851 is the size of scDINO's full PBMC dataset.
    #[arg(long, default_value_t = 90_851)]
    pub rows: usize,
    /// Feature dimension (384: vit_small).
    #[arg(long, default_value_t = 384)]
    pub dim: usize,
    /// Folder the files are written to (kept for the peer script).
    #[arg(long)]
    pub out: PathBuf,
}

impl ProfilesOptions {
    /// Both formats written and read back (each checked equal to what was written), timed.
    pub fn run(&self) -> Result<serde_json::Value, BenchError> {
        std::fs::create_dir_all(&self.out).map_err(|e| BenchError::io(&self.out, e))?;
        let set = synthetic_set(self.rows, self.dim);
        let csv = self.out.join("bench_features.csv");
        let table = self.out.join("bench_profiles.parquet");
        let t = Instant::now();
        features::write_csv(&csv, &set.features)?;
        let csv_write = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let rows = [ProfileRows {
            set: &set,
            split: "heldout",
            root: &DatasetLocation::Local("/data/Training".into()),
        }];
        profiles::write(&table, &rows, &["DAPI".into(), "CD3".into(), "CD8".into()])?;
        let parquet_write = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let from_csv = read_features_csv(&csv)?;
        let csv_read = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let from_table = profiles::read(&table)?;
        let parquet_read = t.elapsed().as_secs_f64();
        if !from_table.features.equal(&set.features) {
            return Err(BenchError::Invalid(format!(
                "{}: the table did not read back bit for bit",
                table.display()
            )));
        }
        let csv_err = (from_csv.to_kind(tch::Kind::Float) - &set.features)
            .abs()
            .max()
            .double_value(&[]);
        if csv_err != 0.0 {
            return Err(BenchError::Invalid(format!(
                "{}: the CSV read back with error {csv_err}",
                csv.display()
            )));
        }
        Ok(serde_json::json!({
            "rows": self.rows, "dim": self.dim,
            "csv_bytes": file_bytes(&csv)?,
            "parquet_bytes": file_bytes(&table)?,
            "csv_write_s": csv_write, "parquet_write_s": parquet_write,
            "csv_read_s": csv_read, "parquet_read_s": parquet_read,
        }))
    }
}

fn file_bytes(path: &Path) -> Result<u64, BenchError> {
    Ok(std::fs::metadata(path)
        .map_err(|e| BenchError::io(path, e))?
        .len())
}

/// Unit rows of deterministic values, with labels and paths as long as real ones.
fn synthetic_set(rows: usize, dim: usize) -> FeatureSet {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let values: Vec<f32> = (0..rows * dim)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    let x = Tensor::from_slice(&values).reshape([rows as i64, dim as i64]);
    let x = &x / x.norm_scalaropt_dim(2.0, [1], true);
    let classes = ["B", "CD4T", "CD8T", "DC", "Mono", "NK", "pDC", "Plasma"];
    FeatureSet {
        features: x,
        labels: (0..rows).map(|i| classes[i % 8].to_string()).collect(),
        paths: (0..rows)
            .map(|i| format!("/data/Training/{}/cell_{i:06}.tiff", classes[i % 8]))
            .collect(),
        indices: (0..rows).collect(),
        tag: "epoch100".into(),
        checkpoint: "/runs/checkpoint0100.safetensors".into(),
        checkpoint_epoch: Some(100),
    }
}
