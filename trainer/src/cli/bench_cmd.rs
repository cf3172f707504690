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

    /// The `tokens` recipe's model and loss keys reach the benchmarked step: the channel
    /// term adds a second DINO loss of about the first's size, the keys are echoed, and a key
    /// the mode cannot take is refused by the config's own validation.
    #[test]
    fn step_bench_runs_the_tokens_recipes_keys() {
        let step = |extra: &[&str]| {
            let argv = [
                "t",
                "step",
                "--arch",
                "vit_tiny",
                "--patch",
                "8",
                "--channels",
                "3",
                "--batch",
                "2",
                "--global-size",
                "16",
                "--local-size",
                "8",
                "--local-crops",
                "0",
                "--out-dim",
                "64",
                "--warmup",
                "0",
                "--iters",
                "2",
                "--threads",
                "1",
            ];
            let w = Wrap::try_parse_from(argv.iter().chain(extra)).unwrap();
            let BenchCommand::Step(o) = w.b else {
                panic!("not a step bench")
            };
            o.run()
        };
        let tokens = ["--channel-mode", "tokens", "--channel-mixing-blocks", "1"];
        let plain = step(&tokens).unwrap();
        let with =
            |more: &[&'static str]| -> Vec<&str> { tokens.iter().chain(more).copied().collect() };
        let term = step(&with(&["--channel-dino-weight", "1"])).unwrap();
        assert_eq!(term["channel_mixing_blocks"], 1);
        assert_eq!(term["channel_dino_weight"], 1.0);
        let all = step(&with(&["--teacher-channels", "all"])).unwrap();
        assert_eq!(all["teacher_channels"], "all");
        assert!(all["last_loss"].as_f64().unwrap().is_finite());
        let (a, b) = (
            plain["last_loss"].as_f64().unwrap(),
            term["last_loss"].as_f64().unwrap(),
        );
        // ln 64 = 4.16 per DINO term near the start: one term against two.
        assert!(a > 3.0 && a < 6.0 && b > 1.5 * a, "{a} vs {b}");
        let err = step(&["--channel-separate-blocks", "1"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("channel_separate_blocks"), "{err}");
        let both = with(&["--channel-dino-weight", "1", "--teacher-channels", "all"]);
        let err = step(&both).unwrap_err().to_string();
        assert!(err.contains("train.channel_dino_weight"), "{err}");
    }
}
