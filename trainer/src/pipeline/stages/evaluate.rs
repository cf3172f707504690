//! The `evaluate` stage: kNN and the linear probe from the training images to the queries, and
//! the profiling field's scores of the evaluation's profile table.
use crate::analysis::evaluate::{self, EvaluationReport};
use crate::analysis::features::{self, FeatureSet};
use crate::analysis::profiles::{self, ProfileRows, Profiles};
use crate::config::Stage;
use crate::data::DataError;
use crate::pipeline::stage::{At, Flow, PipelineStage};
use crate::pipeline::stage_error::StageError;
use crate::pipeline::target::Dataset;
use crate::pipeline::target::Target;
use scdino_base::fs::write_atomic;
use std::path::{Path, PathBuf};

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

/// The `evaluate` stage, on rank 0: the evaluation, then its scores.
pub struct Evaluate;

impl PipelineStage for Evaluate {
    fn stage(&self) -> Stage {
        Stage::Evaluate
    }

    fn about(&self) -> &'static str {
        "kNN and a linear probe from the training images to the test folder or held-out split."
    }

    fn inputs(&self, at: &At) -> Vec<PathBuf> {
        let mut inputs = vec![at.checkpoint().1.to_path_buf(), at.t.run.mean_std()];
        // A local test folder is an input (its change reruns the evaluation); one in an object
        // store has no modification time to compare.
        let local_test = at.t.cfg.data.test_dir.as_ref().and_then(|d| d.local());
        inputs.extend(local_test.filter(|d| d.exists()).map(Path::to_path_buf));
        inputs
    }

    fn outputs(&self, at: &At) -> Vec<PathBuf> {
        let tag = at.checkpoint().0;
        vec![
            at.t.files.evaluation_json(tag),
            at.t.files.evaluation_profiles(tag),
            at.t.files.scores_json(tag),
        ]
    }

    fn run(&self, at: &At) -> Result<Flow, StageError> {
        let (tag, ckpt) = at.checkpoint();
        run_evaluate(at.t, ckpt, tag)?;
        run_scores(at.t, tag)?;
        Ok(Flow::Continue)
    }

    fn reported(&self, at: &At) -> Vec<PathBuf> {
        let tag = at.checkpoint().0;
        vec![at.t.files.evaluation_json(tag), at.t.files.scores_json(tag)]
    }
}
