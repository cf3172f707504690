//! How much a batch column (donor, plate, ...) drives an embedding.
//!
//! * Batch silhouette: scib's `silhouette_batch` (Euclidean, `scale=True`): within each label
//!   with more than one batch and fewer batches than rows, `1 - |silhouette(row; batches)|`
//!   averaged per label, then over labels. 1 = batches mixed, 0 = separated by batch.
//! * Graph connectivity: scib's `graph_connectivity` on the exact Euclidean kNN graph
//!   (scanpy's `n_neighbors` counting the row itself, made symmetric as scanpy's
//!   connectivities are): per label, the share of its rows in the largest connected
//!   component of the label's subgraph, averaged over labels. 1 = each label one piece.
//! * Leave-one-group-out 1-NN macro-F1 of a label (CHAMMI's out-of-distribution protocol):
//!   each batch in turn is classified by cosine 1-NN against all other batches, predictions
//!   pooled; next to it the in-distribution score (leave-one-out 1-NN over all rows). A
//!   large drop from in- to out-of-distribution means neighbours are found through batch.
use super::keys::label_codes;
use super::nn::{euclidean, macro_f1, nearest_cosine, rows_f64};
use super::{ProfileTable, ScoringError};

/// scikit-learn's `silhouette_samples` on a precomputed `[n, n]` distance matrix: 0 for rows
/// alone in their cluster, `(b - a) / max(a, b)` otherwise (0 where both are 0).
pub fn silhouette_samples(dist: &[f64], labels: &[usize]) -> Vec<f64> {
    let n = labels.len();
    let k = labels.iter().max().map_or(0, |m| m + 1);
    let mut sizes = vec![0usize; k];
    for &l in labels {
        sizes[l] += 1;
    }
    (0..n)
        .map(|i| {
            let mut sums = vec![0f64; k];
            for j in 0..n {
                sums[labels[j]] += dist[i * n + j];
            }
            let own = labels[i];
            if sizes[own] <= 1 {
                return 0.0;
            }
            let a = sums[own] / (sizes[own] - 1) as f64;
            let b = (0..k)
                .filter(|&c| c != own && sizes[c] > 0)
                .map(|c| sums[c] / sizes[c] as f64)
                .fold(f64::INFINITY, f64::min);
            let s = (b - a) / a.max(b);
            if s.is_nan() {
                0.0
            } else {
                s
            }
        })
        .collect()
}

/// Rows of each label, labels in sorted order of their text.
fn by_label(labels: &[String]) -> (Vec<String>, Vec<Vec<usize>>) {
    let (codes, names) = label_codes(labels);
    let mut rows = vec![vec![]; names.len()];
    for (r, &c) in codes.iter().enumerate() {
        rows[c].push(r);
    }
    (names, rows)
}

/// scib's `silhouette_batch(adata, batch_key, label_key, embed, scale=True)` with the batches
/// given as `batch` (one entry per row): NaN where no label has two batches.
pub fn silhouette_batch(
    table: &ProfileTable,
    batch: &[String],
    label: &[String],
) -> Vec<(String, f64)> {
    let (names, rows) = by_label(label);
    let mut out = vec![];
    for (name, rows) in names.into_iter().zip(rows) {
        let (codes, batches) =
            label_codes(&rows.iter().map(|&r| batch[r].clone()).collect::<Vec<_>>());
        if batches.len() == 1 || batches.len() == rows.len() {
            continue;
        }
        let dist = euclidean(&rows_f64(table, &rows));
        let s = silhouette_samples(&dist, &codes);
        let mean = s.iter().map(|v| 1.0 - v.abs()).sum::<f64>() / s.len() as f64;
        out.push((name, mean));
    }
    out
}

/// The mean of per-label scores (NaN when there are none).
pub fn mean_score(per_label: &[(String, f64)]) -> f64 {
    if per_label.is_empty() {
        return f64::NAN;
    }
    per_label.iter().map(|(_, v)| v).sum::<f64>() / per_label.len() as f64
}

/// scib's `graph_connectivity` on the exact kNN graph with `n_neighbors` (counting the row).
pub fn graph_connectivity(
    table: &ProfileTable,
    label: &[String],
    n_neighbors: usize,
) -> Result<f64, ScoringError> {
    let n = table.rows;
    if n_neighbors < 2 || n_neighbors > n {
        return Err(ScoringError::invalid(
            table,
            format!("graph connectivity needs 2 <= n_neighbors <= rows ({n}), got {n_neighbors}"),
        ));
    }
    let all: Vec<usize> = (0..n).collect();
    let x = rows_f64(table, &all);
    let mut adj: Vec<Vec<usize>> = vec![vec![]; n];
    let mut start = 0i64;
    while start < n as i64 {
        let len = 1024.min(n as i64 - start);
        let d = tch::Tensor::cdist(&x.narrow(0, start, len), &x, 2.0, Some(2));
        let idx = d.argsort(1, false).narrow(1, 0, n_neighbors as i64);
        let idx = Vec::<i64>::try_from(&idx.flatten(0, -1)).expect("indices");
        for (q, nb) in idx.chunks(n_neighbors).enumerate() {
            let i = start as usize + q;
            // The row itself is one of scanpy's n_neighbors; drop it (or the farthest).
            let mut kept: Vec<usize> = nb.iter().map(|&j| j as usize).filter(|&j| j != i).collect();
            kept.truncate(n_neighbors - 1);
            for j in kept {
                adj[i].push(j);
                adj[j].push(i);
            }
        }
        start += len;
    }
    let (_, groups) = by_label(label);
    let mut in_label = vec![usize::MAX; n];
    let mut scores = vec![];
    for (g, rows) in groups.iter().enumerate() {
        for &r in rows {
            in_label[r] = g;
        }
        scores.push(largest_component(rows, &adj, &in_label, g) as f64 / rows.len() as f64);
    }
    Ok(scores.iter().sum::<f64>() / scores.len() as f64)
}

/// Size of the largest connected component of the subgraph on `rows` (label `g`).
fn largest_component(rows: &[usize], adj: &[Vec<usize>], in_label: &[usize], g: usize) -> usize {
    let mut seen = std::collections::HashSet::new();
    let mut best = 0;
    for &r in rows {
        if !seen.insert(r) {
            continue;
        }
        let (mut stack, mut size) = (vec![r], 0);
        while let Some(v) = stack.pop() {
            size += 1;
            for &w in &adj[v] {
                if in_label[w] == g && seen.insert(w) {
                    stack.push(w);
                }
            }
        }
        best = best.max(size);
    }
    best
}

/// In- and out-of-distribution 1-NN macro-F1 of a label.
#[derive(Debug, Clone)]
pub struct LogoScores {
    /// Leave-one-out 1-NN over all rows.
    pub in_distribution: f64,
    /// Each group classified against the other groups, predictions pooled.
    pub leave_one_group_out: f64,
    /// The held-out groups, in sorted order, with their own macro-F1.
    pub per_group: Vec<(String, f64)>,
}

/// Leave-one-group-out 1-NN (cosine) macro-F1 of `label` with groups `group`.
pub fn logo_f1(
    table: &ProfileTable,
    label: &[String],
    group: &[String],
) -> Result<LogoScores, ScoringError> {
    let (truth, _) = label_codes(label);
    let (gnames, grows) = by_label(group);
    if gnames.len() < 2 {
        return Err(ScoringError::invalid(
            table,
            format!(
                "leave-one-group-out needs at least two groups, found {}",
                gnames.len()
            ),
        ));
    }
    let all: Vec<usize> = (0..table.rows).collect();
    let x = rows_f64(table, &all);
    let loo = nearest_cosine(&x, &x, true);
    let in_pred: Vec<usize> = loo.iter().map(|&j| truth[j]).collect();
    let mut pred = vec![0usize; table.rows];
    let mut per_group = vec![];
    for (name, held) in gnames.into_iter().zip(&grows) {
        let rest: Vec<usize> = all.iter().copied().filter(|r| group[*r] != name).collect();
        let nn = nearest_cosine(&rows_f64(table, held), &rows_f64(table, &rest), false);
        let p: Vec<usize> = nn.iter().map(|&j| truth[rest[j]]).collect();
        let t: Vec<usize> = held.iter().map(|&r| truth[r]).collect();
        per_group.push((name, macro_f1(&t, &p)));
        for (&r, &v) in held.iter().zip(&p) {
            pred[r] = v;
        }
    }
    Ok(LogoScores {
        in_distribution: macro_f1(&truth, &in_pred),
        leave_one_group_out: macro_f1(&truth, &pred),
        per_group,
    })
}

/// `values` permuted by a seeded Fisher–Yates shuffle: the shuffled-batch control, where a
/// batch column carries no information about the embedding.
pub fn shuffled(values: &[String], seed: u64) -> Vec<String> {
    let mut v = values.to_vec();
    let mut s = seed;
    for i in (1..v.len()).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let j = ((s >> 33) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}
