//! Forward+backward timing of one multi-crop batch; bench/model.sh runs the PyTorch peer
//! with the same shapes and threads in the same run and reports the ratio.
use anyhow::Result;
use clap::{Args, Subcommand};
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};
use trainer::config::Arch;
use trainer::model::{HeadConfig, MultiCropNet, VitConfig};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Student forward + backward of 2 global and N local crops; prints one JSON line.
    Model(ModelBench),
}

#[derive(Debug, Args)]
pub struct ModelBench {
    #[arg(long, value_parser = parse_arch, default_value = "vit_small")]
    arch: Arch,
    #[arg(long, default_value_t = 16)]
    patch: usize,
    #[arg(long, default_value_t = 5)]
    channels: usize,
    /// Images per crop (the per-GPU batch).
    #[arg(long, default_value_t = 4)]
    batch: i64,
    #[arg(long, default_value_t = 8)]
    local_crops: usize,
    #[arg(long, default_value_t = 65536)]
    out_dim: i64,
    #[arg(long, default_value_t = 2)]
    threads: i32,
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    #[arg(long, default_value_t = 3)]
    iters: usize,
}

fn parse_arch(s: &str) -> Result<Arch, String> {
    match s {
        "vit_tiny" => Ok(Arch::VitTiny),
        "vit_small" => Ok(Arch::VitSmall),
        "vit_base" => Ok(Arch::VitBase),
        _ => Err(format!(
            "unknown arch {s:?}: vit_tiny, vit_small or vit_base"
        )),
    }
}

impl BenchCommand {
    pub fn run(self) -> Result<()> {
        let BenchCommand::Model(b) = self;
        tch::set_num_threads(b.threads);
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let vit = VitConfig::new(b.arch, b.patch, b.channels).with_drop_path(0.1);
        let head = HeadConfig::new(vit.embed_dim, b.out_dim, false, true);
        let net = MultiCropNet::new(&vs.root(), vit, head);
        let c = b.channels as i64;
        let mut crops = vec![
            Tensor::randn([b.batch, c, 224, 224], (Kind::Float, Device::Cpu)),
            Tensor::randn([b.batch, c, 224, 224], (Kind::Float, Device::Cpu)),
        ];
        for _ in 0..b.local_crops {
            crops.push(Tensor::randn(
                [b.batch, c, 96, 96],
                (Kind::Float, Device::Cpu),
            ));
        }
        let step = || {
            let out = net.forward_t(&crops, true);
            let loss = out.square().mean(Kind::Float);
            loss.backward();
            for mut v in vs.trainable_variables() {
                v.zero_grad();
            }
        };
        for _ in 0..b.warmup {
            step();
        }
        let mut times = Vec::with_capacity(b.iters);
        for _ in 0..b.iters {
            let t = Instant::now();
            step();
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "{}",
            serde_json::json!({
                "impl": "rust-tch",
                "arch": format!("{:?}", b.arch),
                "batch": b.batch,
                "threads": b.threads,
                "median_s": median,
                "times_s": times,
            })
        );
        Ok(())
    }
}
