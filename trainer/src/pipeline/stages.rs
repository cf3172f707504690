//! One function per analysis stage, shared by the single-stage commands (`trainer knn`, …) and
//! `trainer pipeline`, so both write exactly the same files. Every file is written atomically.
use super::StageError;
use crate::analysis::attention::{self, AttentionImage};
use crate::analysis::evaluate::{self, EvaluationReport};
use crate::analysis::features::{self, FeatureSet};
use crate::analysis::knn::{self, KnnReport};
use crate::analysis::profiles::{self, ProfileRows, Profiles};
use crate::analysis::umap::{self, UmapParams};
use crate::config::Config;
use crate::data::mean_std::MeanStd;
use crate::data::DataError;
use crate::data::{SharedSource, Split};
use crate::distributed::env::DistEnv;
use crate::distributed::group::ProcessGroup;
use crate::layout::{ModelLayout, RunLayout};
use crate::plot;
use scdino_base::fs::write_atomic;
use std::cell::OnceCell;
use std::path::{Path, PathBuf};

/// One trained model: a channel combination of a config, and where its files live.
pub struct Target<'a> {
    pub cfg: &'a Config,
    pub combination: usize,
    pub channels: Vec<usize>,
    pub run: RunLayout,
    /// Checkpoints, logs and analyses of this combination.
    pub files: ModelLayout,
    /// Opened on first use: a listing (S3) and a shuffle that stages share.
    dataset: OnceCell<Dataset>,
}

/// The dataset of a config and its training / held-out split (the one training uses).
pub struct Dataset {
    pub source: SharedSource,
    pub split: Split,
}

impl Dataset {
    /// The dataset and its split for the analyses of the combination `channels` (where cells
    /// bring their own channels, the cells that hold all of them).
    pub fn open(cfg: &Config, channels: &[usize]) -> Result<Self, StageError> {
        let source = crate::data::open_source(&cfg.data)?;
        let split = crate::data::cell_channels::combination_split(
            source.as_ref(),
            &cfg.data,
            cfg.run.seed as u32,
            channels,
        )?;
        Ok(Self { source, split })
    }
}

impl<'a> Target<'a> {
    pub fn new(cfg: &'a Config, combination: usize) -> Result<Self, StageError> {
        let channels =
            cfg.channel_sets
                .get(combination)
                .cloned()
                .ok_or(StageError::NoCombination {
                    index: combination,
                    count: cfg.channel_sets.len(),
                })?;
        let run = RunLayout::new(cfg);
        Ok(Self {
            cfg,
            combination,
            files: run.model(cfg, &channels),
            run,
            channels,
            dataset: OnceCell::new(),
        })
    }

    /// The names of this combination's channels, in order.
    pub fn channel_names(&self) -> Vec<String> {
        self.channels
            .iter()
            .map(|&c| self.cfg.data.channel_names[c].clone())
            .collect()
    }

    /// The dataset and its split, opened once per target.
    pub fn dataset(&self) -> Result<&Dataset, StageError> {
        if let Some(d) = self.dataset.get() {
            return Ok(d);
        }
        let d = Dataset::open(self.cfg, &self.channels)?;
        Ok(self.dataset.get_or_init(|| d))
    }

    pub fn mean_std(&self) -> Result<MeanStd, StageError> {
        let path = self.run.mean_std();
        MeanStd::read(&path).map_err(|source| StageError::NoMeanStd { source })
    }

    /// The dataset mean/std that `ckpt` embeds with: none for a timm folder, which is
    /// normalised with its own `config.json` mean/std (so needs no `trainer mean-std`).
    pub fn mean_std_for(&self, ckpt: &Path) -> Result<MeanStd, StageError> {
        if crate::analysis::pretrained::is_timm_folder(ckpt) {
            return Ok(MeanStd {
                mean: vec![],
                std: vec![],
            });
        }
        self.mean_std()
    }

    /// The numbered checkpoints training kept (`saveckp_freq` epochs and the last), oldest
    /// first, with their feature tags.
    pub fn numbered_checkpoints(&self) -> Vec<(String, PathBuf)> {
        let mut found: Vec<(usize, PathBuf)> = std::fs::read_dir(self.files.dir())
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let path = e.ok()?.path();
                Some((ModelLayout::numbered_epoch(&path)?, path))
            })
            .collect();
        found.sort();
        let init = self.files.initial_checkpoint();
        init.exists()
            .then(|| ("init".to_string(), init))
            .into_iter()
            .chain(
                found
                    .into_iter()
                    .map(|(epoch, p)| (format!("epoch{epoch}"), p)),
            )
            .collect()
    }

    /// Feature tags with extracted features, in epoch order.
    pub fn feature_tags(&self) -> Vec<String> {
        let mut tags: Vec<String> = std::fs::read_dir(self.files.features_dir())
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| n.strip_suffix("_features.safetensors").map(str::to_string))
            .collect();
        sort_tags(&mut tags);
        tags
    }
}

/// Sorts tags in training order: `init` (the untrained network), `step{N}` (a checkpoint
/// in the middle of the first epoch) by N, `epoch{N}` by N, then anything else by name.
pub fn sort_tags(tags: &mut [String]) {
    let number = |t: &str, prefix: &str| t.strip_prefix(prefix)?.parse::<u64>().ok();
    tags.sort_by_key(|t| {
        let rank = if t == "init" {
            (0, 0)
        } else if let Some(n) = number(t, "step") {
            (1, n)
        } else if let Some(n) = number(t, "epoch") {
            (2, n)
        } else {
            (3, 0)
        };
        (rank, t.clone())
    });
}

/// scDINO names analyses after the checkpoint's epoch counted from 0 (`checkpoint{E}.pth`);
/// works for our checkpoints and PyTorch `.pth` files alike.
pub fn tag_of_checkpoint(path: &Path) -> Result<String, StageError> {
    Ok(crate::analysis::backbone::checkpoint_tag(path).map_err(features::FeaturesError::from)?)
}

/// Features, labels and paths of the held-out split with `ckpt`; returns the row count written
/// (`None` on ranks other than 0, which write nothing).
///
/// Launched on several ranks (`trainer launch`, srun), each rank embeds every W-th held-out
/// image, the shares are all-gathered and interleaved back into held-out order, and rank 0
/// alone writes: the same rows, once each, as one process would write.
pub fn run_features(t: &Target, ckpt: &Path, tag: &str) -> Result<Option<usize>, StageError> {
    let ms = t.mean_std_for(ckpt)?;
    let env = DistEnv::from_process_env()?;
    if env.world <= 1 {
        let set = features::extract(t.cfg, t.combination, ckpt, &ms)?;
        return write_features(t, tag, &set).map(Some);
    }
    let mut group = ProcessGroup::new(
        &env.master_addr,
        env.master_port,
        env.rank,
        env.world,
        std::time::Duration::from_secs(t.cfg.train.dist_timeout_seconds),
        false,
    )?;
    let mut set = features::extract_shard(t.cfg, t.combination, ckpt, &ms, env.rank, env.world)?;
    set.features = gather_shards(&mut group, env.world, &set.features, set.labels.len())
        .map_err(|source| StageError::GatherFeatures { source })?;
    let rows = if env.rank == 0 {
        Some(write_features(t, tag, &set)?)
    } else {
        None
    };
    // Nobody leaves before rank 0 has written (a following stage may start right away).
    group.barrier()?;
    Ok(rows)
}

/// All-gathers every rank's share (positions r, r+W, …) and interleaves them back into
/// held-out order.
fn gather_shards(
    group: &mut ProcessGroup,
    world: usize,
    mine: &tch::Tensor,
    total: usize,
) -> Result<tch::Tensor, crate::distributed::group::DistError> {
    use tch::{Kind, Tensor};
    let per = total.div_ceil(world) as i64;
    let dim = mine.size()[1];
    let padded = Tensor::zeros([per, dim], (Kind::Float, tch::Device::Cpu));
    padded.narrow(0, 0, mine.size()[0]).copy_(mine);
    let mut all = Tensor::zeros([world as i64 * per, dim], (Kind::Float, tch::Device::Cpu));
    group.all_gather(&mut all, &padded)?;
    let order: Vec<i64> = (0..total)
        .map(|p| ((p % world) as i64) * per + (p / world) as i64)
        .collect();
    Ok(all.index_select(0, &Tensor::from_slice(&order)))
}

fn write_features(t: &Target, tag: &str, set: &features::FeatureSet) -> Result<usize, StageError> {
    features::write(&t.files, tag, set)?;
    let rows = ProfileRows {
        set,
        split: "heldout",
        root: &t.cfg.data.dataset_dir,
    };
    profiles::write(&t.files.profiles(tag), &[rows], &t.channel_names())?;
    Ok(set.labels.len())
}

/// `trainer evaluate` for one checkpoint: features of the training images and of the queries
/// (the test folder, else the held-out split), kept as `evaluation/{tag}_{train,queries}_features.safetensors`,
/// then kNN for every `downstream.knn.k` and the linear probe, written as
/// `evaluation/{tag}_evaluation.json`.
pub fn run_evaluate(t: &Target, ckpt: &Path, tag: &str) -> Result<EvaluationReport, StageError> {
    let cfg = t.cfg;
    let ms = t.mean_std_for(ckpt)?;
    let Dataset { source, split } = t.dataset()?;
    let n = source.index().len();
    let extract = |src: &dyn crate::data::ImageSource, idx: &[usize]| {
        features::extract_indices(cfg, t.combination, ckpt, &ms, src, idx)
    };
    let (train, queries, queries_from, queries_split) = match &cfg.data.test_dir {
        Some(dir) => {
            let test_data = crate::config::DataSection {
                dataset_dir: dir.clone(),
                ..cfg.data.clone()
            };
            let test = crate::data::open_source(&test_data)?;
            let all = crate::data::cell_channels::holding(
                test.as_ref(),
                &(0..test.index().len()).collect::<Vec<_>>(),
                &t.channels,
            );
            let train_all: Vec<usize> = (0..n).collect();
            (
                extract(source.as_ref(), &train_all)?,
                extract(test.as_ref(), &all)?,
                format!("test folder {dir}"),
                ("test", dir),
            )
        }
        None => {
            let train = extract(source.as_ref(), &split.train)?;
            // The features stage already embedded the held-out split with this checkpoint
            // (unless it pooled a bag model's channels otherwise: other width).
            let width = train.features.size().get(1).copied();
            let written = features::read_bundle(&t.files.bundle(tag))
                .ok()
                .filter(|set| {
                    Path::new(&set.checkpoint) == ckpt
                        && set.indices == split.held_out
                        && set.features.size().get(1).copied() == width
                });
            let held_out = match written {
                Some(set) => set,
                None => extract(source.as_ref(), &split.held_out)?,
            };
            (
                train,
                held_out,
                "held-out split".to_string(),
                ("heldout", &cfg.data.dataset_dir),
            )
        }
    };
    let dir = t.files.evaluation_dir();
    std::fs::create_dir_all(&dir).map_err(|source| StageError::Io {
        path: dir.clone(),
        source,
    })?;
    features::write_bundle(
        &dir.join(format!("{tag}_train_features.safetensors")),
        &train,
    )?;
    features::write_bundle(
        &dir.join(format!("{tag}_queries_features.safetensors")),
        &queries,
    )?;
    let parts = [
        ProfileRows {
            set: &train,
            split: "train",
            root: &cfg.data.dataset_dir,
        },
        ProfileRows {
            set: &queries,
            split: queries_split.0,
            root: queries_split.1,
        },
    ];
    profiles::write(
        &t.files.evaluation_profiles(tag),
        &parts,
        &t.channel_names(),
    )?;
    let provenance = features::provenance(&train)?;
    evaluate_sets(t, tag, (&train, &queries), provenance, queries_from)
}

/// The profiling field's scores (`downstream.metrics`, docs/scoring.md) of `tag`'s evaluation
/// profile table, written as `<tag>_scores.json` (with the reason where a score is skipped).
pub fn run_scores(t: &Target, tag: &str) -> Result<(), StageError> {
    let m = &t.cfg.downstream.metrics;
    let scores = if m.enabled {
        let table = crate::scoring::ProfileTable::read(&t.files.evaluation_profiles(tag))?;
        crate::scoring::summary::pipeline_scores(
            &table,
            &crate::scoring::summary::PipelineRequest {
                label: m.label.clone(),
                batch: m.batch.clone(),
                null_size: m.null_size,
                n_neighbors: m.n_neighbors,
                seed: t.cfg.run.seed,
            },
        )
    } else {
        crate::scoring::summary::PipelineScores {
            map_skipped: Some("downstream.metrics.enabled is false".into()),
            batch_skipped: Some("downstream.metrics.enabled is false".into()),
            ..Default::default()
        }
    };
    let path = t.files.scores_json(tag);
    let text = serde_json::to_string_pretty(&scores).expect("scores serialise");
    scdino_base::fs::write_atomic(&path, text.as_bytes())
        .map_err(|source| StageError::Io { path, source })
}

/// `trainer evaluate --profiles FILE`: the evaluation of a profile table's rows, those whose
/// `Metadata_Split` is `train` against the others, written as `evaluate` writes it for `tag`.
pub fn run_evaluate_profiles(
    t: &Target,
    table: Profiles,
    table_path: &Path,
    tag: &str,
) -> Result<EvaluationReport, StageError> {
    let train_rows = table.rows_where_split("train", true);
    let query_rows = table.rows_where_split("train", false);
    if train_rows.is_empty() || query_rows.is_empty() {
        return Err(profiles::ProfilesError::Splits {
            path: table_path.to_path_buf(),
            train: train_rows.len(),
            other: query_rows.len(),
        }
        .into());
    }
    let checkpoint = table.checkpoint.clone();
    let sha256 = crate::data::shards::pack::sha256_file(Path::new(&checkpoint))
        .map(|(_, sha)| sha)
        .unwrap_or_default();
    let provenance = evaluate::Provenance {
        checkpoint,
        checkpoint_sha256: sha256,
        epoch: table.checkpoint_epoch,
        tag: tag.to_string(),
    };
    let all = table.into_feature_set(tag);
    let rows_of = |rows: &[i64]| FeatureSet {
        features: all.features.index_select(0, &tch::Tensor::from_slice(rows)),
        labels: rows
            .iter()
            .map(|&r| all.labels[r as usize].clone())
            .collect(),
        paths: rows
            .iter()
            .map(|&r| all.paths[r as usize].clone())
            .collect(),
        indices: rows.iter().map(|&r| r as usize).collect(),
        tag: all.tag.clone(),
        checkpoint: all.checkpoint.clone(),
        checkpoint_epoch: all.checkpoint_epoch,
    };
    let (train, queries) = (rows_of(&train_rows), rows_of(&query_rows));
    let from = format!("profile table {}", table_path.display());
    evaluate_sets(t, tag, (&train, &queries), provenance, from)
}

/// kNN for every `downstream.knn.k` and the linear probe from `train` to `queries`, written as
/// `evaluation/{tag}_evaluation.json`.
fn evaluate_sets(
    t: &Target,
    tag: &str,
    (train, queries): (&FeatureSet, &FeatureSet),
    provenance: evaluate::Provenance,
    queries_from: String,
) -> Result<EvaluationReport, StageError> {
    let cfg = t.cfg;
    let dir = t.files.evaluation_dir();
    std::fs::create_dir_all(&dir).map_err(|source| StageError::Io {
        path: dir.clone(),
        source,
    })?;
    let p = &cfg.downstream.linear_probe;
    let report = evaluate::evaluate(
        (&train.features, &train.labels),
        (&queries.features, &queries.labels),
        &evaluate::EvaluateConfig {
            ks: cfg.downstream.knn.k.clone(),
            temperature: cfg.downstream.knn.temperature,
            l2: p.l2.clone(),
            validation_fraction: p.validation_fraction,
            max_iterations: p.max_iterations,
            seed: cfg.run.seed,
        },
        provenance,
        queries_from,
    );
    for (class, count) in &report.unseen_classes {
        tracing::warn!(
            "evaluate {tag}: {count} query image(s) of class {class:?}, which no \
             training image has; every method gets them wrong"
        );
    }
    let json = serde_json::to_string_pretty(&report).expect("evaluation report serialises");
    let path = t.files.evaluation_json(tag);
    write_atomic(&path, json.as_bytes()).map_err(DataError::writing(&path))?;
    Ok(report)
}

/// Reads a written `{tag}_evaluation.json`.
pub fn read_evaluation(path: &Path) -> Result<EvaluationReport, StageError> {
    let text = std::fs::read_to_string(path).map_err(|source| StageError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| StageError::NotEvaluationReport {
        path: path.to_path_buf(),
        source,
    })
}

/// The k whose top-1 accuracy is highest (the smallest such k): the confusion matrix shown.
pub fn best_k(report: &KnnReport) -> Option<&knn::KnnKResult> {
    report.results.iter().fold(None, |best, r| match best {
        Some(b) if b.top1_percent >= r.top1_percent => Some(b),
        _ => Some(r),
    })
}

/// scDINO's global weighted kNN on the features of `tag`: `{tag}_knn_metrics.json`,
/// `{tag}_confusion.png`, and `global_kNN.txt` rebuilt from every tag's block in epoch order
/// (scDINO appended; rebuilding keeps reruns from duplicating blocks).
pub fn run_knn(t: &Target, tag: &str) -> Result<KnnReport, StageError> {
    run_knn_on(t, tag, features::read_bundle(&t.files.bundle(tag))?)
}

/// [`run_knn`] on the rows of `set` (the features stage's, or a profile table's).
pub fn run_knn_on(t: &Target, tag: &str, set: FeatureSet) -> Result<KnnReport, StageError> {
    let (checkpoint, checkpoint_epoch) = (set.checkpoint.clone(), set.checkpoint_epoch);
    let input = knn::KnnInput::new(set.features, set.labels)?;
    let cfg = knn::KnnConfig {
        seed: t.cfg.run.seed as u32,
        ks: t.cfg.downstream.knn.k.clone(),
        temperature: t.cfg.downstream.knn.temperature,
        ..knn::KnnConfig::default()
    };
    let mut report = knn::run_global_knn(&input, &cfg)?;
    report.checkpoint = (!checkpoint.is_empty()).then_some(checkpoint);
    report.checkpoint_epoch = checkpoint_epoch;
    for w in &report.warnings {
        tracing::warn!("kNN {tag}: {w}");
    }
    let dir = t.files.knn_dir();
    std::fs::create_dir_all(&dir).map_err(|source| StageError::Io {
        path: dir.clone(),
        source,
    })?;
    if let Some(best) = best_k(&report) {
        plot::confusion_png(
            &t.files.confusion_png(tag),
            &best.confusion,
            &report.classes,
        )?;
    }
    let path = t.files.knn_json(tag);
    write_atomic(&path, report.to_json().as_bytes()).map_err(DataError::writing(&path))?;
    rebuild_global_knn_txt(t)?;
    Ok(report)
}

fn rebuild_global_knn_txt(t: &Target) -> Result<(), StageError> {
    let mut text = String::new();
    for tag in t.feature_tags() {
        let path = t.files.knn_json(&tag);
        if !path.exists() {
            continue;
        }
        let report = read_knn_json(&path)?;
        let run_name = format!(
            "{}/{}_{tag}",
            t.cfg.run_dir().display(),
            t.cfg.model_dir_name(&t.channels)
        );
        text.push_str(&report.txt_block(&run_name));
    }
    let path = t.files.knn_dir().join(knn::GLOBAL_KNN_TXT);
    write_atomic(&path, text.as_bytes()).map_err(DataError::writing(&path))?;
    Ok(())
}

pub fn read_knn_json(path: &Path) -> Result<KnnReport, StageError> {
    let text = std::fs::read_to_string(path).map_err(|source| StageError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| StageError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// What `trainer umap` computed, next to its PNG (the report reads it).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct UmapSummary {
    pub tag: String,
    pub rows: usize,
    pub dim: usize,
    pub n_neighbors: usize,
    pub min_dist: f64,
    pub spread: f64,
    pub epochs: usize,
    pub metric: crate::config::UmapMetric,
    pub seed: u64,
    /// sklearn-compatible trustworthiness at k = `trust_k` on `trust_rows` rows.
    pub trustworthiness: f64,
    pub trust_k: usize,
    pub trust_rows: usize,
    pub png: String,
    pub csv: String,
}

/// 2-D UMAP of the features of `tag`: `embedding_plots/{tag}_umap.{png,csv,json}`.
pub fn run_umap(t: &Target, tag: &str) -> Result<UmapSummary, StageError> {
    run_umap_on(t, tag, features::read_bundle(&t.files.bundle(tag))?)
}

/// [`run_umap`] on the rows of `set` (the features stage's, or a profile table's).
pub fn run_umap_on(t: &Target, tag: &str, set: FeatureSet) -> Result<UmapSummary, StageError> {
    let u = &t.cfg.downstream.umap;
    let rows = set.labels.len();
    let n_neighbors = u.n_neighbors.min(rows.saturating_sub(1));
    if n_neighbors < u.n_neighbors {
        tracing::warn!(
            "UMAP {tag}: only {rows} rows; n_neighbors lowered from {} to {n_neighbors}",
            u.n_neighbors
        );
    }
    let params = UmapParams {
        n_neighbors,
        min_dist: u.min_dist as f32,
        spread: u.spread as f32,
        epochs: u.epochs,
        metric: u.metric,
        seed: t.cfg.run.seed,
        negative_sample_rate: 5,
    };
    let emb = umap::fit(&set.features, &params)?;
    let trust_k = n_neighbors.min(rows.saturating_sub(2) / 2).max(1);
    let (trust, trust_rows) =
        umap::trustworthiness_sample(&set.features, &emb, trust_k, 2000, t.cfg.run.seed)?;
    let mut classes: Vec<String> = set.labels.clone();
    classes.sort();
    classes.dedup();
    let label_idx: Vec<usize> = set
        .labels
        .iter()
        .map(|l| classes.binary_search(l).expect("label present"))
        .collect();
    let dir = t.files.umap_dir();
    let png = dir.join(format!("{tag}_umap.png"));
    // scDINO also writes `pdf_format/epoch{E}_umap.pdf`: the same figure, 14×10 in.
    let pdf = dir.join("pdf_format").join(format!("{tag}_umap.pdf"));
    let dim = set.features.size()[1] as usize;
    plot::scatter_png_and_pdf(
        &png,
        &pdf,
        100.0,
        &plot::ScatterSpec {
            points: &emb,
            labels: &label_idx,
            class_names: &classes,
            title: &format!("CLS Token embedding of {rows} cells with a dimensionality of {dim}"),
            subtitle: &format!(
                "{tag} · n_neighbors={n_neighbors} · min_dist={} · spread={} · epochs={} · \
                 metric={:?} · seed={} · trustworthiness@{trust_k}={trust:.3}",
                u.min_dist, u.spread, u.epochs, u.metric, t.cfg.run.seed
            ),
            width: 1400,
            height: 1000,
        },
    )?;
    let csv_path = dir.join(format!("{tag}_umap.csv"));
    let mut csv = String::from("x,y,label,path\n");
    for ((p, label), path) in emb.iter().zip(&set.labels).zip(&set.paths) {
        csv.push_str(&format!(
            "{},{},{},{}\n",
            p[0],
            p[1],
            csv_field(label),
            csv_field(path)
        ));
    }
    write_atomic(&csv_path, csv.as_bytes()).map_err(DataError::writing(&csv_path))?;
    let summary = UmapSummary {
        tag: tag.to_string(),
        rows,
        dim,
        n_neighbors,
        min_dist: u.min_dist,
        spread: u.spread,
        epochs: u.epochs,
        metric: u.metric,
        seed: t.cfg.run.seed,
        trustworthiness: trust,
        trust_k,
        trust_rows,
        png: png.display().to_string(),
        csv: csv_path.display().to_string(),
    };
    let json = serde_json::to_string_pretty(&summary).expect("serialisable");
    let path = t.files.umap_json(tag);
    write_atomic(&path, json.as_bytes()).map_err(DataError::writing(&path))?;
    Ok(summary)
}

/// RFC 4180 quoting when needed (paths may hold commas or quotes).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Attention maps of the picked held-out images with `ckpt`: `attention_images/{tag}/…`.
pub fn run_attention(
    t: &Target,
    ckpt: &Path,
    tag: &str,
) -> Result<Vec<AttentionImage>, StageError> {
    let ms = t.mean_std()?;
    Ok(attention::write_attention_maps(
        t.cfg,
        t.combination,
        ckpt,
        &ms,
        &t.files.attention_dir(tag),
    )?)
}
