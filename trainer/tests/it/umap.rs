//! UMAP (`trainer::analysis::umap`): our trustworthiness against scikit-learn's, the
//! embedding's quality on clustered data, the configured knobs and the seed actually mattering,
//! exact kNN against brute force, and the scatter PNG read back.
use tch::{Kind, Tensor};
use trainer::analysis::umap::{fit, knn_graph, trustworthiness, UmapParams};
use trainer::config::UmapMetric;

use super::util::run_python;

/// `n` L2-normalised points around `c` Gaussian centres in `d` dimensions (labels returned).
fn clustered(n: usize, d: usize, c: usize, sep: f64, seed: i64) -> (Tensor, Vec<usize>) {
    tch::manual_seed(seed);
    let centres = Tensor::randn([c as i64, d as i64], (Kind::Double, tch::Device::Cpu)) * sep;
    let labels: Vec<usize> = (0..n).map(|i| i % c).collect();
    let idx = Tensor::from_slice(&labels.iter().map(|&l| l as i64).collect::<Vec<_>>());
    let x = centres.index_select(0, &idx)
        + Tensor::randn([n as i64, d as i64], (Kind::Double, tch::Device::Cpu));
    let x = &x / x.norm_scalaropt_dim(2.0, [1], true);
    (x.to_kind(Kind::Float), labels)
}

fn params(seed: u64) -> UmapParams {
    UmapParams {
        n_neighbors: 15,
        min_dist: 0.1,
        spread: 1.0,
        epochs: 200,
        metric: UmapMetric::Euclidean,
        seed,
        negative_sample_rate: 5,
    }
}

/// 1-NN accuracy of the 2-D embedding (leave-one-out): how well classes separate.
fn embedded_1nn_accuracy(emb: &[[f32; 2]], labels: &[usize]) -> f64 {
    let mut correct = 0;
    for i in 0..emb.len() {
        let mut best = (f32::MAX, 0);
        for j in 0..emb.len() {
            if i != j {
                let d = (emb[i][0] - emb[j][0]).powi(2) + (emb[i][1] - emb[j][1]).powi(2);
                if d < best.0 {
                    best = (d, j);
                }
            }
        }
        correct += usize::from(labels[best.1] == labels[i]);
    }
    correct as f64 / emb.len() as f64
}

#[test]
fn trustworthiness_matches_sklearn() {
    let _g = super::util::torch_rng_lock();
    let (x, _) = clustered(300, 16, 4, 1.0, 3);
    // A deliberately poor "embedding": two feature coordinates plus noise.
    let noise = Tensor::randn([300, 2], (Kind::Float, tch::Device::Cpu)) * 0.3;
    let e = x.narrow(1, 0, 2) + noise;
    let ev = Vec::<f32>::try_from(e.flatten(0, -1)).unwrap();
    let emb: Vec<[f32; 2]> = ev.chunks(2).map(|p| [p[0], p[1]]).collect();
    let dir = tempfile::tempdir().unwrap();
    let xs = dir.path().join("x.npy");
    let es = dir.path().join("e.npy");
    x.to_kind(Kind::Double).write_npy(&xs).unwrap();
    e.to_kind(Kind::Double).write_npy(&es).unwrap();
    for k in [5usize, 12] {
        let ours = trustworthiness(&x, &emb, k).unwrap();
        let out = run_python(
            "import sys, numpy as np\nfrom sklearn.manifold import trustworthiness\n\
             x = np.load(sys.argv[1]); e = np.load(sys.argv[2]).astype(np.float32)\n\
             print(repr(float(trustworthiness(x, e, n_neighbors=int(sys.argv[3])))))",
            &[xs.to_str().unwrap(), es.to_str().unwrap(), &k.to_string()],
        );
        let theirs: f64 = out.trim().parse().unwrap();
        assert!(
            (ours - theirs).abs() < 1e-9,
            "k={k}: ours {ours} vs sklearn {theirs}"
        );
        assert!(
            ours < 0.99,
            "the noisy embedding should not look perfect: {ours}"
        );
    }
}

#[test]
fn embedding_is_trustworthy_and_separates_classes() {
    let _g = super::util::torch_rng_lock();
    let (x, labels) = clustered(600, 64, 5, 0.6, 11);
    let emb = fit(&x, &params(42)).unwrap();
    assert_eq!(emb.len(), 600);
    assert!(emb.iter().all(|p| p[0].is_finite() && p[1].is_finite()));
    let t = trustworthiness(&x, &emb, 15).unwrap();
    assert!(t > 0.90, "trustworthiness {t}");
    let acc = embedded_1nn_accuracy(&emb, &labels);
    assert!(acc > 0.95, "1-NN accuracy in 2-D: {acc}");
    // A random layout of the same points scores far lower: the threshold above can fail.
    let rand = Tensor::rand([600, 2], (Kind::Float, tch::Device::Cpu));
    let rv = Vec::<f32>::try_from(rand.flatten(0, -1)).unwrap();
    let random: Vec<[f32; 2]> = rv.chunks(2).map(|p| [p[0], p[1]]).collect();
    let t_random = trustworthiness(&x, &random, 15).unwrap();
    assert!(t_random < 0.6, "random layout trustworthiness {t_random}");
}

#[test]
fn seed_and_knobs_are_honoured() {
    let _g = super::util::torch_rng_lock();
    let (x, _) = clustered(300, 32, 3, 0.8, 5);
    let a = fit(&x, &params(1)).unwrap();
    let b = fit(&x, &params(1)).unwrap();
    let c = fit(&x, &params(2)).unwrap();
    assert_eq!(a, b, "same seed, same embedding");
    assert_ne!(a, c, "the seed reaches the layout");
    // min_dist changes the packing: the mean nearest-neighbour distance grows with it.
    let spread_of = |min_dist: f32| {
        let mut p = params(1);
        p.min_dist = min_dist;
        p.spread = 1.0;
        let e = fit(&x, &p).unwrap();
        let mut total = 0.0f64;
        for i in 0..e.len() {
            let mut best = f32::MAX;
            for j in 0..e.len() {
                if i != j {
                    best = best.min((e[i][0] - e[j][0]).powi(2) + (e[i][1] - e[j][1]).powi(2));
                }
            }
            total += (best as f64).sqrt();
        }
        total / e.len() as f64
    };
    let tight = spread_of(0.0);
    let loose = spread_of(0.9);
    assert!(
        loose > 1.25 * tight,
        "min_dist 0.9 → {loose}, 0.0 → {tight}"
    );
    let mut few = params(1);
    few.n_neighbors = 400;
    assert!(
        fit(&x, &few).is_err(),
        "n_neighbors above the row count is an error"
    );
}

#[test]
fn knn_graph_is_exact() {
    let _g = super::util::torch_rng_lock();
    let (x, _) = clustered(200, 8, 3, 1.0, 7);
    for metric in [
        UmapMetric::Euclidean,
        UmapMetric::Cosine,
        UmapMetric::Manhattan,
    ] {
        let (idx, dist) = knn_graph(&x, 6, metric).unwrap();
        let xv = Vec::<f32>::try_from(x.flatten(0, -1)).unwrap();
        let row = |i: usize| &xv[i * 8..(i + 1) * 8];
        let d = |a: &[f32], b: &[f32]| -> f32 {
            match metric {
                UmapMetric::Euclidean => a
                    .iter()
                    .zip(b)
                    .map(|(p, q)| (p - q).powi(2))
                    .sum::<f32>()
                    .sqrt(),
                UmapMetric::Manhattan => a.iter().zip(b).map(|(p, q)| (p - q).abs()).sum(),
                _ => {
                    let dot: f32 = a.iter().zip(b).map(|(p, q)| p * q).sum();
                    let na: f32 = a.iter().map(|p| p * p).sum::<f32>().sqrt();
                    let nb: f32 = b.iter().map(|p| p * p).sum::<f32>().sqrt();
                    1.0 - dot / (na * nb)
                }
            }
        };
        for i in 0..200 {
            assert_eq!(idx[(i, 0)] as usize, i, "{metric:?}: self first");
            let mut all: Vec<(f32, usize)> = (0..200)
                .filter(|&j| j != i)
                .map(|j| (d(row(i), row(j)), j))
                .collect();
            all.sort_by(|a, b| a.partial_cmp(b).unwrap());
            for c in 1..6 {
                assert!(
                    (dist[(i, c)] - all[c - 1].0).abs() < 1e-4,
                    "{metric:?} row {i} col {c}: {} vs {}",
                    dist[(i, c)],
                    all[c - 1].0
                );
            }
        }
    }
}

#[test]
fn scatter_png_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plots/epoch4_umap.png");
    let points: Vec<[f32; 2]> = (0..50).map(|i| [i as f32, (i * i) as f32]).collect();
    let labels: Vec<usize> = (0..50).map(|i| i % 3).collect();
    let names = vec!["B".to_string(), "CD4_T".into(), "NK".into()];
    trainer::plot::scatter_png(
        &path,
        &trainer::plot::ScatterSpec {
            points: &points,
            labels: &labels,
            class_names: &names,
            title: "CLS Token embedding of 50 cells with a dimensionality of 192",
            subtitle: "n_neighbors=15",
            width: 800,
            height: 600,
        },
    )
    .unwrap();
    let img = image::open(&path).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (800, 600));
    // Some pixels carry each class colour.
    for c in trainer::plot::hls_palette(3) {
        let found = img.pixels().any(|p| {
            (p[0] as i32 - c.0 as i32).abs() < 30
                && (p[1] as i32 - c.1 as i32).abs() < 30
                && (p[2] as i32 - c.2 as i32).abs() < 30
        });
        assert!(found, "colour {c:?} missing");
    }
    let bad = trainer::plot::scatter_png(
        &path,
        &trainer::plot::ScatterSpec {
            points: &points,
            labels: &labels[..10],
            class_names: &names,
            title: "",
            subtitle: "",
            width: 100,
            height: 100,
        },
    );
    assert!(bad.is_err());
}
