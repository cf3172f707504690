//! `trainer bench model`: the student's forward + backward of one multi-crop batch (2 global
//! crops at 224 px and N local ones at 96 px), timed (peer: bench/model_fwd_bwd.py).
use super::{BatchShape, BenchError};
use crate::model::{HeadConfig, MultiCropNet, VitConfig};
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};

/// What `trainer bench model` measures.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelOptions {
    #[command(flatten)]
    pub shape: BatchShape,
}

impl ModelOptions {
    /// The median of `iters` timed forward + backward passes after `warmup` untimed ones, as
    /// the JSON line bench/model_fwd_bwd.sh compares with the peer's.
    pub fn run(&self) -> Result<serde_json::Value, BenchError> {
        tch::set_num_threads(self.shape.threads);
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let vit = VitConfig::new(self.shape.arch, self.shape.patch, self.shape.channels)
            .with_drop_path(0.1);
        let head = HeadConfig::new(vit.embed_dim, self.shape.out_dim as i64, false, true);
        let net = MultiCropNet::new(&vs.root(), vit, head);
        let c = self.shape.channels as i64;
        let b = self.shape.batch as i64;
        let opts = (Kind::Float, Device::Cpu);
        let mut crops = vec![
            Tensor::randn([b, c, 224, 224], opts),
            Tensor::randn([b, c, 224, 224], opts),
        ];
        for _ in 0..self.shape.local_crops {
            crops.push(Tensor::randn([b, c, 96, 96], opts));
        }
        let step = || {
            let out = net.forward_t(&crops, true);
            let loss = out.square().mean(Kind::Float);
            loss.backward();
            for mut v in vs.trainable_variables() {
                v.zero_grad();
            }
        };
        for _ in 0..self.shape.warmup {
            step();
        }
        let mut times = Vec::with_capacity(self.shape.iters);
        for _ in 0..self.shape.iters.max(1) {
            let t = Instant::now();
            step();
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        Ok(serde_json::json!({
            "impl": "rust-tch",
            "arch": format!("{:?}", self.shape.arch),
            "batch": self.shape.batch,
            "threads": self.shape.threads,
            "median_s": times[times.len() / 2],
            "times_s": times,
        }))
    }
}
