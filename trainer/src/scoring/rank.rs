//! copairs' average precision without its rank lists: the engine behind
//! [`super::map::average_precision`].
//!
//! Why not sort: AP needs only each positive's rank, and a positive's rank is its place among
//! the positives plus the number of negatives that rank above it. So a profile keeps its
//! (few) positive similarities sorted and, for each negative partner, bumps one counter (a
//! binary search among the positives); no list of pairs is ever built, and memory does not
//! grow with the number of pairs.
//!
//! Why tiles: the negatives are where the pairs are (every other compound on the plate), and
//! they live inside one `neg_sameby` group, so a group's similarities come from blocked matrix
//! products (libtorch's float64 GEMM on CPU, one thread per worker) tile by tile, each
//! unordered pair once: the pair `(a, b)` bumps both `a` and `b` (the negative relation is
//! symmetric: equal `sameby`, every `diffby` different). Tiles whose rows all share a
//! `diffby` value with the other tile's rows (treated × treated when ranking against
//! controls) hold no negative pair and are skipped.
//!
//! Numbers: the unit rows are float32 as before; their products are exact in float64 and the
//! GEMM sums them in float64, so a similarity rounded to float32 (and `1 - similarity`, the
//! sort key of copairs) is the one a sequential float64 sum gives, ties included, except in
//! the (about 1e-7 per pair) case where the two sums round to neighbouring float32 values.
use std::sync::atomic::{AtomicUsize, Ordering};

use tch::Tensor;

use super::keys::Codes;

/// Rows of a tile: a 256 × 256 × D float64 product is a few milliseconds, large enough that
/// libtorch's call overhead vanishes, small enough that a 900-row plate splits over threads.
const TILE: usize = 256;

/// What the engine reads: unit rows, the negative rule and the partner counts.
pub(super) struct Inputs<'a> {
    /// Row-major `[n, d]` unit rows (float32).
    pub unit: &'a [f32],
    pub d: usize,
    /// Rows grouped by `neg_sameby`.
    pub neg_groups: &'a [Vec<usize>],
    /// The `neg_diffby` columns.
    pub neg_diff: &'a Codes,
    pub n_pos: &'a [u32],
    pub n_neg: &'a [u32],
    pub threads: usize,
}

/// copairs' sort key of a pair: `1 - cosine` in float32, the cosine summed in float64.
pub(super) fn key(unit: &[f32], d: usize, a: usize, b: usize) -> f32 {
    let (x, y) = (&unit[a * d..(a + 1) * d], &unit[b * d..(b + 1) * d]);
    1f32 - x
        .iter()
        .zip(y)
        .map(|(&p, &q)| f64::from(p) * f64::from(q))
        .sum::<f64>() as f32
}

/// AP from the sorted positive keys' counts of negatives ranked above each (difference
/// array: `bumps[i]` negatives rank above positive `i` and every later one). The sum runs in
/// rank order with the same terms as a sorted rank list's, so it is the same float64.
fn ap_from_bumps(bumps: &[u32]) -> f64 {
    let (mut above, mut sum) = (0u64, 0f64);
    for (i, &b) in bumps.iter().enumerate() {
        above += u64::from(b);
        let tp = i as u64 + 1;
        sum += tp as f64 / (tp + above) as f64;
    }
    sum / bumps.len() as f64
}

/// One `neg_sameby` group laid out for tiling: rows with positives (queries) first, then the
/// rows that are only someone's negative; each part sorted by its `diffby` codes so tiles are
/// often uniform in a column (and skippable).
struct Layout {
    order: Vec<usize>,
    queries: usize,
    /// Per tile and `diffby` column, the code every row of the tile shares, if any.
    uniform: Vec<Vec<Option<u32>>>,
}

impl Layout {
    fn new(group: &[usize], inp: &Inputs) -> Self {
        let codes = &inp.neg_diff.codes;
        let key = |&r: &usize| codes.iter().map(|c| c[r]).collect::<Vec<_>>();
        let mut q: Vec<usize> = group
            .iter()
            .copied()
            .filter(|&r| inp.n_pos[r] > 0 && inp.n_neg[r] > 0)
            .collect();
        let mut rest: Vec<usize> = group
            .iter()
            .copied()
            .filter(|&r| inp.n_pos[r] == 0 && inp.n_neg[r] > 0)
            .collect();
        q.sort_by_cached_key(key);
        rest.sort_by_cached_key(key);
        let queries = q.len();
        q.extend(rest);
        let uniform = q
            .chunks(TILE)
            .map(|t| {
                codes
                    .iter()
                    .map(|c| Some(c[t[0]]).filter(|&v| t.iter().all(|&r| c[r] == v)))
                    .collect()
            })
            .collect();
        Self {
            order: q,
            queries,
            uniform,
        }
    }

    /// Whether tiles `i` and `j` can hold a negative pair (no column in which both tiles are
    /// one and the same value).
    fn may_pair(&self, i: usize, j: usize) -> bool {
        !self.uniform[i]
            .iter()
            .zip(&self.uniform[j])
            .any(|(a, b)| a.is_some() && a == b)
    }

    fn tile(&self, t: usize) -> &[usize] {
        &self.order[t * TILE..((t + 1) * TILE).min(self.order.len())]
    }
}

/// The float64 `[len, d]` tensor of unit rows `rows`.
fn tile_tensor(inp: &Inputs, rows: &[usize]) -> Tensor {
    let d = inp.d;
    let mut v = Vec::with_capacity(rows.len() * d);
    for &r in rows {
        v.extend(inp.unit[r * d..(r + 1) * d].iter().map(|&x| f64::from(x)));
    }
    Tensor::from_slice(&v).reshape([rows.len() as i64, d as i64])
}

/// The queries' sorted positive keys and, per query, where its counters start.
struct Queries {
    keys: Vec<Vec<f32>>,
    start: Vec<usize>,
    total: usize,
}

impl Queries {
    /// Adds a negative with key `x` to query `q`: every positive with a larger key (a
    /// negative on a tie ranks after the positive, as in copairs) moves down one place.
    #[inline]
    fn bump(&self, counts: &mut [u32], q: usize, x: f32) {
        let keys = &self.keys[q];
        if keys.last().is_some_and(|&m| x < m) {
            counts[self.start[q] + keys.partition_point(|&p| p <= x)] += 1;
        }
    }
}

/// Sorted positive keys of `rows`, computed on `threads` threads.
fn positive_keys(
    rows: &[usize],
    inp: &Inputs,
    positives: &(dyn Fn(usize) -> Vec<usize> + Sync),
) -> Queries {
    let mut keys: Vec<Vec<f32>> = vec![vec![]; rows.len()];
    let chunk = rows.len().div_ceil(inp.threads).max(1);
    std::thread::scope(|s| {
        for (part, out) in rows.chunks(chunk).zip(keys.chunks_mut(chunk)) {
            s.spawn(move || {
                for (&r, slot) in part.iter().zip(out) {
                    let mut k: Vec<f32> = positives(r)
                        .into_iter()
                        .map(|j| key(inp.unit, inp.d, r, j))
                        .collect();
                    k.sort_by(f32::total_cmp);
                    *slot = k;
                }
            });
        }
    });
    let mut start = Vec::with_capacity(rows.len());
    let mut total = 0;
    for k in &keys {
        start.push(total);
        total += k.len();
    }
    Queries { keys, start, total }
}

/// One tile pair's negatives: `sim` is the `[a.len(), b.len()]` product; on the diagonal
/// (`same`) only pairs above it, so every unordered pair counts once for both members.
#[allow(clippy::too_many_arguments)]
fn count_tile(
    inp: &Inputs,
    queries: &Queries,
    counts: &mut [u32],
    (a, a0): (&[usize], usize),
    (b, b0): (&[usize], usize),
    n_q: usize,
    same: bool,
    sim: &[f64],
) {
    let codes = &inp.neg_diff.codes;
    for (i, &ra) in a.iter().enumerate() {
        let row = &sim[i * b.len()..(i + 1) * b.len()];
        let first = if same { i + 1 } else { 0 };
        let (qa, ia) = (a0 + i < n_q, a0 + i);
        for (j, &rb) in b.iter().enumerate().skip(first) {
            if !codes.iter().all(|c| c[ra] != c[rb]) {
                continue;
            }
            let x = 1f32 - row[j] as f32;
            if qa {
                queries.bump(counts, ia, x);
            }
            if b0 + j < n_q {
                queries.bump(counts, b0 + j, x);
            }
        }
    }
}

/// Counters of one group: the query tiles are shared out on `threads` threads (each with its
/// own counters, summed at the end), each tile paired with itself and every later tile.
fn group_counts(layout: &Layout, queries: &Queries, inp: &Inputs) -> Vec<u32> {
    let tiles = layout.order.len().div_ceil(TILE);
    let q_tiles = layout.queries.div_ceil(TILE);
    let next = AtomicUsize::new(0);
    let worker = || {
        tch::set_num_threads(1);
        let mut counts = vec![0u32; queries.total];
        let mut sim = vec![];
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= q_tiles {
                return counts;
            }
            let a = layout.tile(i);
            let ta = tile_tensor(inp, a);
            for j in (i..tiles).filter(|&j| layout.may_pair(i, j)) {
                let b = layout.tile(j);
                let s = ta.matmul(&tile_tensor(inp, b).tr());
                sim.resize(a.len() * b.len(), 0.0);
                s.copy_data(&mut sim, a.len() * b.len());
                let (sa, sb) = ((a, i * TILE), (b, j * TILE));
                count_tile(
                    inp,
                    queries,
                    &mut counts,
                    sa,
                    sb,
                    layout.queries,
                    i == j,
                    &sim,
                );
            }
        }
    };
    let threads = inp.threads.min(q_tiles).max(1);
    let parts: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a tile worker does not panic"))
            .collect()
    });
    let mut parts = parts.into_iter();
    let mut total = parts.next().unwrap_or_default();
    for p in parts {
        for (t, v) in total.iter_mut().zip(p) {
            *t += v;
        }
    }
    total
}

/// AP of every row with a positive partner into `ap` (other rows untouched). `positives(r)`
/// lists row `r`'s positive partners.
pub(super) fn fill_ap(
    inp: &Inputs,
    positives: &(dyn Fn(usize) -> Vec<usize> + Sync),
    ap: &mut [f64],
) {
    let saved = tch::get_num_threads();
    for group in inp.neg_groups {
        // A row with positives but no negatives ranks its positives first: AP 1.
        for &r in group {
            if inp.n_pos[r] > 0 && inp.n_neg[r] == 0 {
                ap[r] = 1.0;
            }
        }
        let layout = Layout::new(group, inp);
        if layout.queries == 0 {
            continue;
        }
        let queries = positive_keys(&layout.order[..layout.queries], inp, positives);
        let counts = group_counts(&layout, &queries, inp);
        for (q, &r) in layout.order[..layout.queries].iter().enumerate() {
            let s = queries.start[q];
            ap[r] = ap_from_bumps(&counts[s..s + queries.keys[q].len()]);
        }
    }
    tch::set_num_threads(saved);
}
