//! copairs 0.5 average precision (AP) per profile and mean average precision (mAP) per group.
//!
//! Pairs follow `copairs.matching.find_pairs`: two rows pair when they are equal in every
//! `sameby` column and different in every `diffby` column. A profile's rank list is its
//! positive and negative partners by cosine similarity, most similar first; on equal
//! similarity positives come first (copairs sorts by `1 - similarity` in float32 with a
//! stable sort after putting the positive pairs before the negative ones). AP is
//! `sum_k precision@k · rel_k / n_pos`; a profile with no positive pair has AP NaN.
//!
//! mAP averages AP over the rows of a group (rows with NaN AP or no positive pair left out,
//! as copairs does), and its p-value is `(#{null mAP > mAP} + 1) / (null_size + 1)`, the null
//! mAP being the mean over the group's rows of random APs with the same `(n_pos,
//! n_total)`; Benjamini–Hochberg corrects them over the groups. The random ranks come from
//! this crate's generator, not numpy's PCG64, so p-values agree with copairs within their
//! Monte-Carlo error, not bit for bit.
use std::collections::HashMap;
use std::path::Path;

use super::keys::{groups, Codes};
use super::table::{write_table, OutColumn};
use super::{ProfileTable, ScoringError};

/// Which rows pair (copairs' `pos_sameby`, `pos_diffby`, `neg_sameby`, `neg_diffby`).
#[derive(Debug, Clone, Default)]
pub struct PairRules {
    pub pos_sameby: Vec<String>,
    pub pos_diffby: Vec<String>,
    pub neg_sameby: Vec<String>,
    pub neg_diffby: Vec<String>,
}

/// One profile's AP and the configuration its null distribution is drawn for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ApRow {
    pub n_pos_pairs: u32,
    pub n_total_pairs: u32,
    /// NaN where the profile has no positive pair.
    pub average_precision: f64,
}

/// A rule's columns as codes and the rows grouped by its `sameby`.
struct Rule {
    diff: Codes,
    groups: Vec<Vec<usize>>,
    group_of: Vec<usize>,
}

impl Rule {
    fn new(
        table: &ProfileTable,
        same: &[String],
        diff: &[String],
        which: &str,
    ) -> Result<Self, ScoringError> {
        if same.is_empty() && diff.is_empty() {
            return Err(ScoringError::invalid(
                table,
                format!("{which} pairs need at least one sameby or diffby column"),
            ));
        }
        if let Some(c) = same.iter().find(|c| diff.contains(c)) {
            return Err(ScoringError::invalid(
                table,
                format!("column `{c}` is in both {which}_sameby and {which}_diffby"),
            ));
        }
        let same = Codes::of(table, same)?;
        let groups = groups(&same, table.rows);
        let mut group_of = vec![0; table.rows];
        for (g, rows) in groups.iter().enumerate() {
            for &r in rows {
                group_of[r] = g;
            }
        }
        Ok(Self {
            diff: Codes::of(table, diff)?,
            groups,
            group_of,
        })
    }

    /// The partners of `row` under this rule.
    fn partners(&self, row: usize) -> impl Iterator<Item = usize> + '_ {
        self.groups[self.group_of[row]]
            .iter()
            .copied()
            .filter(move |&j| j != row && self.diff.all_differ(row, j))
    }
}

/// Rows scaled to unit length (float32, as copairs divides by the norm); a zero row is an
/// error (its cosine similarity is undefined).
fn unit_rows(table: &ProfileTable) -> Result<Vec<f32>, ScoringError> {
    let d = table.dim();
    let mut out = Vec::with_capacity(table.features.len());
    for r in 0..table.rows {
        let row = table.row(r);
        let norm = row
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            .sqrt();
        if norm == 0.0 {
            return Err(ScoringError::invalid(
                table,
                format!("row {r} is all zeros: its cosine similarity is undefined"),
            ));
        }
        out.extend(row.iter().map(|&v| (f64::from(v) / norm) as f32));
    }
    debug_assert_eq!(out.len(), table.rows * d);
    Ok(out)
}

fn cosine(unit: &[f32], d: usize, a: usize, b: usize) -> f32 {
    let (x, y) = (&unit[a * d..(a + 1) * d], &unit[b * d..(b + 1) * d]);
    x.iter()
        .zip(y)
        .map(|(&p, &q)| f64::from(p) * f64::from(q))
        .sum::<f64>() as f32
}

/// AP of one rank list: `(1 - similarity, positive)` pairs, positives listed first.
fn ap_of(mut ranked: Vec<(f32, bool)>) -> ApRow {
    // Stable: on equal keys the positives, listed first, stay first (as in copairs).
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut tp, mut sum) = (0u32, 0f64);
    for (k, &(_, pos)) in ranked.iter().enumerate() {
        if pos {
            tp += 1;
            sum += f64::from(tp) / (k + 1) as f64;
        }
    }
    ApRow {
        n_pos_pairs: tp,
        n_total_pairs: ranked.len() as u32,
        average_precision: if tp == 0 {
            f64::NAN
        } else {
            sum / f64::from(tp)
        },
    }
}

/// copairs' `average_precision(meta, feats, pos_sameby, pos_diffby, neg_sameby, neg_diffby,
/// distance="cosine")`, one [`ApRow`] per table row (rows in no pair: NaN, 0, 0).
pub fn average_precision(
    table: &ProfileTable,
    rules: &PairRules,
) -> Result<Vec<ApRow>, ScoringError> {
    table.need_rows(2, "average precision (a profile and its partners)")?;
    table.check_finite()?;
    let pos = Rule::new(table, &rules.pos_sameby, &rules.pos_diffby, "pos")?;
    let neg = Rule::new(table, &rules.neg_sameby, &rules.neg_diffby, "neg")?;
    let unit = unit_rows(table)?;
    let d = table.dim();
    let n = table.rows;
    let one = |r: usize| {
        let sim = |j| 1f32 - cosine(&unit, d, r, j);
        let ranked: Vec<(f32, bool)> = pos
            .partners(r)
            .map(|j| (sim(j), true))
            .chain(neg.partners(r).map(|j| (sim(j), false)))
            .collect();
        ap_of(ranked)
    };
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let chunk = n.div_ceil(threads).max(1);
    let mut out = vec![
        ApRow {
            n_pos_pairs: 0,
            n_total_pairs: 0,
            average_precision: f64::NAN
        };
        n
    ];
    std::thread::scope(|s| {
        for (c, part) in out.chunks_mut(chunk).enumerate() {
            let one = &one;
            s.spawn(move || {
                for (i, slot) in part.iter_mut().enumerate() {
                    *slot = one(c * chunk + i);
                }
            });
        }
    });
    if !out.iter().any(|a| a.n_pos_pairs > 0) {
        return Err(ScoringError::invalid(
            table,
            "no positive pairs: no two rows are equal in every pos_sameby column and different in every pos_diffby column",
        ));
    }
    if out.iter().all(|a| a.n_total_pairs == a.n_pos_pairs) {
        return Err(ScoringError::invalid(
            table,
            format!(
                "no negative pairs: no two rows match the neg_sameby/neg_diffby rule (neg_sameby: {}; neg_diffby: {}); are all rows in one group?",
                list(&rules.neg_sameby),
                list(&rules.neg_diffby)
            ),
        ));
    }
    Ok(out)
}

fn list(cols: &[String]) -> String {
    if cols.is_empty() {
        "none".into()
    } else {
        cols.join(", ")
    }
}

/// copairs' `assign_reference_index`: a column `Metadata_Reference_Index` holding the row
/// index on the rows where `column == value` (the controls) and `-1` elsewhere. With it in
/// `pos_sameby` and `neg_diffby`, controls never pair with each other as positives and each
/// perturbation is ranked against the controls only (phenotypic activity).
pub fn assign_reference_index(
    table: &mut ProfileTable,
    column: &str,
    value: &str,
) -> Result<usize, ScoringError> {
    let col = table.column(column)?;
    let index: Vec<Option<String>> = col
        .iter()
        .enumerate()
        .map(|(i, v)| {
            Some(if v.as_deref() == Some(value) {
                i.to_string()
            } else {
                "-1".into()
            })
        })
        .collect();
    let matched = index.iter().filter(|v| v.as_deref() != Some("-1")).count();
    if matched == 0 {
        return Err(ScoringError::invalid(
            table,
            format!("no row has `{column}` = `{value}` (the reference rows)"),
        ));
    }
    table.meta.retain(|(n, _)| n != "Metadata_Reference_Index");
    table
        .meta
        .push(("Metadata_Reference_Index".to_string(), index));
    Ok(matched)
}

/// Mean average precision of one group.
#[derive(Debug, Clone)]
pub struct MapRow {
    /// The group's values of the `map_by` columns.
    pub key: Vec<String>,
    pub mean_average_precision: f64,
    pub p_value: f64,
    pub corrected_p_value: f64,
    pub below_p: bool,
    pub below_corrected_p: bool,
}

/// Options of [`mean_average_precision`] (copairs' `null_size`, `threshold`, `seed`).
#[derive(Debug, Clone, Copy)]
pub struct MapOptions {
    pub null_size: usize,
    pub threshold: f64,
    pub seed: u64,
}

/// copairs' `mean_average_precision(ap_scores, sameby=map_by, null_size, threshold, seed)`,
/// groups in sorted order of their key (as pandas' groupby).
pub fn mean_average_precision(
    table: &ProfileTable,
    ap: &[ApRow],
    map_by: &[String],
    opts: MapOptions,
) -> Result<Vec<MapRow>, ScoringError> {
    if map_by.is_empty() {
        return Err(ScoringError::invalid(
            table,
            "mAP needs at least one map_by column",
        ));
    }
    if opts.null_size == 0 {
        return Err(ScoringError::invalid(table, "null_size must be at least 1"));
    }
    let cols = map_by
        .iter()
        .map(|c| table.key_column(c))
        .collect::<Result<Vec<_>, _>>()?;
    let mut by_key: std::collections::BTreeMap<Vec<String>, Vec<usize>> = Default::default();
    for (r, a) in ap.iter().enumerate() {
        if a.average_precision.is_nan() || a.n_pos_pairs == 0 {
            continue;
        }
        let key = cols.iter().map(|c| c[r].clone()).collect();
        by_key.entry(key).or_default().push(r);
    }
    let mut nulls = NullCache::new(opts);
    let mut rows = vec![];
    for (key, members) in by_key {
        let map = members
            .iter()
            .map(|&r| ap[r].average_precision)
            .sum::<f64>()
            / members.len() as f64;
        let mut null_mean = vec![0f64; opts.null_size];
        for &r in &members {
            let dist = nulls.get(ap[r].n_pos_pairs, ap[r].n_total_pairs);
            for (m, &v) in null_mean.iter_mut().zip(dist) {
                *m += f64::from(v);
            }
        }
        let above = null_mean
            .iter()
            .filter(|&&m| m / members.len() as f64 > map)
            .count();
        rows.push(MapRow {
            key,
            mean_average_precision: map,
            p_value: (above + 1) as f64 / (opts.null_size + 1) as f64,
            corrected_p_value: 0.0,
            below_p: false,
            below_corrected_p: false,
        });
    }
    let corrected = fdr_bh(&rows.iter().map(|r| r.p_value).collect::<Vec<_>>());
    for (row, q) in rows.iter_mut().zip(corrected) {
        row.corrected_p_value = q;
        row.below_p = row.p_value < opts.threshold;
        row.below_corrected_p = q < opts.threshold;
    }
    Ok(rows)
}

/// Writes the AP table: `table`'s metadata, then `n_pos_pairs`, `n_total_pairs` and
/// `average_precision` per row (copairs' `average_precision` frame), atomically.
pub fn write_ap_table(path: &Path, table: &ProfileTable, ap: &[ApRow]) -> Result<(), ScoringError> {
    let mut columns: Vec<(String, OutColumn)> = table
        .meta
        .iter()
        .map(|(n, v)| (n.clone(), OutColumn::NullableText(v.clone())))
        .collect();
    columns.push((
        "n_pos_pairs".into(),
        OutColumn::Int(ap.iter().map(|a| a.n_pos_pairs.into()).collect()),
    ));
    columns.push((
        "n_total_pairs".into(),
        OutColumn::Int(ap.iter().map(|a| a.n_total_pairs.into()).collect()),
    ));
    columns.push((
        "average_precision".into(),
        OutColumn::Double(ap.iter().map(|a| a.average_precision).collect()),
    ));
    write_table(path, &columns, None)
}

/// Writes the mAP table: the `map_by` columns, then copairs' `mean_average_precision`,
/// `p_value`, `corrected_p_value`, `below_p`, `below_corrected_p`, atomically.
pub fn write_map_table(
    path: &Path,
    map_by: &[String],
    rows: &[MapRow],
) -> Result<(), ScoringError> {
    let mut columns: Vec<(String, OutColumn)> = map_by
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                n.clone(),
                OutColumn::Text(rows.iter().map(|r| r.key[i].clone()).collect()),
            )
        })
        .collect();
    let f = |g: fn(&MapRow) -> f64| OutColumn::Double(rows.iter().map(g).collect());
    let b = |g: fn(&MapRow) -> bool| OutColumn::Bool(rows.iter().map(g).collect());
    columns.push((
        "mean_average_precision".into(),
        f(|r| r.mean_average_precision),
    ));
    columns.push(("p_value".into(), f(|r| r.p_value)));
    columns.push(("corrected_p_value".into(), f(|r| r.corrected_p_value)));
    columns.push(("below_p".into(), b(|r| r.below_p)));
    columns.push(("below_corrected_p".into(), b(|r| r.below_corrected_p)));
    write_table(path, &columns, None)
}

/// Benjamini–Hochberg adjusted p-values (statsmodels' `multipletests(method="fdr_bh")`).
pub fn fdr_bh(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut out = vec![0.0; m];
    let mut running = f64::INFINITY;
    for (rank, &i) in order.iter().enumerate().rev() {
        running = running.min(p[i] * m as f64 / (rank + 1) as f64);
        out[i] = running.min(1.0);
    }
    out
}

/// Null AP distributions per `(n_pos, n_total)`, drawn once each.
struct NullCache {
    opts: MapOptions,
    dists: HashMap<(u32, u32), Vec<f32>>,
}

impl NullCache {
    fn new(opts: MapOptions) -> Self {
        Self {
            opts,
            dists: HashMap::new(),
        }
    }

    fn get(&mut self, k: u32, n: u32) -> &[f32] {
        let opts = self.opts;
        self.dists
            .entry((k, n))
            .or_insert_with(|| random_ap(opts.null_size, k, n, opts.seed))
    }
}

/// `size` APs of rank lists of `n` items with `k` positives at random positions (copairs'
/// `random_ap`), seeded by `seed` and the configuration so the draw does not depend on the
/// order configurations are met.
pub fn random_ap(size: usize, k: u32, n: u32, seed: u64) -> Vec<f32> {
    let mut rng =
        SplitMix64(seed ^ (u64::from(k) << 32 | u64::from(n)).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut perm: Vec<u32> = (0..n).collect();
    let mut ranks = Vec::with_capacity(k as usize);
    (0..size)
        .map(|_| {
            // Partial Fisher–Yates: the first k slots become a uniform k-subset.
            for i in 0..k as usize {
                let j = i + rng.below((n as usize - i) as u64) as usize;
                perm.swap(i, j);
            }
            ranks.clear();
            ranks.extend_from_slice(&perm[..k as usize]);
            ranks.sort_unstable();
            let sum: f32 = ranks
                .iter()
                .enumerate()
                .map(|(j, &r)| (j + 1) as f32 / (r + 1) as f32)
                .sum();
            sum / k as f32
        })
        .collect()
}

/// SplitMix64: small, fast and good enough for permutation nulls.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (Lemire's multiply-shift with rejection).
    fn below(&mut self, bound: u64) -> u64 {
        loop {
            let m = u128::from(self.next()) * u128::from(bound);
            if (m as u64) >= bound.wrapping_neg() % bound {
                return (m >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_rank_positives_first_and_ap_follows_precision_at_k() {
        // Ranks: pos (tie with neg, listed first), neg, pos.
        let ap = ap_of(vec![(0.1, true), (0.5, true), (0.1, false), (0.2, false)]);
        assert_eq!((ap.n_pos_pairs, ap.n_total_pairs), (2, 4));
        assert!((ap.average_precision - (1.0 + 2.0 / 4.0) / 2.0).abs() < 1e-12);
        assert!(ap_of(vec![(0.1, false)]).average_precision.is_nan());
    }

    #[test]
    fn bh_matches_the_textbook_steps() {
        let q = fdr_bh(&[0.01, 0.04, 0.03, 0.2]);
        let want = [0.04, 0.16 / 3.0, 0.16 / 3.0, 0.2];
        for (a, b) in q.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{q:?}");
        }
    }

    #[test]
    fn random_ap_has_the_exact_mean_of_a_random_ranking() {
        // k = 1 of n: AP = 1/(r+1), mean H_n / n.
        let d = random_ap(20_000, 1, 10, 7);
        let mean = d.iter().map(|&v| f64::from(v)).sum::<f64>() / d.len() as f64;
        let h: f64 = (1..=10).map(|i| 1.0 / i as f64).sum::<f64>() / 10.0;
        assert!((mean - h).abs() < 0.01, "{mean} vs {h}");
    }
}
