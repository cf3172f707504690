//! Exact nearest neighbours and macro-F1, in float64 through libtorch: the 1-NN classifier
//! of CHAMMI's protocol (scikit-learn's `KNeighborsClassifier(1, metric="cosine")`), the kNN
//! graph of scib's graph connectivity and the distances of the silhouette.
use tch::{Device, Kind, Tensor};

use super::ProfileTable;

/// Rows of a table to score on.
const CHUNK: i64 = 2048;

/// The rows `rows` of `table` as a float64 `[len, D]` tensor.
pub fn rows_f64(table: &ProfileTable, rows: &[usize]) -> Tensor {
    let d = table.dim();
    let mut v = Vec::with_capacity(rows.len() * d);
    for &r in rows {
        v.extend(table.row(r).iter().map(|&x| f64::from(x)));
    }
    Tensor::from_slice(&v)
        .reshape([rows.len() as i64, d as i64])
        .to_device(Device::Cpu)
}

/// Rows scaled to unit length (zero rows stay zero: their cosine to anything is 0).
pub fn unit(x: &Tensor) -> Tensor {
    let n = x.norm_scalaropt_dim(2.0, [1], true).clamp_min(1e-300);
    x / n
}

/// For each row of `query`, the index of its most cosine-similar row of `reference` (first
/// on ties). `same` says query and reference are the same rows, and a row is then not its
/// own neighbour (leave-one-out).
pub fn nearest_cosine(query: &Tensor, reference: &Tensor, same: bool) -> Vec<usize> {
    let (q, r) = (unit(query), unit(reference));
    by_chunks(q.size()[0], |start, len| {
        let mut sim = q.narrow(0, start, len).matmul(&r.transpose(0, 1));
        if same {
            let idx = Tensor::arange_start(start, start + len, (Kind::Int64, Device::Cpu));
            let rows = Tensor::arange(len, (Kind::Int64, Device::Cpu));
            let _ = sim.index_put_(
                &[Some(rows), Some(idx)],
                &Tensor::from(f64::NEG_INFINITY),
                false,
            );
        }
        sim.argmax(1, false)
    })
}

/// The indices `best(start, len)` gives for each chunk of `n` query rows, in order: a
/// query's similarities to every reference row are held one chunk at a time.
fn by_chunks(n: i64, mut best: impl FnMut(i64, i64) -> Tensor) -> Vec<usize> {
    let mut out = Vec::with_capacity(n as usize);
    let mut start = 0;
    while start < n {
        let len = CHUNK.min(n - start);
        let b = best(start, len);
        out.extend(
            Vec::<i64>::try_from(&b)
                .expect("int64 indices")
                .into_iter()
                .map(|i| i as usize),
        );
        start += len;
    }
    out
}

/// The distance of a 1-NN classifier: CHAMMI's `knn_metric`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "lowercase")]
pub enum Metric {
    /// Rows scaled to unit length, largest inner product (CHAMMI's `cosine`).
    Cosine,
    /// Smallest Euclidean distance (CHAMMI's `l2`, FAISS `IndexFlatL2`).
    L2,
}

/// For each row of `query`, its nearest row of `reference` under `metric` (first on ties).
pub fn nearest(query: &Tensor, reference: &Tensor, metric: Metric) -> Vec<usize> {
    match metric {
        Metric::Cosine => nearest_cosine(query, reference, false),
        Metric::L2 => {
            let r2 = reference
                .square()
                .sum_dim_intlist(Some(&[1i64][..]), false, Kind::Double);
            by_chunks(query.size()[0], |start, len| {
                // |q - r|² without the |q|² every candidate of q shares.
                let d = &r2.unsqueeze(0)
                    - query
                        .narrow(0, start, len)
                        .matmul(&reference.transpose(0, 1))
                        * 2.0;
                d.argmin(1, false)
            })
        }
    }
}

/// Squared-free Euclidean distances `[n, n]` between the rows of `x` (float64), row-major.
pub fn euclidean(x: &Tensor) -> Vec<f64> {
    let d = Tensor::cdist(x, x, 2.0, Some(2)).clamp_min(0.0);
    Vec::<f64>::try_from(&d.flatten(0, -1)).expect("float64 distances")
}

/// scikit-learn's `f1_score(truth, pred, average="macro")`: the mean F1 over every label
/// that occurs in either list (F1 0 where a label is never predicted right).
pub fn macro_f1(truth: &[usize], pred: &[usize]) -> f64 {
    let k = truth.iter().chain(pred).max().map_or(0, |m| m + 1);
    let (mut tp, mut t, mut p) = (vec![0usize; k], vec![0usize; k], vec![0usize; k]);
    for (&a, &b) in truth.iter().zip(pred) {
        t[a] += 1;
        p[b] += 1;
        if a == b {
            tp[a] += 1;
        }
    }
    let present: Vec<usize> = (0..k).filter(|&c| t[c] + p[c] > 0).collect();
    if present.is_empty() {
        return f64::NAN;
    }
    present
        .iter()
        .map(|&c| 2.0 * tp[c] as f64 / (t[c] + p[c]) as f64)
        .sum::<f64>()
        / present.len() as f64
}

/// CHAMMI's task score: scikit-learn's `f1_score(truth, pred, labels=np.unique(truth),
/// average="macro")`, the mean F1 over the labels present in `truth` (a prediction of a
/// label absent from `truth` still costs its row, but that label is not averaged).
pub fn macro_f1_present(truth: &[usize], pred: &[usize]) -> f64 {
    let k = truth.iter().chain(pred).max().map_or(0, |m| m + 1);
    let (mut tp, mut t, mut p) = (vec![0usize; k], vec![0usize; k], vec![0usize; k]);
    for (&a, &b) in truth.iter().zip(pred) {
        t[a] += 1;
        p[b] += 1;
        if a == b {
            tp[a] += 1;
        }
    }
    let present: Vec<usize> = (0..k).filter(|&c| t[c] > 0).collect();
    if present.is_empty() {
        return f64::NAN;
    }
    present
        .iter()
        .map(|&c| 2.0 * tp[c] as f64 / (t[c] + p[c]) as f64)
        .sum::<f64>()
        / present.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macro_f1_counts_labels_seen_in_either_list() {
        // Label 2 only predicted: F1 0 and it counts.
        let f = macro_f1(&[0, 0, 1, 1], &[0, 0, 1, 2]);
        let want = (1.0 + 2.0 / 3.0 + 0.0) / 3.0;
        assert!((f - want).abs() < 1e-12, "{f}");
        // Over the labels of the truth only: label 2 is not averaged.
        let f = macro_f1_present(&[0, 0, 1, 1], &[0, 0, 1, 2]);
        let want = (1.0 + 2.0 / 3.0) / 2.0;
        assert!((f - want).abs() < 1e-12, "{f}");
    }
}
