use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use trainer::config::Config;
use trainer::data::mean_std;
use trainer::data::open_source;
use trainer::pipeline::stages::{self, Target};
use trainer::pipeline::up_to_date;

/// `trainer mean-std`: the dataset statistics that normalise every crop.
#[derive(Debug, Args)]
pub struct MeanStdArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Recompute even if the file exists.
    #[arg(long)]
    force: bool,
}

impl MeanStdArgs {
    pub fn run(self) -> Result<()> {
        let cfg = self.config.load()?;
        let source =
            open_source(&cfg.data).with_context(|| format!("indexing {}", cfg.data.dataset_dir))?;
        let path = trainer::layout::RunLayout::new(&cfg).mean_std();
        if self.force {
            let _ = std::fs::remove_file(&path);
        }
        let ms = mean_std::load_or_compute(&cfg, source.as_ref(), &path)?;
        println!("{}", serde_json::to_string(&ms)?);
        tracing::info!("mean/std: {}", path.display());
        Ok(())
    }
}

/// Options shared by the per-model analysis commands.
#[derive(Debug, Args)]
pub struct ModelArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Index into data.channel_combinations (default: every combination, in order, as
    /// `trainer pipeline` runs them).
    #[arg(long)]
    combination: Option<usize>,
    /// Threads for libtorch's intra-op pool (default: libtorch's choice).
    #[arg(long)]
    threads: Option<i32>,
}

impl ModelArgs {
    fn load(&self) -> Result<Config> {
        if let Some(t) = self.threads {
            tch::set_num_threads(t);
        }
        self.config.load()
    }

    /// The models to work on: the combination asked for, else every one. `one_input` is the
    /// flag given that names one model's input (`--checkpoint`, `--profiles`), which needs
    /// `--combination` when the config has several combinations.
    fn targets<'a>(&self, cfg: &'a Config, one_input: Option<&str>) -> Result<Vec<Target<'a>>> {
        let combinations = match (self.combination, one_input) {
            (Some(c), _) => vec![c],
            (None, Some(flag)) if cfg.channel_sets.len() > 1 => bail!(
                "{flag} names one model's input, and the config has {} channel combinations: add --combination N",
                cfg.channel_sets.len()
            ),
            (None, _) => (0..cfg.channel_sets.len()).collect(),
        };
        Ok(combinations
            .into_iter()
            .map(|c| Target::new(cfg, c))
            .collect::<Result<_, _>>()?)
    }
}

/// The feature tags to work on: the one asked for, or every extracted one.
fn tags_or_all(t: &Target, tag: Option<String>) -> Result<Vec<String>> {
    let tags = match tag {
        Some(tag) => vec![tag],
        None => t.feature_tags(),
    };
    anyhow::ensure!(
        !tags.is_empty(),
        "no features in {}: run `trainer features` first",
        t.files.features_dir().display()
    );
    Ok(tags)
}

/// The checkpoints to analyse, with their tags: the one given; else every checkpoint training
/// kept (`checkpoint_every` and the last, as scDINO analyses every saved epoch) whose `output`
/// is missing or stale; else, when none was kept yet, the latest.
fn checkpoints_to_run(
    t: &Target,
    ckpt: Option<PathBuf>,
    output: impl Fn(&str) -> PathBuf,
) -> Result<Vec<(String, PathBuf)>> {
    if let Some(c) = ckpt {
        return Ok(vec![(stages::tag_of_checkpoint(&c)?, c)]);
    }
    let kept = t.numbered_checkpoints();
    if kept.is_empty() {
        let latest = t.files.latest_checkpoint();
        return Ok(vec![(stages::tag_of_checkpoint(&latest)?, latest)]);
    }
    let ms = t.run.mean_std();
    Ok(kept
        .into_iter()
        .filter(|(tag, c)| {
            let fresh = up_to_date(&[output(tag)], &[c.clone(), ms.clone()]);
            if fresh {
                tracing::info!("{tag}: up to date, skipped");
            }
            !fresh
        })
        .collect())
}

/// A profile table given with `--profiles`, with the tag its outputs are written under (the
/// file name less `_profiles.parquet`).
fn read_profiles(
    path: &std::path::Path,
) -> Result<(String, trainer::analysis::profiles::Profiles)> {
    let table = trainer::analysis::profiles::read(path)?;
    Ok((trainer::analysis::profiles::tag_of(path), table))
}

/// The tags to run on, each with the rows given by `--profiles` (then the one tag the file
/// names) or none (every extracted tag, or the one asked for, read from its bundle).
fn inputs(
    t: &Target,
    tag: Option<String>,
    profiles: Option<&std::path::Path>,
) -> Result<Vec<(String, Option<trainer::analysis::features::FeatureSet>)>> {
    Ok(match profiles {
        Some(path) => {
            let (tag, table) = read_profiles(path)?;
            let set = table.into_feature_set(&tag);
            vec![(tag, Some(set))]
        }
        None => tags_or_all(t, tag)?
            .into_iter()
            .map(|tag| (tag, None))
            .collect(),
    })
}

/// `trainer features`: CLS features, labels and paths of the held-out images.
#[derive(Debug, Args)]
pub struct FeaturesArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Checkpoint to embed with: one of ours or a PyTorch `.pth` (scDINO/DINO training
    /// checkpoint or bare state dict). Default: every checkpoint training kept whose features
    /// are missing or stale (the latest if none was kept yet).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
}

impl FeaturesArgs {
    pub fn run(self) -> Result<()> {
        let cfg = self.model.load()?;
        let given = self.checkpoint.as_ref().map(|_| "--checkpoint");
        for t in self.model.targets(&cfg, given)? {
            let bundle = |tag: &str| t.files.bundle(tag);
            for (tag, ckpt) in checkpoints_to_run(&t, self.checkpoint.clone(), bundle)? {
                let written = stages::run_features(&t, &ckpt, &tag, None)
                    .with_context(|| format!("features with {}", ckpt.display()))?;
                let stages::FeaturesRun::Wrote(rows) = written else {
                    continue;
                };
                println!("{rows} rows -> {}", t.files.features_csv(&tag).display());
            }
        }
        Ok(())
    }
}

/// `trainer knn`: scDINO's global weighted kNN on extracted features.
#[derive(Debug, Args)]
pub struct KnnArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Feature tag, e.g. `epoch4` (default: every extracted tag, in epoch order).
    #[arg(long, conflicts_with = "profiles")]
    tag: Option<String>,
    /// A Parquet profile table to run on instead of the extracted features (ours, or any
    /// table with `Metadata_Class` and float feature columns; rows not of unit length are L2-normalised); the
    /// outputs are named after the file (`epoch4_profiles.parquet` -> `epoch4`).
    #[arg(long, value_name = "FILE")]
    profiles: Option<PathBuf>,
}

impl KnnArgs {
    pub fn run(self) -> Result<()> {
        let cfg = self.model.load()?;
        let one = self.profiles.as_ref().map(|_| "--profiles");
        for t in self.model.targets(&cfg, one)? {
            self.knn(&cfg, &t)?;
        }
        Ok(())
    }

    fn knn(&self, cfg: &Config, t: &Target) -> Result<()> {
        for (tag, given) in inputs(t, self.tag.clone(), self.profiles.as_deref())? {
            let report = match given {
                Some(set) => stages::run_knn_on(t, &tag, set),
                None => stages::run_knn(t, &tag),
            }
            .with_context(|| format!("kNN of {tag}"))?;
            let run_name = format!(
                "{}/{}_{tag}",
                cfg.run_dir().display(),
                cfg.model_dir_name(&t.channels)
            );
            print!("{}", report.txt_block(&run_name));
        }
        Ok(())
    }
}

/// `trainer evaluate`: kNN and a linear probe from the training images to the test folder
/// (`data.test_dir`) or the held-out split, with sklearn-defined metrics.
#[derive(Debug, Args)]
pub struct EvaluateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Checkpoint: ours or a PyTorch `.pth` (default: every kept checkpoint without an
    /// up-to-date evaluation, or the latest if none was kept yet).
    #[arg(long, conflicts_with = "profiles")]
    checkpoint: Option<PathBuf>,
    /// A Parquet profile table to evaluate instead of embedding images: rows whose
    /// `Metadata_Split` is `train` against the others (as `evaluation/{tag}_profiles.parquet`
    /// holds them; rows not of unit length are L2-normalised).
    #[arg(long, value_name = "FILE")]
    profiles: Option<PathBuf>,
}

impl EvaluateArgs {
    pub fn run(self) -> Result<()> {
        let cfg = self.model.load()?;
        let one = match (&self.checkpoint, &self.profiles) {
            (Some(_), _) => Some("--checkpoint"),
            (_, Some(_)) => Some("--profiles"),
            _ => None,
        };
        for t in self.model.targets(&cfg, one)? {
            self.evaluate(&t)?;
        }
        Ok(())
    }

    fn evaluate(&self, t: &Target) -> Result<()> {
        let runs = match &self.profiles {
            Some(path) => vec![(trainer::analysis::profiles::tag_of(path), path.clone())],
            None => checkpoints_to_run(t, self.checkpoint.clone(), |tag| {
                t.files.evaluation_json(tag)
            })?,
        };
        for (tag, input) in runs {
            let r = match &self.profiles {
                Some(path) => read_profiles(path).and_then(|(_, table)| {
                    Ok(stages::run_evaluate_profiles(t, table, path, &tag)?)
                }),
                None => stages::run_evaluate(t, &input, &tag).map_err(Into::into),
            }
            .with_context(|| format!("evaluation with {}", input.display()))?;
            for k in &r.knn {
                println!(
                    "{tag} {}-NN: top-1 {:.3} %, top-5 {:.3} %, balanced {:.3} %, macro-F1 {:.4}",
                    k.k,
                    k.scores.top1_percent,
                    k.scores.top5_percent,
                    k.scores.balanced_accuracy_percent,
                    k.scores.macro_f1
                );
            }
            let p = &r.linear_probe;
            println!(
                "{tag} linear probe (λ {:e}): top-1 {:.3} %, top-5 {:.3} %, balanced {:.3} %, macro-F1 {:.4} ({} train, {} queries from {}) -> {}",
                p.l2,
                p.scores.top1_percent,
                p.scores.top5_percent,
                p.scores.balanced_accuracy_percent,
                p.scores.macro_f1,
                r.n_train,
                r.n_queries,
                r.queries_from,
                t.files.evaluation_json(&tag).display()
            );
        }
        Ok(())
    }
}

/// `trainer umap`: 2-D UMAP scatter of the features, coloured by class.
#[derive(Debug, Args)]
pub struct UmapArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Feature tag, e.g. `epoch4` (default: every extracted tag).
    #[arg(long, conflicts_with = "profiles")]
    tag: Option<String>,
    /// A Parquet profile table to embed instead of the extracted features (as for `trainer
    /// knn --profiles`).
    #[arg(long, value_name = "FILE")]
    profiles: Option<PathBuf>,
}

impl UmapArgs {
    pub fn run(self) -> Result<()> {
        let cfg = self.model.load()?;
        let one = self.profiles.as_ref().map(|_| "--profiles");
        for t in self.model.targets(&cfg, one)? {
            for (tag, given) in inputs(&t, self.tag.clone(), self.profiles.as_deref())? {
                let u = match given {
                    Some(set) => stages::run_umap_on(&t, &tag, set),
                    None => stages::run_umap(&t, &tag),
                }
                .with_context(|| format!("UMAP of {tag}"))?;
                println!(
                    "{tag}: {} rows, trustworthiness@{} {:.3} -> {}",
                    u.rows, u.trust_k, u.trustworthiness, u.png
                );
            }
        }
        Ok(())
    }
}

/// `trainer attention`: last-block CLS attention heatmaps for a few held-out images per class.
#[derive(Debug, Args)]
pub struct AttentionArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Checkpoint: ours or a PyTorch `.pth` (default: every kept checkpoint without up-to-date
    /// maps, or the latest if none was kept yet).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
}

impl AttentionArgs {
    pub fn run(self) -> Result<()> {
        let cfg = self.model.load()?;
        let given = self.checkpoint.as_ref().map(|_| "--checkpoint");
        for t in self.model.targets(&cfg, given)? {
            let manifest = |tag: &str| t.files.attention_manifest(tag);
            for (tag, ckpt) in checkpoints_to_run(&t, self.checkpoint.clone(), manifest)? {
                let images = stages::run_attention(&t, &ckpt, &tag)
                    .with_context(|| format!("attention maps with {}", ckpt.display()))?;
                println!(
                    "{} images -> {}",
                    images.len(),
                    t.files.attention_dir(&tag).display()
                );
            }
        }
        Ok(())
    }
}
