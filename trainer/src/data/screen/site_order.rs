//! `data.order: sites`: an epoch order that decodes each site of a screen once.
//!
//! scDINO's order (a uniform permutation over all cells) sends consecutive cells to random
//! sites, so a loader cutting cells from fields of view decodes a whole site (5 × 1080² for a
//! Cell Painting field) for almost every cell. DeepProfiler's answer is to sample crops from a
//! queue of loaded images; here the sites are shuffled per epoch and the cells are shuffled
//! within windows of `window` consecutive sites: a batch mixes cells of several random sites,
//! and a cache of two windows' sites serves every cell of the epoch with one read per site.
//!
//! Guarantees, as for the other orders: a pure function of (seed, epoch, rank, world), so a
//! resumed run skips to the same place; each rank's share is a contiguous run of the shuffled
//! sites ([`rank_block`]), so a site is read by one rank (two where a run is cut).
use crate::data::group_blocks::rank_block;
use scdino_base::rng::SplitMix64;

/// The cells of `rank` for `epoch`. `sites[s]` lists site `s`'s cell positions; `train` is
/// the training split (positions outside it are skipped); `window` is the number of sites
/// whose cells are shuffled together (at least 1).
pub fn site_window_order(
    sites: &[Vec<usize>],
    train: &[usize],
    window: usize,
    seed: u64,
    epoch: u64,
    rank: usize,
    world: usize,
) -> Vec<usize> {
    let epoch_seed = seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ 0x517E_5EED;
    let block = rank_block(sites, train, &mut SplitMix64::new(epoch_seed), rank, world);
    let mut site_of = vec![usize::MAX; block.iter().max().map_or(0, |m| m + 1)];
    let len = site_of.len();
    for (s, cells) in sites.iter().enumerate() {
        for &c in cells.iter().filter(|&&c| c < len) {
            site_of[c] = s;
        }
    }
    let mut rng =
        SplitMix64::new(epoch_seed ^ (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut out = Vec::with_capacity(block.len());
    let mut start = 0;
    while start < block.len() {
        // The window ends where its `window + 1`-th site begins (or at the block's end).
        let mut end = start;
        let mut seen = 0;
        let mut last = usize::MAX;
        while end < block.len() {
            let s = site_of[block[end]];
            if s != last {
                if seen == window.max(1) {
                    break;
                }
                seen += 1;
                last = s;
            }
            end += 1;
        }
        let mut w = block[start..end].to_vec();
        for i in (1..w.len()).rev() {
            w.swap(i, rng.below(i as u64 + 1) as usize);
        }
        out.extend(w);
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// `n_sites` sites of 0..=`max` cells each, listed site by site.
    fn screen(n_sites: usize, max: usize, seed: u64) -> Vec<Vec<usize>> {
        let mut rng = SplitMix64::new(seed);
        let mut next = 0;
        (0..n_sites)
            .map(|_| {
                let k = rng.below(max as u64 + 1) as usize;
                let cells = (next..next + k).collect();
                next += k;
                cells
            })
            .collect()
    }

    fn site_of(sites: &[Vec<usize>], c: usize) -> usize {
        sites.iter().position(|s| s.contains(&c)).unwrap()
    }

    #[test]
    fn every_training_cell_once_per_epoch_across_ranks() {
        let sites = screen(40, 12, 1);
        let n: usize = sites.iter().map(Vec::len).sum();
        let train: Vec<usize> = (0..n).filter(|c| c % 5 != 0).collect();
        for world in [1, 2, 3, 4] {
            let per_rank = train.len().div_ceil(world);
            let mut all = Vec::new();
            for rank in 0..world {
                let o = site_window_order(&sites, &train, 3, 7, 2, rank, world);
                assert_eq!(o.len(), per_rank, "world {world} rank {rank}");
                all.extend(o);
            }
            all.sort();
            all.dedup();
            assert_eq!(all, train, "world {world}: not a cover");
        }
    }

    #[test]
    fn a_pure_function_of_seed_epoch_and_rank() {
        let sites = screen(30, 9, 2);
        let all: Vec<usize> = (0..sites.iter().map(Vec::len).sum()).collect();
        let a = site_window_order(&sites, &all, 4, 7, 2, 1, 3);
        assert_eq!(a, site_window_order(&sites, &all, 4, 7, 2, 1, 3));
        assert_ne!(a, site_window_order(&sites, &all, 4, 7, 3, 1, 3));
        assert_ne!(a, site_window_order(&sites, &all, 4, 8, 2, 1, 3));
    }

    /// The point of the order: consecutive windows of cells come from `window` sites each, and
    /// no site appears in two windows of a rank (so two windows' sites in a cache read each
    /// site once), except where the rank's block wraps around onto its own first site.
    #[test]
    fn windows_hold_few_sites_and_a_site_is_met_in_one_window() {
        let sites = screen(50, 10, 3);
        let all: Vec<usize> = (0..sites.iter().map(Vec::len).sum()).collect();
        for window in [1, 2, 5] {
            let o = site_window_order(&sites, &all, window, 11, 0, 0, 1);
            // Cut the order back into windows: a new window starts where a site outside
            // the current window's set appears once the set is full.
            let mut windows: Vec<BTreeSet<usize>> = vec![BTreeSet::new()];
            for &c in &o {
                let s = site_of(&sites, c);
                let cur = windows.last_mut().unwrap();
                if !cur.contains(&s) && cur.len() == window {
                    windows.push(BTreeSet::from([s]));
                } else {
                    cur.insert(s);
                }
            }
            let met: usize = windows.iter().map(BTreeSet::len).sum();
            let distinct = sites.iter().filter(|s| !s.is_empty()).count();
            assert_eq!(
                met, distinct,
                "window {window}: a site split across windows"
            );
            // The cells are mixed inside a window, not left in site order.
            if window > 1 {
                let in_site_order = o
                    .windows(2)
                    .all(|p| p[0] < p[1] || site_of(&sites, p[0]) != site_of(&sites, p[1]));
                assert!(!in_site_order, "window {window}: cells not shuffled");
            }
        }
    }

    #[test]
    fn empty_inputs_give_an_empty_order() {
        assert!(site_window_order(&[], &[], 4, 1, 0, 0, 1).is_empty());
        assert!(site_window_order(&[vec![], vec![]], &[], 4, 1, 0, 1, 2).is_empty());
        let one = vec![vec![0]];
        assert_eq!(site_window_order(&one, &[0], 4, 1, 0, 0, 1), vec![0]);
        assert_eq!(site_window_order(&one, &[0], 4, 1, 0, 1, 2), vec![0]);
    }
}
