//! Global weighted kNN (`trainer::analysis::knn`) against a numpy/torch implementation of
//! scDINO's `global_kNN.py` (`tests/py/knn_reference.py`), plus the `global_kNN.txt` format,
//! the per-class metrics on a hand-computed case and the CSV error messages.
use std::path::Path;

use serde_json::Value;
use tch::{Kind, Tensor};
use trainer::analysis::knn::{
    append_txt, read_features_csv, read_labels_csv, run_global_knn, ClassMetrics, KnnConfig,
    KnnError, KnnInput, KnnKResult, KnnReport, SEPARATOR,
};
use trainer::data::numpy_shuffled_indices;

use super::util::{run_py_file, run_python};

const SCDINO_KS: [usize; 6] = [5, 10, 50, 100, 200, 500];

/// Writes a clustered Gaussian dataset the way scDINO's stages write theirs: L2-normalised rows
/// via `np.savetxt(delimiter=",")` (`%.18e`) and labels via `np.savetxt(fmt="%s")`.
/// `sep` scales the class centres against unit noise (smaller = harder).
/// `rare`: the last class gets exactly one sample (so it is absent from one side of the split).
fn write_dataset(dir: &Path, n: usize, d: usize, c: usize, gen_seed: u32, sep: f64, rare: bool) {
    let script = r#"
import sys, numpy as np
out, (n, d, c, seed), sep = sys.argv[1], map(int, sys.argv[2:6]), float(sys.argv[6])
rare = sys.argv[7] == "1"
rng = np.random.RandomState(seed)
names = ["B", "CD4_T", "CD8_T", "Mono", "NK", "DC", "Platelet", "pDC"]
if c > len(names):
    names = ["class_%02d" % i for i in range(c)]
names = np.array(names[:c])
centers = rng.randn(c, d)
y = rng.randint(0, c, n)
if rare:
    y[y == c - 1] = 0
    y[rng.randint(n)] = c - 1
x = sep * centers[y] + rng.randn(n, d)
x /= np.linalg.norm(x, axis=1, keepdims=True)
np.savetxt(out + "/features.csv", x, delimiter=",")
np.savetxt(out + "/class_labels.csv", names[y], fmt="%s")
"#;
    run_python(
        script,
        &[
            dir.to_str().unwrap(),
            &n.to_string(),
            &d.to_string(),
            &c.to_string(),
            &gen_seed.to_string(),
            &sep.to_string(),
            if rare { "1" } else { "0" },
        ],
    );
}

/// The reference's result per sort mode (`"stable"`, `"scdino"`), in the order asked.
fn reference(dir: &Path, seed: u32, ks: &[usize], t: f64, sorts: &[&str]) -> Vec<Value> {
    let ks: Vec<String> = ks.iter().map(|k| k.to_string()).collect();
    let out = run_py_file(
        "knn_reference.py",
        &[
            dir.join("features.csv").to_str().unwrap(),
            dir.join("class_labels.csv").to_str().unwrap(),
            &seed.to_string(),
            &ks.join(","),
            &t.to_string(),
            "--sort",
            &sorts.join(","),
        ],
    );
    let values: Vec<Value> = out
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("bad reference JSON ({e}): {l:.300}"))
        })
        .collect();
    assert_eq!(values.len(), sorts.len(), "{out:.300}");
    for (v, s) in values.iter().zip(sorts) {
        assert_eq!(v["sort"], *s);
    }
    values
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

/// Every count of `ours` equals the reference's.
fn assert_same(ours: &KnnReport, reference: &Value, what: &str) {
    assert_eq!(
        ours.n_train as u64,
        u64_of(&reference["n_train"]),
        "{what}: n_train"
    );
    assert_eq!(
        ours.n_test as u64,
        u64_of(&reference["n_test"]),
        "{what}: n_test"
    );
    assert_eq!(
        ours.chunk_size as u64,
        u64_of(&reference["chunk"]),
        "{what}: chunk"
    );
    let classes: Vec<String> = reference["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert_eq!(ours.classes, classes, "{what}: classes");
    let refs = reference["results"].as_array().unwrap();
    assert_eq!(ours.results.len(), refs.len());
    for (o, r) in ours.results.iter().zip(refs) {
        let k = o.k;
        assert_eq!(o.k as u64, u64_of(&r["k"]), "{what}");
        assert_eq!(
            o.k_used as u64,
            u64_of(&r["k_used"]),
            "{what} k={k}: k_used"
        );
        assert_eq!(
            o.top1_correct,
            u64_of(&r["top1"]),
            "{what} k={k}: top1 count"
        );
        assert_eq!(
            o.top2_correct,
            u64_of(&r["top2"]),
            "{what} k={k}: top2 count"
        );
        assert_eq!(o.total, u64_of(&r["total"]), "{what} k={k}: total");
        // Same counts ⇒ same f64 arithmetic; the tolerance only absorbs serde_json's fast
        // (not always correctly rounded) float parsing of Python's repr.
        for (ours, theirs) in [
            (o.top1_percent, &r["top1_percent"]),
            (o.top2_percent, &r["top2_percent"]),
        ] {
            let theirs = theirs.as_f64().unwrap();
            assert!(
                (ours - theirs).abs() <= 1e-13,
                "{what} k={k}: {ours} vs {theirs}"
            );
        }
        let line = format!(
            "{k}-NN Top1: {}, Top2: {}",
            u64_of(&r["top1_rounded"]),
            u64_of(&r["top2_rounded"])
        );
        assert!(
            o.txt_line().starts_with(&line),
            "{what}: {} vs {line}",
            o.txt_line()
        );
        let confusion: Vec<Vec<u64>> = r["confusion"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row.as_array().unwrap().iter().map(u64_of).collect())
            .collect();
        assert_eq!(o.confusion, confusion, "{what} k={k}: confusion matrix");
    }
}

/// (N, D, classes, generator seed, centre separation, rare class, kNN seed, T)
type Case = (usize, usize, usize, u32, f64, bool, u32, f64);

#[test]
fn counts_identical_to_reference_on_random_datasets() {
    let cases: [Case; 6] = [
        (150, 16, 3, 1, 0.5, false, 40, 0.1), // n_test 30 < 100: chunk 1; k 200, 500 clamped
        (777, 64, 5, 2, 0.4, false, 40, 0.1),
        (1203, 32, 6, 3, 0.45, true, 40, 0.07), // one "DC": absent from one side
        (2500, 384, 8, 4, 0.2, false, 7, 0.1),  // scDINO's ViT-S dimension
        (3001, 128, 4, 5, 0.25, false, 123_456, 0.2),
        (640, 24, 20, 6, 0.6, false, 40, 0.1), // 20 classes: stable tie order matters
    ];
    let mut worst_top1 = 100.0f64;
    for (i, &(n, d, c, gen_seed, sep, rare, seed, t)) in cases.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), n, d, c, gen_seed, sep, rare);
        let input = KnnInput::from_csv(
            &dir.path().join("features.csv"),
            &dir.path().join("class_labels.csv"),
        )
        .unwrap();
        assert_eq!((input.len(), input.dim()), (n, d));
        assert_eq!(input.features.kind(), Kind::Double);
        let cfg = KnnConfig {
            seed,
            ks: SCDINO_KS.to_vec(),
            temperature: t,
            ..KnnConfig::default()
        };
        let ours = run_global_knn(&input, &cfg).unwrap();
        let what = format!("case {i} (N={n}, D={d}, C={c}, seed={seed})");
        let sorts: &[&str] = if c <= 16 {
            &["stable", "scdino"]
        } else {
            &["stable"]
        };
        let refs = reference(dir.path(), seed, &SCDINO_KS, t, sorts);
        assert_same(&ours, &refs[0], &what);
        if c <= 16 {
            // scDINO's literal `probs.sort(1, True)` ranks ties the same way for ≤ 16 classes.
            assert_same(&ours, &refs[1], &format!("{what}, scDINO's sort"));
        }
        if rare {
            assert!(
                ours.warnings
                    .iter()
                    .any(|w| w.contains("absent from") && w.contains("\"DC\"")),
                "{:?}",
                ours.warnings
            );
        }
        if n == 150 {
            assert_eq!(ours.chunk_size, 1);
            let clamped: Vec<usize> = ours
                .results
                .iter()
                .filter(|r| r.clamped)
                .map(|r| r.k)
                .collect();
            assert_eq!(clamped, vec![200, 500]);
        }
        for r in &ours.results {
            worst_top1 = worst_top1.min(r.top1_percent);
            eprintln!("{what}: {}", r.txt_line());
        }
    }
    // The datasets are hard enough that the counts carry information.
    assert!(worst_top1 < 90.0, "all datasets are trivially separable");
}

/// 3 classes (a, b, c), N = 40 → 32 train rows (each exactly on its class axis), 8 test rows
/// pointing at chosen classes, so every prediction and every vote tie is known by hand.
fn hand_case() -> (Tensor, Vec<String>) {
    let n = 40;
    let order = numpy_shuffled_indices(n, 40);
    let names = ["a", "b", "c"];
    // (true label, axis the test row points at), in test order.
    let test = [
        (0, 0),
        (0, 1),
        (1, 1),
        (1, 2),
        (2, 2),
        (2, 1),
        (2, 0),
        (1, 0),
    ];
    let mut feats = vec![0f64; n * 3];
    let mut labels = vec![String::new(); n];
    for (pos, &row) in order.iter().enumerate() {
        let (label, axis) = if pos < 32 {
            (pos % 3, pos % 3)
        } else {
            test[pos - 32]
        };
        feats[row * 3 + axis] = 1.0;
        labels[row] = names[label].to_string();
    }
    (Tensor::from_slice(&feats).view([n as i64, 3]), labels)
}

#[test]
fn hand_computed_metrics_confusion_and_ties() {
    let (features, labels) = hand_case();
    let input = KnnInput::new(features, labels).unwrap();
    let cfg = KnnConfig {
        ks: vec![1, 3],
        ..KnnConfig::default()
    };
    let report = run_global_knn(&input, &cfg).unwrap();
    assert_eq!(
        (report.n_train, report.n_test, report.chunk_size),
        (32, 8, 1)
    );
    assert_eq!(report.classes, vec!["a", "b", "c"]);
    // Predictions = the axis. Correct top-1: rows 1, 3, 5 → 3/8 = 37.5 % → round → 38.
    // k = 3: all neighbours share one class, the others tie at 0 votes and the stable sort puts
    // the lowest code second: a→[a,b], b→[b,a], c→[c,a]. Top-2 hits: rows 1, 2, 3, 5, 8 → 5/8 =
    // 62.5 % → 62. k = 1: top-2 looks at min(2, k) = 1 class, so it equals top-1.
    let r3 = &report.results[1];
    assert_eq!((r3.top1_correct, r3.top2_correct, r3.total), (3, 5, 8));
    assert_eq!((r3.top1_percent, r3.top2_percent), (37.5, 62.5));
    assert_eq!(r3.txt_line(), "3-NN Top1: 38, Top2: 62");
    let r1 = &report.results[0];
    assert_eq!((r1.top1_correct, r1.top2_correct), (3, 3));
    assert_eq!(r1.txt_line(), "1-NN Top1: 38, Top2: 38");
    for r in &report.results {
        assert_eq!(
            r.confusion,
            vec![vec![1, 1, 0], vec![1, 1, 1], vec![1, 1, 1]]
        );
        let m =
            |class: &str, support, predicted, precision: f64, recall: f64, f1: f64| ClassMetrics {
                class: class.into(),
                support,
                predicted,
                true_positives: 1,
                precision,
                recall,
                f1,
            };
        let want = vec![
            m("a", 2, 3, 1.0 / 3.0, 0.5, 0.4),
            m("b", 3, 3, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0),
            m("c", 3, 2, 0.5, 1.0 / 3.0, 0.4),
        ];
        for (got, want) in r.per_class.iter().zip(&want) {
            assert_eq!(
                (&got.class, got.support, got.predicted, got.true_positives),
                (
                    &want.class,
                    want.support,
                    want.predicted,
                    want.true_positives
                )
            );
            for (g, w) in [
                (got.precision, want.precision),
                (got.recall, want.recall),
                (got.f1, want.f1),
            ] {
                assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
            }
        }
        assert!((r.macro_f1 - (0.4 + 1.0 / 3.0 + 0.4) / 3.0).abs() < 1e-12);
    }
    // JSON carries the extras.
    let json: Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["results"][1]["top2_correct"], 5);
    assert_eq!(
        json["results"][1]["confusion"][0],
        serde_json::json!([1, 1, 0])
    );
    assert_eq!(json["results"][1]["per_class"][2]["predicted"], 2);
    assert_eq!(json["classes"], serde_json::json!(["a", "b", "c"]));

    // The Python reference agrees on the hand case (written through CSV).
    let dir = tempfile::tempdir().unwrap();
    let (features, labels) = hand_case();
    let rows: Vec<f64> = Vec::try_from(features.view([-1])).unwrap();
    let csv: String = rows
        .chunks(3)
        .map(|r| format!("{:.18e},{:.18e},{:.18e}\n", r[0], r[1], r[2]))
        .collect();
    std::fs::write(dir.path().join("features.csv"), csv).unwrap();
    std::fs::write(
        dir.path().join("class_labels.csv"),
        labels.join("\n") + "\n",
    )
    .unwrap();
    let reread = KnnInput::from_csv(
        &dir.path().join("features.csv"),
        &dir.path().join("class_labels.csv"),
    )
    .unwrap();
    assert_eq!(run_global_knn(&reread, &cfg).unwrap(), report);
    let refs = reference(dir.path(), 40, &[1, 3], 0.1, &["stable", "scdino"]);
    assert_same(&report, &refs[0], "hand case");
    assert_same(&report, &refs[1], "hand case, scDINO's sort");
}

/// More than 16 classes, every test row's k neighbours in one class: the second place is a tie
/// among 19 zero-vote classes. The stable sort takes the lowest code; scDINO's unstable
/// `probs.sort(1, True)` takes another class (libstdc++ introsort), so its top-2 differs.
#[test]
fn vote_ties_with_many_classes_follow_the_stable_sort() {
    let (n, c) = (100, 20);
    let order = numpy_shuffled_indices(n, 40);
    let mut feats = vec![0f64; n * c];
    let mut labels = vec![String::new(); n];
    for (pos, &row) in order.iter().enumerate() {
        let (label, axis) = if pos < 80 {
            (pos % c, pos % c)
        } else {
            // Points at class p; labelled with the lowest code other than p.
            let p = pos % c;
            (usize::from(p == 0), p)
        };
        feats[row * c + axis] = 1.0;
        labels[row] = format!("class_{label:02}");
    }
    let features = Tensor::from_slice(&feats).view([n as i64, c as i64]);
    let input = KnnInput::new(features, labels.clone()).unwrap();
    let cfg = KnnConfig {
        ks: vec![3],
        ..KnnConfig::default()
    };
    let report = run_global_knn(&input, &cfg).unwrap();
    let r = &report.results[0];
    assert_eq!((r.top1_correct, r.top2_correct, r.total), (0, 20, 20));

    let dir = tempfile::tempdir().unwrap();
    let csv: String = feats
        .chunks(c)
        .map(|row| {
            let cells: Vec<String> = row.iter().map(|v| format!("{v:.18e}")).collect();
            cells.join(",") + "\n"
        })
        .collect();
    std::fs::write(dir.path().join("features.csv"), csv).unwrap();
    std::fs::write(
        dir.path().join("class_labels.csv"),
        labels.join("\n") + "\n",
    )
    .unwrap();
    let refs = reference(dir.path(), 40, &[3], 0.1, &["stable", "scdino"]);
    assert_same(&report, &refs[0], "20 classes");
    let scdino_top2 = u64_of(&refs[1]["results"][0]["top2"]);
    assert!(
        scdino_top2 < 20,
        "scDINO's unstable sort now ranks ties stably: {scdino_top2}"
    );
}

fn k_result(k: usize, k_used: usize, top1: u64, top2: u64, total: u64) -> KnnKResult {
    KnnKResult {
        k,
        k_used,
        clamped: k_used < k,
        top1_correct: top1,
        top2_correct: top2,
        total,
        top1_percent: top1 as f64 * 100.0 / total as f64,
        top2_percent: top2 as f64 * 100.0 / total as f64,
        per_class: vec![],
        macro_f1: 0.0,
        confusion: vec![],
    }
}

#[test]
fn txt_lines_round_half_to_even() {
    // Python: round(1*100.0/8) == 12, round(3*100.0/8) == 38, round(1*100.0/40) == 2,
    // round(7*100.0/40) == 18, round(5*100.0/8) == 62, round(199*100.0/200) == 100,
    // round(1*100.0/200) == 0.
    let cases = [
        (1, 8, 12),
        (3, 8, 38),
        (5, 8, 62),
        (1, 40, 2),
        (7, 40, 18),
        (199, 200, 100),
        (1, 200, 0),
        (2, 3, 67),
        (1, 3, 33),
    ];
    for (count, total, want) in cases {
        let r = k_result(5, 5, count, count, total);
        assert_eq!(
            r.txt_line(),
            format!("5-NN Top1: {want}, Top2: {want}"),
            "{count}/{total}"
        );
    }
    let clamped = k_result(500, 120, 30, 30, 30);
    assert_eq!(
        clamped.txt_line(),
        "500-NN Top1: 100, Top2: 100 (k clamped to 120, the number of training samples)"
    );
}

#[test]
fn global_knn_txt_exact_format_and_append() {
    let (features, labels) = hand_case();
    let input = KnnInput::new(features, labels).unwrap();
    let cfg = KnnConfig {
        ks: vec![3, 50],
        ..KnnConfig::default()
    };
    let report = run_global_knn(&input, &cfg).unwrap();
    assert_eq!(
        report.warnings,
        vec!["k = 50 exceeds the 32 training rows; clamped to 32"]
    );
    let r50 = &report.results[1];
    assert_eq!((r50.k, r50.k_used, r50.clamped), (50, 32, true));
    // k = 32 = every training row: the pointed-at class (≈ 11·e^10) wins, so top-1 is as k = 3.
    assert_eq!(r50.top1_correct, 3);
    let block = report.txt_block("out/run1/ViT-S16_channel_DAPI_epoch0");
    // Second place: the class with more training rows (a, b: 11 each; c: 10), a before b on
    // the exact tie 11·e^0 = 11 (stable sort), so the same top-2 as k = 3.
    assert_eq!(r50.top2_correct, 5);
    let expected = "Run: out/run1/ViT-S16_channel_DAPI_epoch0\n\
         3-NN Top1: 38, Top2: 62\n\
         50-NN Top1: 38, Top2: 62 (k clamped to 32, the number of training samples)\n\
         --------------------------------------------------\n";
    assert_eq!(block, expected);
    assert_eq!(SEPARATOR.len(), 50);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("global_kNN.txt");
    append_txt(&path, &block).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), block);
    let second = report.txt_block("out/run1/ViT-S16_channel_DAPI_epoch1");
    append_txt(&path, &second).unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("{block}{second}")
    );
    // A truncated last line gets its newline before the appended run.
    std::fs::write(&path, "Run: old\n5-NN Top1: 1, Top2: 2").unwrap();
    append_txt(&path, &second).unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("Run: old\n5-NN Top1: 1, Top2: 2\n{second}")
    );
    // Atomic: no temporary file is left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["global_kNN.txt"]);
    // A missing directory is an error naming the path.
    let err = append_txt(&dir.path().join("missing/global_kNN.txt"), &block).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}

fn err_text(r: Result<impl std::fmt::Debug, KnnError>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn csv_errors_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("features.csv");
    let l = dir.path().join("class_labels.csv");
    let fs = f.display().to_string();
    let ls = l.display().to_string();

    std::fs::write(&f, "1.0,0.0\n0.5,0.5\n0.1,zz\n").unwrap();
    let e = err_text(read_features_csv(&f));
    assert!(
        e.starts_with(&format!("{fs}:3: column 2")) && e.contains("zz"),
        "{e}"
    );

    std::fs::write(&f, "1.0,0.0\n0.5,0.5,0.1\n").unwrap();
    let e = err_text(read_features_csv(&f));
    assert_eq!(e, format!("{fs}:2: 3 values, but line 1 has 2"));

    std::fs::write(&f, "1.0,0.0\n\n0.5,0.5\n").unwrap();
    assert!(err_text(read_features_csv(&f)).starts_with(&format!("{fs}:2: empty line")));

    std::fs::write(&f, "1.0,nan\n").unwrap();
    assert!(err_text(read_features_csv(&f)).starts_with(&format!("{fs}:1: column 2: non-finite")));

    std::fs::write(&f, "").unwrap();
    assert!(err_text(read_features_csv(&f)).starts_with(&format!("{fs}:1: empty file")));

    let missing = dir.path().join("nope.csv");
    let e = err_text(read_features_csv(&missing));
    assert!(
        e.starts_with(&format!("{}: reading", missing.display())),
        "{e}"
    );

    std::fs::write(&l, "B\n\nNK\n").unwrap();
    assert_eq!(
        err_text(read_labels_csv(&l)),
        format!("{ls}:2: empty label")
    );
    std::fs::write(&l, b"B\nN\xffK\n").unwrap();
    assert_eq!(
        err_text(read_labels_csv(&l)),
        format!("{ls}:2: not valid UTF-8 text")
    );

    // CRLF, a final newline and %.18e / plain numbers all read; labels are kept verbatim.
    std::fs::write(&f, "1.000000000000000000e+00, 0\r\n-2.5E-1,1e0\r\n").unwrap();
    std::fs::write(&l, "CD4 T\r\nNK\n").unwrap();
    let input = KnnInput::from_csv(&f, &l).unwrap();
    let v: Vec<f64> = Vec::try_from(input.features.view([-1])).unwrap();
    assert_eq!(v, vec![1.0, 0.0, -0.25, 1.0]);
    assert_eq!(input.labels, vec!["CD4 T", "NK"]);

    std::fs::write(&l, "CD4 T\nNK\nB\n").unwrap();
    let e = err_text(KnnInput::from_csv(&f, &l));
    assert!(
        e.contains(&fs)
            && e.contains(&ls)
            && e.contains("2 feature rows")
            && e.contains("3 labels"),
        "{e}"
    );
}

#[test]
fn invalid_inputs_are_errors_not_panics() {
    // Draws from (or initialises a model with) the process-wide generator.
    let _rng = super::util::torch_rng_lock();
    let labels = |n: usize| (0..n).map(|i| format!("c{}", i % 2)).collect::<Vec<_>>();
    let feats = |n: i64| Tensor::randn([n, 4], (Kind::Double, tch::Device::Cpu));
    assert!(KnnInput::new(feats(3), labels(4)).is_err());
    assert!(KnnInput::new(
        Tensor::zeros([3, 4], (Kind::Int64, tch::Device::Cpu)),
        labels(3)
    )
    .is_err());
    // N = 1: int(0.8) = 0 training rows.
    let one = KnnInput::new(feats(1), labels(1)).unwrap();
    let e = err_text(run_global_knn(&one, &KnnConfig::default()));
    assert!(e.contains("0 train"), "{e}");
    let ok = KnnInput::new(feats(10), labels(10)).unwrap();
    for cfg in [
        KnnConfig {
            ks: vec![],
            ..KnnConfig::default()
        },
        KnnConfig {
            ks: vec![0, 5],
            ..KnnConfig::default()
        },
        KnnConfig {
            temperature: 0.0,
            ..KnnConfig::default()
        },
        KnnConfig {
            temperature: f64::NAN,
            ..KnnConfig::default()
        },
    ] {
        assert!(run_global_knn(&ok, &cfg).is_err(), "{cfg:?}");
    }
    // exp(1 / 1e-4) overflows: an error, not NaN rankings.
    let normed = {
        let f = feats(10);
        &f / f.norm_scalaropt_dim(2.0, [1], true)
    };
    let tiny_t = KnnInput::new(normed, labels(10)).unwrap();
    let e = err_text(run_global_knn(
        &tiny_t,
        &KnnConfig {
            temperature: 1e-4,
            ..KnnConfig::default()
        },
    ));
    assert!(e.contains("non-finite votes"), "{e}");
    // f32 features work too (N = 5 → 4 train, 1 test; every k clamped to 4).
    let f32_input = KnnInput::new(feats(5).to_kind(Kind::Float), labels(5)).unwrap();
    let r = run_global_knn(&f32_input, &KnnConfig::default()).unwrap();
    assert_eq!((r.n_train, r.n_test), (4, 1));
    assert!(r.results.iter().all(|x| x.k_used == 4 && x.total == 1));
}

/// scDINO's scale (113,564 held-out images → 90,851 train × 22,713 test, D = 384, f64):
/// memory stays bounded by the chunking. Run with `--ignored --nocapture` for the timing.
#[test]
#[ignore = "timing at scDINO scale (~1.6 TFLOP in f64); run explicitly"]
fn scdino_scale_timing() {
    // Draws from (or initialises a model with) the process-wide generator.
    let _rng = super::util::torch_rng_lock();
    let n = 113_564;
    tch::manual_seed(0);
    let f = Tensor::randn([n, 384], (Kind::Double, tch::Device::Cpu));
    let f = &f / f.norm_scalaropt_dim(2.0, [1], true);
    let labels: Vec<String> = (0..n).map(|i| format!("class_{}", (i * 7) % 8)).collect();
    let input = KnnInput::new(f, labels).unwrap();
    let start = std::time::Instant::now();
    let report = run_global_knn(&input, &KnnConfig::default()).unwrap();
    eprintln!(
        "N={n}: {} train × {} test, chunk {}, {} threads: {:.1} s",
        report.n_train,
        report.n_test,
        report.chunk_size,
        tch::get_num_threads(),
        start.elapsed().as_secs_f64()
    );
    assert_eq!((report.n_train, report.n_test), (90_851, 22_713));
    assert_eq!(report.chunk_size, 227);
}
