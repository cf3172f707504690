//! `trainer bench model`: the student's forward + backward of one multi-crop batch (2 global
//! crops at 224 px and N local ones at 96 px), timed (peer: bench/model_fwd_bwd.py).
use super::{parse_arch, BenchError};
use crate::config::Arch;
use crate::model::{HeadConfig, MultiCropNet, VitConfig};
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};

/// What `trainer bench model` measures.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelOptions {
    #[arg(long, value_parser = parse_arch, default_value = "vit_small")]
    pub arch: Arch,
    #[arg(long, default_value_t = 16)]
    pub patch: usize,
    #[arg(long, default_value_t = 5)]
    pub channels: usize,
    /// Images per crop (the per-GPU batch).
    #[arg(long, default_value_t = 4)]
    pub batch: i64,
    #[arg(long, default_value_t = 8)]
    pub local_crops: usize,
    #[arg(long, default_value_t = 65536)]
    pub out_dim: i64,
    #[arg(long, default_value_t = 2)]
    pub threads: i32,
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    #[arg(long, default_value_t = 3)]
    pub iters: usize,
}

impl ModelOptions {
    /// The median of `iters` timed forward + backward passes after `warmup` untimed ones, as
    /// the JSON line bench/model_fwd_bwd.sh compares with the peer's.
    pub fn run(&self) -> Result<serde_json::Value, BenchError> {
        tch::set_num_threads(self.threads);
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let vit = VitConfig::new(self.arch, self.patch, self.channels).with_drop_path(0.1);
        let head = HeadConfig::new(vit.embed_dim, self.out_dim, false, true);
        let net = MultiCropNet::new(&vs.root(), vit, head);
        let c = self.channels as i64;
        let opts = (Kind::Float, Device::Cpu);
        let mut crops = vec![
            Tensor::randn([self.batch, c, 224, 224], opts),
            Tensor::randn([self.batch, c, 224, 224], opts),
        ];
        for _ in 0..self.local_crops {
            crops.push(Tensor::randn([self.batch, c, 96, 96], opts));
        }
        let step = || {
            let out = net.forward_t(&crops, true);
            let loss = out.square().mean(Kind::Float);
            loss.backward();
            for mut v in vs.trainable_variables() {
                v.zero_grad();
            }
        };
        for _ in 0..self.warmup {
            step();
        }
        let mut times = Vec::with_capacity(self.iters);
        for _ in 0..self.iters.max(1) {
            let t = Instant::now();
            step();
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        Ok(serde_json::json!({
            "impl": "rust-tch",
            "arch": format!("{:?}", self.arch),
            "batch": self.batch,
            "threads": self.threads,
            "median_s": times[times.len() / 2],
            "times_s": times,
        }))
    }
}
