use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use trainer::analysis::features;
use trainer::config::Config;
use trainer::data::build_index;
use trainer::train::run::{dataset_mean_std_at, model_dir};

/// `trainer mean-std`: the dataset statistics that normalise every crop.
#[derive(Debug, Args)]
pub struct MeanStdArgs {
    #[arg(long)]
    config: PathBuf,
    /// Recompute even if the file exists.
    #[arg(long)]
    force: bool,
}

impl MeanStdArgs {
    pub fn run(self) -> Result<()> {
        let cfg = Config::load(&self.config)?;
        let index = build_index(&cfg.data.dataset_dir, cfg.data.label_folder_depth)
            .with_context(|| format!("indexing {}", cfg.data.dataset_dir.display()))?;
        let path = cfg.run_dir().join("mean_and_std_of_dataset.txt");
        if self.force {
            let _ = std::fs::remove_file(&path);
        }
        let ms = dataset_mean_std_at(&cfg, &index, &path)?;
        println!("{}", serde_json::to_string(&ms)?);
        eprintln!("mean/std: {}", path.display());
        Ok(())
    }
}

/// `trainer features`: CLS features, labels and paths of the held-out images.
#[derive(Debug, Args)]
pub struct FeaturesArgs {
    #[arg(long)]
    config: PathBuf,
    #[arg(long, default_value_t = 0)]
    combination: usize,
    /// Checkpoint to embed with: one of ours or a PyTorch `.pth` (scDINO/DINO training
    /// checkpoint or bare state dict). Default: the model's latest `checkpoint.safetensors`.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    #[arg(long)]
    threads: Option<i32>,
}

impl FeaturesArgs {
    pub fn run(self) -> Result<()> {
        if let Some(t) = self.threads {
            tch::set_num_threads(t);
        }
        let cfg = Config::load(&self.config)?;
        let channels = cfg
            .channel_sets
            .get(self.combination)
            .cloned()
            .with_context(|| format!("channel combination {} does not exist", self.combination))?;
        let ckpt = self
            .checkpoint
            .unwrap_or_else(|| model_dir(&cfg, &channels).join(trainer::checkpoint::LATEST));
        let ms = trainer::analysis::mean_std::MeanStd::read(
            &cfg.run_dir().join("mean_and_std_of_dataset.txt"),
        )?;
        let set = features::extract(&cfg, self.combination, &ckpt, &ms)
            .with_context(|| format!("features with {}", ckpt.display()))?;
        let tag = set.tag.clone();
        let dir = features::analyses_dir(&cfg, &channels);
        features::write(&dir, &tag, &set)?;
        println!(
            "{} rows ({} replaced by image 0 after NaN) -> {}",
            set.labels.len(),
            set.replaced,
            dir.join("CLS_features")
                .join(format!("{tag}_features.csv"))
                .display()
        );
        Ok(())
    }
}

/// `trainer knn`: scDINO's global weighted kNN on extracted features.
#[derive(Debug, Args)]
pub struct KnnArgs {
    #[arg(long)]
    config: PathBuf,
    #[arg(long, default_value_t = 0)]
    combination: usize,
    /// Feature tag, e.g. `epoch4` (default: every `CLS_features/*_features.csv`, sorted).
    #[arg(long)]
    tag: Option<String>,
    #[arg(long)]
    threads: Option<i32>,
}

impl KnnArgs {
    pub fn run(self) -> Result<()> {
        use trainer::analysis::knn;
        if let Some(t) = self.threads {
            tch::set_num_threads(t);
        }
        let cfg = Config::load(&self.config)?;
        let channels = cfg
            .channel_sets
            .get(self.combination)
            .cloned()
            .with_context(|| format!("channel combination {} does not exist", self.combination))?;
        let dir = features::analyses_dir(&cfg, &channels);
        let feat_dir = dir.join("CLS_features");
        let tags: Vec<String> = match self.tag {
            Some(t) => vec![t],
            None => {
                let mut t: Vec<String> = std::fs::read_dir(&feat_dir)
                    .with_context(|| {
                        format!(
                            "no features in {}: run `trainer features` first",
                            feat_dir.display()
                        )
                    })?
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter_map(|n| n.strip_suffix("_features.csv").map(str::to_string))
                    .collect();
                t.sort();
                t
            }
        };
        anyhow::ensure!(
            !tags.is_empty(),
            "no *_features.csv in {}",
            feat_dir.display()
        );
        let knn_dir = dir.join("kNN");
        std::fs::create_dir_all(&knn_dir).with_context(|| knn_dir.display().to_string())?;
        let kcfg = knn::KnnConfig {
            seed: cfg.run.seed as u32,
            ks: cfg.downstream.knn.k.clone(),
            temperature: cfg.downstream.knn.temperature,
            ..knn::KnnConfig::default()
        };
        for tag in tags {
            let input = knn::KnnInput::from_csv(
                &feat_dir.join(format!("{tag}_features.csv")),
                &dir.join("class_labels.csv"),
            )?;
            let report = knn::run_global_knn(&input, &kcfg)?;
            for w in &report.warnings {
                eprintln!("warning: {w}");
            }
            let run_name = format!(
                "{}/{}_{tag}",
                cfg.run_dir().display(),
                cfg.model_dir_name(&channels)
            );
            let block = report.txt_block(&run_name);
            knn::append_txt(&knn_dir.join(knn::GLOBAL_KNN_TXT), &block)?;
            trainer::data::tiff_reader::write_atomic(
                &knn_dir.join(format!("{tag}_knn_metrics.json")),
                report.to_json().as_bytes(),
            )?;
            print!("{block}");
        }
        Ok(())
    }
}
