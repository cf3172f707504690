//! `trainer bench`: timings for bench/, whose scripts run the PyTorch peers with the same
//! shapes and threads in the same invocation and report the ratios. Each benchmark's flags and
//! work live in `trainer::bench`; this only dispatches and prints its JSON line.
use anyhow::Result;
use clap::Subcommand;
use trainer::bench::{
    loader::LoaderOptions, matmul::MatmulOptions, model::ModelOptions, probe::ProbeOptions,
    profiles::ProfilesOptions, step::StepOptions,
};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Student forward + backward of 2 global and N local crops; prints one JSON line
    /// (peer: bench/model_fwd_bwd.py).
    Model(ModelOptions),
    /// One full DINO iteration (`Learner::step`: teacher on globals, student on all crops,
    /// loss, backward, clip, AdamW, EMA); prints one JSON line (peer: bench/train_step.py).
    Step(StepOptions),
    /// fp32 matmul throughput (n×n · n×n), best of `reps`; prints one JSON line.
    Matmul(MatmulOptions),
    /// Input pipeline throughput (TIFF → min–max → multi-crop → batch tensors) without a
    /// model: wall-clock images/s and images per CPU-second; prints one JSON line (peer:
    /// bench/loader_peer.py).
    Loader(LoaderOptions),
    /// The linear probe's L-BFGS fit on a safetensors file of features `x` [n, d] and labels
    /// `y` [n] (bench/linear_probe.sh writes it); prints one JSON line.
    Probe(ProbeOptions),
    /// Features of N images written and read as scDINO's CSV and as the Parquet profile
    /// table (bench/profiles.sh); prints one JSON line.
    Profiles(ProfilesOptions),
}

impl BenchCommand {
    pub fn run(self) -> Result<()> {
        let line = match self {
            BenchCommand::Model(b) => b.run()?,
            BenchCommand::Step(b) => b.run()?,
            BenchCommand::Matmul(b) => b.run()?,
            BenchCommand::Loader(b) => b.run()?,
            BenchCommand::Probe(b) => b.run()?,
            BenchCommand::Profiles(b) => b.run()?,
        };
        println!("{line}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::PathBuf;

    #[derive(Parser)]
    struct Wrap {
        #[command(subcommand)]
        b: BenchCommand,
    }

    #[test]
    fn loader_bench_takes_data_or_config() {
        let loader = |args: &[&str]| {
            let argv = ["t", "loader"].iter().chain(args).copied();
            Wrap::try_parse_from(argv).map(|w| match w.b {
                BenchCommand::Loader(o) => o,
                other => panic!("parsed {other:?}"),
            })
        };
        let o = loader(&["--config", "c.yaml", "--warm"]).unwrap();
        assert_eq!(o.config, Some(PathBuf::from("c.yaml")));
        assert!(o.warm && o.data.is_none());
        let o = loader(&["--data", "d"]).unwrap();
        assert_eq!(o.data, Some(PathBuf::from("d")));
        assert!(loader(&[]).is_err());
        assert!(loader(&["--data", "d", "--config", "c"]).is_err());
    }

    #[test]
    fn step_bench_takes_config_spellings() {
        let w = Wrap::try_parse_from([
            "t",
            "step",
            "--arch",
            "vit_tiny",
            "--channel-mode",
            "tokens",
            "--precision",
            "bf16",
        ])
        .unwrap();
        let BenchCommand::Step(o) = w.b else {
            panic!("not a step bench")
        };
        assert_eq!(o.shape.arch, trainer::config::Arch::VitTiny);
        assert_eq!(o.channel_mode, trainer::config::ChannelMode::Tokens);
        assert_eq!(o.precision, trainer::config::Precision::Bf16);
        assert!(Wrap::try_parse_from(["t", "step", "--arch", "vit_huge"]).is_err());
        assert!(Wrap::try_parse_from(["t", "step", "--precision", "fp8"]).is_err());
        // `bench model` takes the same shape flags (one declaration, flattened into both).
        let w = Wrap::try_parse_from([
            "t",
            "model",
            "--arch",
            "vit_tiny",
            "--batch",
            "2",
            "--out-dim",
            "64",
        ])
        .unwrap();
        let BenchCommand::Model(m) = w.b else {
            panic!("not a model bench")
        };
        assert_eq!(
            (m.shape.arch, m.shape.batch, m.shape.out_dim),
            (trainer::config::Arch::VitTiny, 2, 64)
        );
        assert!(Wrap::try_parse_from(["t", "model", "--global-size", "96"]).is_err());
    }
}
