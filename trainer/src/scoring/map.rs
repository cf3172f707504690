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
use super::rank;
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

/// AP of one rank list: `(1 - similarity, positive)` pairs, positives listed first. The
/// definition the engine ([`super::rank`]) is checked against.
#[cfg(test)]
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

/// Rule columns past which counting partners by inclusion–exclusion (2^columns hash maps)
/// costs more than listing them.
const MAX_EXCLUSION_COLUMNS: usize = 6;

/// Each row's number of partners under `rule`, without listing them: rows of the group
/// differing in every `diffby` column, by inclusion–exclusion over the columns (the group's
/// rows minus those equal in one column, plus those equal in two, ...), so a row's count
/// costs 2^columns hash look-ups, not the group's size (every control has every treated
/// well as a negative partner).
fn partner_counts(rule: &Rule, n: usize) -> Vec<u32> {
    let cols = rule.diff.codes.len();
    if cols == 0 {
        return (0..n)
            .map(|r| rule.groups[rule.group_of[r]].len() as u32 - 1)
            .collect();
    }
    if cols > MAX_EXCLUSION_COLUMNS {
        return (0..n).map(|r| rule.partners(r).count() as u32).collect();
    }
    let mut total = vec![0i64; n];
    for mask in 0..1u32 << cols {
        let picked: Vec<&Vec<u32>> = (0..cols)
            .filter(|c| mask >> c & 1 == 1)
            .map(|c| &rule.diff.codes[c])
            .collect();
        let key = |r: usize| -> Vec<u32> {
            std::iter::once(rule.group_of[r] as u32)
                .chain(picked.iter().map(|c| c[r]))
                .collect()
        };
        let mut count: HashMap<Vec<u32>, i64> = HashMap::new();
        for r in 0..n {
            *count.entry(key(r)).or_default() += 1;
        }
        let sign = if mask.count_ones() % 2 == 0 { 1 } else { -1 };
        for (r, t) in total.iter_mut().enumerate() {
            *t += sign * count[&key(r)];
        }
    }
    total.into_iter().map(|t| t as u32).collect()
}

/// copairs' `average_precision(meta, feats, pos_sameby, pos_diffby, neg_sameby, neg_diffby,
/// distance="cosine")`, one [`ApRow`] per table row (rows in no pair: NaN, 0, 0). The counts
/// come first (so a table without positive or negative pairs fails before any similarity is
/// computed), then [`super::rank`] ranks without materialising the pairs, on every core this
/// process may use (`taskset` limits it).
pub fn average_precision(
    table: &ProfileTable,
    rules: &PairRules,
) -> Result<Vec<ApRow>, ScoringError> {
    table.need_rows(2, "average precision (a profile and its partners)")?;
    table.check_finite()?;
    let pos = Rule::new(table, &rules.pos_sameby, &rules.pos_diffby, "pos")?;
    let neg = Rule::new(table, &rules.neg_sameby, &rules.neg_diffby, "neg")?;
    let n = table.rows;
    let n_pos = partner_counts(&pos, n);
    let n_neg = partner_counts(&neg, n);
    if n_pos.iter().all(|&k| k == 0) {
        return Err(ScoringError::invalid(
            table,
            "no positive pairs: no two rows are equal in every pos_sameby column and different in every pos_diffby column",
        ));
    }
    if n_neg.iter().all(|&k| k == 0) {
        return Err(ScoringError::invalid(
            table,
            format!(
                "no negative pairs: no two rows match the neg_sameby/neg_diffby rule (neg_sameby: {}; neg_diffby: {}); are all rows in one group?",
                list(&rules.neg_sameby),
                list(&rules.neg_diffby)
            ),
        ));
    }
    let unit = unit_rows(table)?;
    let mut ap = vec![f64::NAN; n];
    let inputs = rank::Inputs {
        unit: &unit,
        d: table.dim(),
        neg_groups: &neg.groups,
        neg_diff: &neg.diff,
        n_pos: &n_pos,
        n_neg: &n_neg,
        threads: std::thread::available_parallelism().map_or(1, |t| t.get()),
    };
    rank::fill_ap(&inputs, &|r| pos.partners(r).collect(), &mut ap);
    Ok((0..n)
        .map(|r| ApRow {
            n_pos_pairs: n_pos[r],
            n_total_pairs: n_pos[r] + n_neg[r],
            average_precision: ap[r],
        })
        .collect())
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

    /// A 700-row table (three tiles) with plates, compounds, controls and duplicated rows
    /// (exact ties across positives and negatives), 6 features on a coarse grid so that
    /// distinct rows tie too.
    fn tiled_table() -> ProfileTable {
        let (n, d) = (700usize, 6usize);
        let mut rng = SplitMix64(11);
        let mut features: Vec<f32> = (0..n * d)
            .map(|_| rng.below(5) as f32 - 2.0 + 0.5)
            .collect();
        for r in (0..n).step_by(7) {
            let src = (r * 13 + 5) % n;
            let copy = features[src * d..(src + 1) * d].to_vec();
            features[r * d..(r + 1) * d].copy_from_slice(&copy);
        }
        let col = |f: &dyn Fn(usize) -> String| (0..n).map(|r| Some(f(r))).collect::<Vec<_>>();
        let meta = vec![
            (
                "Metadata_Plate".to_string(),
                col(&|r| format!("P{}", r % 3)),
            ),
            (
                "Metadata_Compound".to_string(),
                col(&|r| {
                    if r % 10 == 0 {
                        "DMSO".into()
                    } else {
                        format!("c{}", r / 4 % 90)
                    }
                }),
            ),
            (
                "Metadata_Condition".to_string(),
                col(&|r| {
                    if r % 10 == 0 {
                        "Control".into()
                    } else {
                        "Treated".into()
                    }
                }),
            ),
        ];
        ProfileTable {
            path: "tiled.parquet".into(),
            meta,
            feature_names: (0..d).map(|j| format!("f{j}")).collect(),
            features,
            rows: n,
            nested: vec![],
        }
    }

    /// The engine's AP equals the sorted rank list's (the definition) on every row, bit for
    /// bit, for replicate retrieval within plates, across all rows, and against controls.
    #[test]
    fn engine_equals_sorted_rank_lists_across_tiles_and_ties() {
        let mut table = tiled_table();
        assign_reference_index(&mut table, "Metadata_Condition", "Control").unwrap();
        let v = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let refcols = v(&["Metadata_Compound", "Metadata_Reference_Index"]);
        let cases = [
            PairRules {
                pos_sameby: v(&["Metadata_Compound"]),
                pos_diffby: v(&["Metadata_Plate"]),
                neg_sameby: v(&["Metadata_Plate"]),
                neg_diffby: v(&["Metadata_Compound"]),
            },
            PairRules {
                pos_sameby: v(&["Metadata_Compound"]),
                pos_diffby: vec![],
                neg_sameby: vec![],
                neg_diffby: v(&["Metadata_Compound"]),
            },
            PairRules {
                pos_sameby: refcols.clone(),
                pos_diffby: vec![],
                neg_sameby: vec![],
                neg_diffby: refcols,
            },
        ];
        let unit = unit_rows(&table).unwrap();
        let d = table.dim();
        for rules in cases {
            let got = average_precision(&table, &rules).unwrap();
            let pos = Rule::new(&table, &rules.pos_sameby, &rules.pos_diffby, "pos").unwrap();
            let neg = Rule::new(&table, &rules.neg_sameby, &rules.neg_diffby, "neg").unwrap();
            let mut ties = 0;
            for (r, g) in got.iter().enumerate() {
                let k = |j| rank::key(&unit, d, r, j);
                let ranked: Vec<(f32, bool)> = pos
                    .partners(r)
                    .map(|j| (k(j), true))
                    .chain(neg.partners(r).map(|j| (k(j), false)))
                    .collect();
                let mut keys: Vec<f32> = ranked.iter().map(|p| p.0).collect();
                keys.sort_by(f32::total_cmp);
                ties += keys.windows(2).filter(|w| w[0] == w[1]).count();
                let want = ap_of(ranked);
                assert_eq!(
                    (g.n_pos_pairs, g.n_total_pairs),
                    (want.n_pos_pairs, want.n_total_pairs),
                    "row {r} {rules:?}"
                );
                assert!(
                    g.average_precision.to_bits() == want.average_precision.to_bits()
                        || (g.average_precision.is_nan() && want.average_precision.is_nan()),
                    "row {r}: {} vs {} {rules:?}",
                    g.average_precision,
                    want.average_precision
                );
            }
            assert!(ties > 1000, "the table has ties to break: {ties}");
        }
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
