//! The evaluation's metrics, kNN scores and linear probe against scikit-learn / numpy on the
//! same numbers.
use super::util::run_python;
use serde_json::Value;
use tch::{Kind, Tensor};
use trainer::analysis::evaluate::{knn_scores, score};
use trainer::analysis::linear_probe;

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn close(a: f64, b: f64, tol: f64, what: &str) {
    assert!((a - b).abs() <= tol, "{what}: ours {a} vs reference {b}");
}

/// Integer-valued scores (many ties, so the tie rule is exercised), a class that never occurs
/// among the queries and one that is never predicted.
#[test]
fn metrics_match_scikit_learn() {
    let (n, c) = (97usize, 7usize);
    let mut state = 12345u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let truth: Vec<i64> = (0..n).map(|_| (next() % (c - 1)) as i64).collect(); // class 6 absent
    let mut flat = Vec::with_capacity(n * c);
    for &t in &truth {
        for k in 0..c {
            let base = (next() % 4) as f64;
            flat.push(if k == t as usize && next() % 3 != 0 {
                base + 2.0
            } else {
                base
            });
        }
    }
    let scores = Tensor::from_slice(&flat).view([n as i64, c as i64]);
    let classes: Vec<String> = (0..c).map(|k| format!("c{k}")).collect();
    let ours = score(&scores, &truth, &classes);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.json");
    std::fs::write(
        &input,
        serde_json::json!({"scores": flat, "truth": truth, "n": n, "c": c}).to_string(),
    )
    .unwrap();
    let out = run_python(
        r#"
import sys, json, numpy as np
from sklearn.metrics import (top_k_accuracy_score, balanced_accuracy_score, f1_score,
                             precision_recall_fscore_support, accuracy_score)
d = json.load(open(sys.argv[1]))
s = np.array(d["scores"]).reshape(d["n"], d["c"]); y = np.array(d["truth"])
labels = list(range(d["c"]))
pred = np.argsort(s, axis=1, kind="mergesort")[:, ::-1][:, 0]
p, r, f, sup = precision_recall_fscore_support(y, pred, labels=labels, zero_division=0)
print(json.dumps({
  "top1": 100 * top_k_accuracy_score(y, s, k=1, labels=labels),
  "acc": 100 * accuracy_score(y, pred),
  "top5": 100 * top_k_accuracy_score(y, s, k=5, labels=labels),
  "balanced": 100 * balanced_accuracy_score(y, pred),
  "macro_f1": f1_score(y, pred, average="macro", zero_division=0),
  "precision": p.tolist(), "recall": r.tolist(), "f1": f.tolist()}))
"#,
        &[input.to_str().unwrap()],
    );
    let sk: Value = serde_json::from_str(out.trim()).unwrap();
    close(
        ours.top1_percent,
        sk["top1"].as_f64().unwrap(),
        1e-9,
        "top-1",
    );
    close(
        ours.top1_percent,
        sk["acc"].as_f64().unwrap(),
        1e-9,
        "accuracy",
    );
    close(
        ours.top5_percent,
        sk["top5"].as_f64().unwrap(),
        1e-9,
        "top-5",
    );
    close(
        ours.balanced_accuracy_percent,
        sk["balanced"].as_f64().unwrap(),
        1e-9,
        "balanced",
    );
    close(
        ours.macro_f1,
        sk["macro_f1"].as_f64().unwrap(),
        1e-12,
        "macro-F1",
    );
    for (k, m) in ours.per_class.iter().enumerate() {
        close(
            m.precision,
            floats(&sk["precision"])[k],
            1e-12,
            &format!("precision {k}"),
        );
        close(
            m.recall,
            floats(&sk["recall"])[k],
            1e-12,
            &format!("recall {k}"),
        );
        close(m.f1, floats(&sk["f1"])[k], 1e-12, &format!("F1 {k}"));
    }
    assert!(ours.top5_percent > ours.top1_percent && ours.top1_percent < 100.0);
}

/// The weighted vote against a numpy transcription of DINO's `knn_classifier`.
#[test]
fn knn_scores_match_numpy() {
    let _rng = super::util::torch_rng_lock();
    tch::manual_seed(3);
    let norm = |t: Tensor| {
        let n = t.norm_scalaropt_dim(2.0, [1], true);
        t / n
    };
    let bank = norm(Tensor::randn([50, 8], (Kind::Float, tch::Device::Cpu)));
    let queries = norm(Tensor::randn([13, 8], (Kind::Float, tch::Device::Cpu)));
    let labels: Vec<i64> = (0..50).map(|i| (i * 7 % 4) as i64).collect();
    let ours = knn_scores(&bank, &labels, &queries, 5, 0.07, 4);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.json");
    let v = |t: &Tensor| Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).unwrap();
    std::fs::write(
        &input,
        serde_json::json!({"bank": v(&bank), "q": v(&queries), "y": labels}).to_string(),
    )
    .unwrap();
    let out = run_python(
        r#"
import sys, json, numpy as np
d = json.load(open(sys.argv[1]))
bank = np.array(d["bank"], dtype=np.float32).reshape(50, 8); q = np.array(d["q"], dtype=np.float32).reshape(13, 8)
y = np.array(d["y"])
sim = q @ bank.T
idx = np.argsort(-sim, axis=1, kind="stable")[:, :5]
w = np.exp(np.take_along_axis(sim, idx, 1) / 0.07)
out = np.zeros((13, 4))
for i in range(13):
    for j in range(5):
        out[i, y[idx[i, j]]] += w[i, j]
print(json.dumps(out.ravel().tolist()))
"#,
        &[input.to_str().unwrap()],
    );
    let reference: Vec<f64> = serde_json::from_str(out.trim()).unwrap();
    for (i, (a, b)) in v(&ours).iter().zip(&reference).enumerate() {
        assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{i}: {a} vs {b}");
    }
}

/// The probe solves scikit-learn's problem: same objective value at the optimum (within 1e-7
/// relative) and the same class probabilities, for a weak and a strong penalty.
#[test]
fn linear_probe_matches_scikit_learn_logistic_regression() {
    let _rng = super::util::torch_rng_lock();
    tch::manual_seed(11);
    let (n, d, c) = (240i64, 12i64, 4usize);
    let centers = Tensor::randn([c as i64, d], (Kind::Double, tch::Device::Cpu));
    let y: Vec<i64> = (0..n).map(|i| i % c as i64).collect();
    let x = centers.index_select(0, &Tensor::from_slice(&y)) * 0.6
        + Tensor::randn([n, d], (Kind::Double, tch::Device::Cpu));
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.json");
    let xs = Vec::<f64>::try_from(x.flatten(0, -1)).unwrap();
    std::fs::write(&input, serde_json::json!({"x": xs, "y": y}).to_string()).unwrap();
    for l2 in [1e-3, 1e-1] {
        let ours = linear_probe::fit(&x, &y, c, l2, 1000);
        let out = run_python(
            r#"
import sys, json, numpy as np
from sklearn.linear_model import LogisticRegression
d = json.load(open(sys.argv[1])); l2 = float(sys.argv[2])
y = np.array(d["y"]); x = np.array(d["x"]).reshape(len(y), -1); n = len(y)
m = LogisticRegression(C=1.0 / (l2 * n), tol=1e-12, max_iter=100000).fit(x, y)
logits = x @ m.coef_.T + m.intercept_
logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - logits.max(1, keepdims=True)
obj = -logp[np.arange(n), y].mean() + 0.5 * l2 * (m.coef_ ** 2).sum()
print(json.dumps({"objective": obj, "proba": m.predict_proba(x).ravel().tolist()}))
"#,
            &[input.to_str().unwrap(), &l2.to_string()],
        );
        let sk: Value = serde_json::from_str(out.trim()).unwrap();
        let sk_obj = sk["objective"].as_f64().unwrap();
        assert!(
            (ours.objective - sk_obj).abs() <= 1e-7 * sk_obj,
            "λ {l2}: objective {} vs sklearn {sk_obj} ({} iterations)",
            ours.objective,
            ours.iterations
        );
        let proba =
            Vec::<f64>::try_from(ours.logits(&x).softmax(1, Kind::Double).flatten(0, -1)).unwrap();
        let worst = proba
            .iter()
            .zip(floats(&sk["proba"]))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst <= 1e-4, "λ {l2}: probabilities differ by {worst}");
    }
}

/// A test folder with a class training never saw: named and counted, in the label space (so
/// its rows count as wrong), and the seen classes are still scored as usual.
#[test]
fn query_classes_absent_from_training_are_reported_and_counted() {
    use trainer::analysis::evaluate::{evaluate, EvaluateConfig, Provenance};
    let _rng = super::util::torch_rng_lock();
    tch::manual_seed(5);
    let norm = |t: Tensor| {
        let n = t.norm_scalaropt_dim(2.0, [1], true);
        t / n
    };
    let centers = Tensor::eye(4, (Kind::Float, tch::Device::Cpu)) * 3.0;
    let make = |labels: &[i64]| {
        let idx = Tensor::from_slice(labels);
        norm(
            centers.index_select(0, &idx)
                + Tensor::randn([labels.len() as i64, 4], (Kind::Float, tch::Device::Cpu)) * 0.3,
        )
    };
    let train_codes: Vec<i64> = (0..60).map(|i| i % 3).collect(); // classes a, b, c
    let query_codes: Vec<i64> = (0..20).map(|i| i % 4).collect(); // and d, 5 rows
    let name = |c: &i64| ["a", "b", "c", "d"][*c as usize].to_string();
    let train_labels: Vec<String> = train_codes.iter().map(name).collect();
    let query_labels: Vec<String> = query_codes.iter().map(name).collect();
    let report = evaluate(
        (&make(&train_codes), &train_labels),
        (&make(&query_codes), &query_labels),
        &EvaluateConfig {
            ks: vec![5],
            temperature: 0.1,
            l2: vec![1e-3],
            validation_fraction: 0.2,
            max_iterations: 200,
            seed: 1,
        },
        Provenance {
            checkpoint: "ck".into(),
            checkpoint_sha256: String::new(),
            epoch: Some(1),
            tag: "epoch0".into(),
        },
        "test folder t".into(),
    );
    assert_eq!(report.classes, ["a", "b", "c", "d"]);
    assert_eq!(report.unseen_classes, vec![("d".to_string(), 5)]);
    for s in [&report.knn[0].scores, &report.linear_probe.scores] {
        let d = &s.per_class[3];
        assert_eq!((d.support, d.true_positives, d.recall), (5, 0, 0.0));
        // The 15 seen rows are separable: top-1 is exactly 15/20, balanced accuracy 3/4.
        assert!((s.top1_percent - 75.0).abs() < 1e-9, "{}", s.top1_percent);
        assert!((s.balanced_accuracy_percent - 75.0).abs() < 1e-9);
    }
}
