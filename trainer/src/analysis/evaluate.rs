//! The evaluation users compare with, next to scDINO's kNN (kept as it is in [`super::knn`]):
//! a weighted kNN and a linear probe ([`super::linear_probe`]) from training features to
//! query features, with unrounded top-1/top-5, balanced accuracy, macro-F1 and per-class
//! precision/recall, each defined as scikit-learn defines it (tested against it).
//!
//! Training features are every image of `data.dataset_dir` and queries the images of
//! `data.test_dir` when that is set (the PBMC layout's `Test/` folder); otherwise the training
//! split and the held-out split. Test classes that training never saw are counted and named:
//! no method can predict them, so they lower every score.
use super::knn::{class_metrics, ClassMetrics, LabelEncoder};
use super::linear_probe::{self, L2Trial};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

/// Scores of one method on the queries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    pub top1_percent: f64,
    pub top5_percent: f64,
    /// Mean recall over the classes present among the queries (scikit-learn's
    /// `balanced_accuracy_score`).
    pub balanced_accuracy_percent: f64,
    /// Mean F1 over the classes present among the queries or the predictions
    /// (`f1_score(average="macro")`).
    pub macro_f1: f64,
    /// Every class of the label space, in code order.
    pub per_class: Vec<ClassMetrics>,
    /// `confusion[true][predicted]`.
    pub confusion: Vec<Vec<u64>>,
}

/// `scores`: `[n, classes]`; `truth`: codes. Top-k follows scikit-learn's
/// `top_k_accuracy_score`: classes ranked by a stable sort of the scores, reversed, so among
/// equal scores the higher class code ranks first.
pub fn score(scores: &Tensor, truth: &[i64], classes: &[String]) -> Scores {
    let scores = scores.to_kind(Kind::Double).to_device(Device::Cpu);
    let (n, c) = (scores.size()[0] as usize, scores.size()[1] as usize);
    assert_eq!(n, truth.len(), "one score row per query");
    assert_eq!(c, classes.len(), "one score column per class");
    let flat = Vec::<f64>::try_from(scores.flatten(0, -1)).expect("f64 scores");
    let (mut top1, mut top5) = (0usize, 0usize);
    let mut confusion = vec![vec![0u64; c]; c];
    for (i, &t) in truth.iter().enumerate() {
        let row = &flat[i * c..(i + 1) * c];
        let mut order: Vec<usize> = (0..c).collect();
        // Stable ascending sort, then reversed: ties keep the higher code first.
        order.sort_by(|&a, &b| row[a].total_cmp(&row[b]));
        order.reverse();
        let predicted = order[0];
        confusion[t as usize][predicted] += 1;
        top1 += usize::from(predicted as i64 == t);
        top5 += usize::from(order.iter().take(5).any(|&k| k as i64 == t));
    }
    let per_class = class_metrics(classes, &confusion);
    let present = |m: &ClassMetrics| m.support > 0;
    let recalls: Vec<f64> = per_class
        .iter()
        .filter(|m| present(m))
        .map(|m| m.recall)
        .collect();
    let f1s: Vec<f64> = per_class
        .iter()
        .filter(|m| present(m) || m.predicted > 0)
        .map(|m| m.f1)
        .collect();
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let pct = |k: usize| {
        if n == 0 {
            0.0
        } else {
            k as f64 * 100.0 / n as f64
        }
    };
    Scores {
        top1_percent: pct(top1),
        top5_percent: pct(top5),
        balanced_accuracy_percent: mean(&recalls) * 100.0,
        macro_f1: mean(&f1s),
        per_class,
        confusion,
    }
}

/// Weighted kNN class scores (DINO's `eval_knn.py` vote, as scDINO's kNN): cosine similarity
/// of L2-normalised rows, the k most similar bank rows, each voting exp(sim / T) for its
/// class. `[queries, classes]`.
pub fn knn_scores(
    bank: &Tensor,
    bank_labels: &[i64],
    queries: &Tensor,
    k: usize,
    temperature: f64,
    classes: usize,
) -> Tensor {
    let k = k.min(bank_labels.len()).max(1) as i64;
    let labels = Tensor::from_slice(bank_labels).to_device(bank.device());
    let bank = bank.to_kind(Kind::Float);
    let mut out = Vec::new();
    let n = queries.size()[0];
    let chunk = ((1i64 << 26) / bank.size()[0].max(1)).max(1);
    let mut start = 0;
    while start < n {
        let len = chunk.min(n - start);
        let q = queries.narrow(0, start, len).to_kind(Kind::Float);
        let sim = q.matmul(&bank.tr());
        let (top, idx) = sim.topk(k, 1, true, true);
        let votes = labels.index_select(0, &idx.flatten(0, -1)).view([len, k]);
        let weights = (top / temperature).exp();
        let scores = Tensor::zeros([len, classes as i64], (Kind::Float, bank.device()));
        out.push(scores.scatter_add(1, &votes, &weights));
        start += len;
    }
    if out.is_empty() {
        Tensor::zeros([0, classes as i64], (Kind::Float, Device::Cpu))
    } else {
        Tensor::cat(&out, 0)
    }
}

/// kNN scores for one k.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KnnEvaluation {
    pub k: usize,
    pub scores: Scores,
}

/// The linear probe's choice of λ and its scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeEvaluation {
    pub l2: f64,
    /// scikit-learn's equivalent `C` = 1/(λ·n_train).
    pub sklearn_c: f64,
    pub trials: Vec<L2Trial>,
    pub iterations: usize,
    pub objective: f64,
    pub scores: Scores,
}

/// Where the numbers come from (every figure names its checkpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub checkpoint: String,
    pub checkpoint_sha256: String,
    /// Epochs finished when the checkpoint was written (absent for a foreign `.pth`).
    pub epoch: Option<usize>,
    pub tag: String,
}

/// `{tag}_evaluation.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvaluationReport {
    pub provenance: Provenance,
    /// `"test folder <dir>"` or `"held-out split"`.
    pub queries_from: String,
    pub n_train: usize,
    pub n_queries: usize,
    pub classes: Vec<String>,
    /// Query classes no training image has, with their query counts.
    pub unseen_classes: Vec<(String, usize)>,
    pub knn_temperature: f64,
    pub knn: Vec<KnnEvaluation>,
    pub linear_probe: ProbeEvaluation,
}

/// Settings of [`evaluate`].
#[derive(Debug, Clone)]
pub struct EvaluateConfig {
    pub ks: Vec<usize>,
    pub temperature: f64,
    pub l2: Vec<f64>,
    pub validation_fraction: f64,
    pub max_iterations: usize,
    pub seed: u64,
}

/// kNN for every k and the linear probe, from training features to query features (rows
/// L2-normalised).
pub fn evaluate(
    train: (&Tensor, &[String]),
    queries: (&Tensor, &[String]),
    cfg: &EvaluateConfig,
    provenance: Provenance,
    queries_from: String,
) -> EvaluationReport {
    let (x_train, train_labels) = train;
    let (x_query, query_labels) = queries;
    let all: Vec<&String> = train_labels.iter().chain(query_labels).collect();
    let encoder = LabelEncoder::fit(&all);
    let classes: Vec<String> = encoder.classes.clone();
    let y_train = encoder
        .transform(train_labels)
        .expect("fitted on these labels");
    let y_query = encoder
        .transform(query_labels)
        .expect("fitted on these labels");
    let seen: std::collections::BTreeSet<&String> = train_labels.iter().collect();
    let mut unseen: Vec<(String, usize)> = Vec::new();
    for label in query_labels.iter().filter(|l| !seen.contains(l)) {
        match unseen.iter_mut().find(|(c, _)| c == label) {
            Some((_, n)) => *n += 1,
            None => unseen.push((label.clone(), 1)),
        }
    }
    let c = classes.len();
    let knn = cfg
        .ks
        .iter()
        .map(|&k| KnnEvaluation {
            k,
            scores: score(
                &knn_scores(x_train, &y_train, x_query, k, cfg.temperature, c),
                &y_query,
                &classes,
            ),
        })
        .collect();
    let (probe, trials) = linear_probe::select_and_fit(
        x_train,
        &y_train,
        c,
        &cfg.l2,
        cfg.validation_fraction,
        cfg.max_iterations,
        cfg.seed,
    );
    let scores = score(&probe.logits(x_query), &y_query, &classes);
    EvaluationReport {
        provenance,
        queries_from,
        n_train: y_train.len(),
        n_queries: y_query.len(),
        classes,
        unseen_classes: unseen,
        knn_temperature: cfg.temperature,
        knn,
        linear_probe: ProbeEvaluation {
            l2: probe.l2,
            sklearn_c: 1.0 / (probe.l2 * y_train.len() as f64),
            trials,
            iterations: probe.iterations,
            objective: probe.objective,
            scores,
        },
    }
}
