//! 2-D UMAP of the CLS features (scDINO `plot_in_2D.py`), honouring the configured
//! n_neighbors, min_dist, spread, epochs, metric and seed (scDINO hard-coded 15 / 0.1 and
//! ignored the config).
//!
//! The fuzzy simplicial set and the (a, b) curve come from the `umap-rs` crate (deterministic).
//! Its SGD layout uses an unseeded thread-local RNG and Hogwild threads, so the layout here is
//! our own single-threaded port of umap-learn's `optimize_layout_euclidean` with a seeded
//! Tausworthe generator: the same seed gives the same embedding, bit for bit. Initialisation is
//! umap-learn's `init="pca"` (the default `"spectral"` needs an eigensolver on the graph
//! Laplacian). Exact kNN comes from chunked matrix products.
use crate::config::UmapMetric;
use ndarray::Array2;
use scdino_base::rng::SplitMix64;
use tch::{Kind, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum UmapError {
    #[error("UMAP needs at least {needed} feature rows for n_neighbors={k}, got {got}")]
    TooFewRows { needed: usize, k: usize, got: usize },
    #[error("umap epochs must be > 0")]
    NoEpochs,
    /// The features could not be laid out as an `[N, D]` array for the fit.
    #[error("{0}")]
    Shape(#[from] ndarray::ShapeError),
    #[error("{features} feature rows but {embedded} embedded points")]
    RowCountMismatch { features: usize, embedded: usize },
}

/// The knobs that reach the algorithm (config `downstream.umap` + `run.seed`).
#[derive(Debug, Clone)]
pub struct UmapParams {
    pub n_neighbors: usize,
    pub min_dist: f32,
    pub spread: f32,
    pub epochs: usize,
    pub metric: UmapMetric,
    pub seed: u64,
    /// umap-learn's default 5.
    pub negative_sample_rate: usize,
}

/// Exact k nearest neighbours of every row (itself first, at distance 0, as umap-learn's
/// nearest-neighbour descent returns them).
pub fn knn_graph(
    features: &Tensor,
    k: usize,
    metric: UmapMetric,
) -> Result<(Array2<u32>, Array2<f32>), UmapError> {
    let x = features.to_kind(Kind::Float).contiguous();
    let n = x.size()[0] as usize;
    if k < 2 || n < k {
        return Err(UmapError::TooFewRows {
            needed: k.max(2),
            k,
            got: n,
        });
    }
    // Correlation distance is the cosine distance of mean-centred rows.
    let x = match metric {
        UmapMetric::Correlation => &x - x.mean_dim(Some(&[1i64][..]), true, Kind::Float),
        _ => x,
    };
    let sq = (&x * &x).sum_dim_intlist(1, false, Kind::Float);
    let norms = sq.sqrt().clamp_min(1e-12);
    let mut idx = Array2::<u32>::zeros((n, k));
    let mut dist = Array2::<f32>::zeros((n, k));
    let chunk = 1024usize;
    tch::no_grad(|| {
        for start in (0..n).step_by(chunk) {
            let len = chunk.min(n - start) as i64;
            let rows = x.narrow(0, start as i64, len);
            let d = match metric {
                UmapMetric::Euclidean => (sq.narrow(0, start as i64, len).unsqueeze(1)
                    + sq.unsqueeze(0)
                    - rows.matmul(&x.tr()) * 2.0)
                    .clamp_min(0.0)
                    .sqrt(),
                UmapMetric::Cosine | UmapMetric::Correlation => {
                    let denom =
                        norms.narrow(0, start as i64, len).unsqueeze(1) * norms.unsqueeze(0);
                    (rows.matmul(&x.tr()) / denom).neg() + 1.0
                }
                UmapMetric::Manhattan => Tensor::cdist(&rows, &x, 1.0, None::<i64>),
            };
            // Self first: below every real distance, then reported as exactly 0.
            let diag =
                Tensor::arange_start(start as i64, start as i64 + len, (Kind::Int64, x.device()));
            let d = d.shallow_clone().index_put_(
                &[
                    Some(Tensor::arange(len, (Kind::Int64, x.device()))),
                    Some(diag),
                ],
                &Tensor::from(-1.0f32),
                false,
            );
            let (vals, inds) = d.topk(k as i64, 1, false, true);
            let vals = Vec::<f32>::try_from(vals.flatten(0, -1)).expect("f32 distances");
            let inds = Vec::<i64>::try_from(inds.flatten(0, -1)).expect("i64 indices");
            for r in 0..len as usize {
                for c in 0..k {
                    idx[(start + r, c)] = inds[r * k + c] as u32;
                    dist[(start + r, c)] = if c == 0 {
                        0.0
                    } else {
                        vals[r * k + c].max(0.0)
                    };
                }
            }
        }
    });
    Ok((idx, dist))
}

/// umap-learn's `tau_rand_int`: three Tausworthe registers.
struct TauRand([u32; 3]);

impl TauRand {
    fn new(seed: u64) -> Self {
        let mut sm = SplitMix64::new(seed);
        // Each register needs enough high bits set to leave the degenerate states.
        let mut s = [0u32; 3];
        for (i, v) in s.iter_mut().enumerate() {
            *v = (sm.next_u64() >> 32) as u32 | (1 << (4 + i));
        }
        Self(s)
    }

    fn next(&mut self) -> u32 {
        let s = &mut self.0;
        s[0] = ((s[0] & 4294967294) << 12) ^ (((s[0] << 13) ^ s[0]) >> 19);
        s[1] = ((s[1] & 4294967288) << 4) ^ (((s[1] << 2) ^ s[1]) >> 25);
        s[2] = ((s[2] & 4294967280) << 17) ^ (((s[2] << 3) ^ s[2]) >> 11);
        s[0] ^ s[1] ^ s[2]
    }
}

/// umap-learn `init="pca"`: the first two principal components scaled so the largest
/// coordinate is 10, plus N(0, 1e-4) noise; then `simplicial_set_embedding`'s rescale of each
/// axis to [0, 10].
fn pca_init(features: &Tensor, rng: &mut SplitMix64) -> Vec<[f32; 2]> {
    let x = features.to_kind(Kind::Double);
    let centred = &x - x.mean_dim(Some(&[0i64][..]), true, Kind::Double);
    let cov = centred.tr().matmul(&centred);
    let (_evals, evecs) = cov.linalg_eigh("L");
    let d = evecs.size()[1];
    // eigh sorts ascending: the last two columns are the leading components.
    let mut comps = evecs.narrow(1, d - 2, 2).flip([1]);
    // Fix each component's sign (largest-magnitude loading positive), as sklearn's svd_flip.
    let arg = comps.abs().argmax(0, false);
    let signs = comps.gather(0, &arg.unsqueeze(0), false).sign();
    comps *= signs;
    let proj = centred.matmul(&comps);
    let max_abs = f64::try_from(proj.abs().max()).unwrap_or(1.0).max(1e-12);
    let proj = Vec::<f64>::try_from((proj * (10.0 / max_abs)).flatten(0, -1)).expect("f64");
    let mut pts: Vec<[f32; 2]> = proj
        .chunks(2)
        .map(|p| {
            [
                (p[0] + 1e-4 * normal(rng)) as f32,
                (p[1] + 1e-4 * normal(rng)) as f32,
            ]
        })
        .collect();
    for axis in 0..2 {
        let lo = pts.iter().map(|p| p[axis]).fold(f32::MAX, f32::min);
        let hi = pts.iter().map(|p| p[axis]).fold(f32::MIN, f32::max);
        let span = (hi - lo).max(1e-12);
        for p in &mut pts {
            p[axis] = 10.0 * (p[axis] - lo) / span;
        }
    }
    pts
}

fn normal(rng: &mut SplitMix64) -> f64 {
    let u1 = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Fits a 2-D embedding of `features` (`[N, D]`).
pub fn fit(features: &Tensor, p: &UmapParams) -> Result<Vec<[f32; 2]>, UmapError> {
    use umap_rs::{GraphParams, ManifoldParams, Umap, UmapConfig};
    if p.epochs == 0 {
        return Err(UmapError::NoEpochs);
    }
    let n = features.size()[0] as usize;
    let k = p.n_neighbors;
    if n <= k {
        return Err(UmapError::TooFewRows {
            needed: k + 1,
            k,
            got: n,
        });
    }
    let (knn_idx, knn_dist) = knn_graph(features, k, p.metric)?;
    let data = {
        let x = features.to_kind(Kind::Float).contiguous();
        let v = Vec::<f32>::try_from(x.flatten(0, -1)).expect("f32 features");
        Array2::from_shape_vec((n, x.size()[1] as usize), v)?
    };
    let config = UmapConfig {
        n_components: 2,
        graph: GraphParams {
            n_neighbors: k,
            ..GraphParams::default()
        },
        manifold: ManifoldParams {
            min_dist: p.min_dist,
            spread: p.spread,
            a: None,
            b: None,
        },
        ..UmapConfig::default()
    };
    let manifold = Umap::new(config).learn_manifold(data.view(), knn_idx.view(), knn_dist.view());
    let (a, b) = manifold.curve_params();

    // umap-learn: drop edges too weak to be sampled once in n_epochs.
    let graph = manifold.graph();
    let max_w = graph.data().iter().copied().fold(0.0f32, f32::max);
    let floor = max_w / p.epochs as f32;
    let mut head = Vec::new();
    let mut tail = Vec::new();
    let mut weight = Vec::new();
    for (row, vec) in graph.outer_iterator().enumerate() {
        for (col, &w) in vec.iter() {
            if w >= floor && w > 0.0 {
                head.push(row);
                tail.push(col);
                weight.push(w as f64);
            }
        }
    }
    let mut rng = SplitMix64::new(p.seed);
    let mut emb = pca_init(features, &mut rng);
    let mut tau = TauRand::new(rng.next_u64());
    optimize_layout(
        &mut emb, &head, &tail, &weight, a as f64, b as f64, p, &mut tau,
    );
    Ok(emb)
}

/// Single-threaded port of umap-learn's `optimize_layout_euclidean` (gamma 1, initial alpha 1,
/// move_other, gradients clipped to ±4).
#[allow(clippy::too_many_arguments)]
fn optimize_layout(
    emb: &mut [[f32; 2]],
    head: &[usize],
    tail: &[usize],
    weight: &[f64],
    a: f64,
    b: f64,
    p: &UmapParams,
    rng: &mut TauRand,
) {
    let n_vertices = emb.len() as u32;
    let n_epochs = p.epochs;
    let max_w = weight.iter().copied().fold(0.0f64, f64::max).max(1e-300);
    // make_epochs_per_sample
    let eps: Vec<f64> = weight
        .iter()
        .map(|&w| {
            let samples = n_epochs as f64 * (w / max_w);
            if samples > 0.0 {
                n_epochs as f64 / samples
            } else {
                -1.0
            }
        })
        .collect();
    let neg_rate = p.negative_sample_rate.max(1) as f64;
    let eps_neg: Vec<f64> = eps.iter().map(|e| e / neg_rate).collect();
    let mut next_sample = eps.clone();
    let mut next_neg = eps_neg.clone();
    let clip = |v: f64| v.clamp(-4.0, 4.0);
    let mut alpha = 1.0f64;
    for epoch in 0..n_epochs {
        let n = epoch as f64;
        for i in 0..head.len() {
            if next_sample[i] > n {
                continue;
            }
            let (j, k) = (head[i], tail[i]);
            let cur = emb[j];
            let oth = emb[k];
            let d2 = rdist(cur, oth);
            let coeff = if d2 > 0.0 {
                (-2.0 * a * b * d2.powf(b - 1.0)) / (a * d2.powf(b) + 1.0)
            } else {
                0.0
            };
            let mut cur = cur;
            for d in 0..2 {
                let g = clip(coeff * (cur[d] as f64 - oth[d] as f64));
                cur[d] += (g * alpha) as f32;
                emb[k][d] -= (g * alpha) as f32;
            }
            emb[j] = cur;
            next_sample[i] += eps[i];
            let n_neg = ((n - next_neg[i]) / eps_neg[i]).floor().max(0.0) as usize;
            for _ in 0..n_neg {
                let kk = (rng.next() % n_vertices) as usize;
                let oth = emb[kk];
                let cur = emb[j];
                let d2 = rdist(cur, oth);
                let coeff = if d2 > 0.0 {
                    2.0 * b / ((0.001 + d2) * (a * d2.powf(b) + 1.0))
                } else if j == kk {
                    continue;
                } else {
                    0.0
                };
                let mut cur = cur;
                for d in 0..2 {
                    let g = if coeff > 0.0 {
                        clip(coeff * (cur[d] as f64 - oth[d] as f64))
                    } else {
                        0.0
                    };
                    cur[d] += (g * alpha) as f32;
                }
                emb[j] = cur;
            }
            next_neg[i] += n_neg as f64 * eps_neg[i];
        }
        alpha = 1.0 - epoch as f64 / n_epochs as f64;
    }
}

fn rdist(x: [f32; 2], y: [f32; 2]) -> f64 {
    let dx = x[0] as f64 - y[0] as f64;
    let dy = x[1] as f64 - y[1] as f64;
    dx * dx + dy * dy
}

/// sklearn's `trustworthiness(X, X_embedded, n_neighbors=k)` with the euclidean metric:
/// 1 means every embedded neighbour is also a neighbour in feature space. O(n²): callers
/// subsample large sets (see [`trustworthiness_sample`]).
pub fn trustworthiness(features: &Tensor, emb: &[[f32; 2]], k: usize) -> Result<f64, UmapError> {
    let x = features.to_kind(Kind::Double).contiguous();
    let n = x.size()[0] as usize;
    if n != emb.len() {
        return Err(UmapError::RowCountMismatch {
            features: n,
            embedded: emb.len(),
        });
    }
    if k == 0 || n < 2 * k + 2 {
        return Err(UmapError::TooFewRows {
            needed: 2 * k + 2,
            k,
            got: n,
        });
    }
    let sq = (&x * &x).sum_dim_intlist(1, false, Kind::Double);
    let mut penalty = 0f64;
    let mut rank = vec![0usize; n];
    for i in 0..n {
        // Feature-space order of every point seen from i (self last, as sklearn's inf).
        let d = (sq.get(i as i64) + &sq - x.matmul(&x.get(i as i64)) * 2.0).clamp_min(0.0);
        let d = d.index_fill(0, &Tensor::from_slice(&[i as i64]), f64::INFINITY);
        let order = Vec::<i64>::try_from(d.argsort(0, false)).expect("i64 order");
        for (r, &j) in order.iter().enumerate() {
            rank[j as usize] = r + 1;
        }
        // k nearest in the embedding, self excluded.
        let mut near: Vec<(f64, usize)> = (0..n)
            .filter(|&j| j != i)
            .map(|j| (rdist(emb[i], emb[j]), j))
            .collect();
        near.select_nth_unstable_by(k - 1, |a, b| a.partial_cmp(b).expect("finite"));
        for &(_, j) in &near[..k] {
            penalty += rank[j].saturating_sub(k) as f64;
        }
    }
    let (nf, kf) = (n as f64, k as f64);
    Ok(1.0 - penalty * 2.0 / (nf * kf * (2.0 * nf - 3.0 * kf - 1.0)))
}

/// Trustworthiness on at most `max_points` rows chosen by a seeded shuffle (the full O(n²)
/// computation is minutes at scDINO's 22k held-out images). Returns (score, rows used).
pub fn trustworthiness_sample(
    features: &Tensor,
    emb: &[[f32; 2]],
    k: usize,
    max_points: usize,
    seed: u64,
) -> Result<(f64, usize), UmapError> {
    let n = emb.len();
    if n <= max_points {
        return Ok((trustworthiness(features, emb, k)?, n));
    }
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64::new(seed);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order.truncate(max_points);
    order.sort_unstable();
    let idx = Tensor::from_slice(&order.iter().map(|&i| i as i64).collect::<Vec<_>>());
    let sub_x = features.index_select(0, &idx);
    let sub_e: Vec<[f32; 2]> = order.iter().map(|&i| emb[i]).collect();
    Ok((trustworthiness(&sub_x, &sub_e, k)?, max_points))
}
