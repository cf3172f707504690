//! Batches of cells that share their channels, for `model.channels: tokens` on a table whose
//! cells bring their own channels (`data.screen.cell_channels: own`, CHAMMI's 3-, 4- and
//! 5-channel datasets in one run). A `tokens` step feeds every image of the batch the same
//! channels, so each global batch (every rank's share of one step) is drawn from the cells
//! of one channel set, as CHAMMI's and DiChaViT's training loaders draw each batch from one
//! dataset; the step's channels are then sampled among that set's
//! ([`crate::train::channels::step_channels`]).
//!
//! Per epoch: the training cells in [`epoch_order`]'s exact shuffle, split by channel set
//! (keeping that order), each set cut into global batches of `world × batch` cells, the
//! set's last batch filled up by wrapping around its cells (as the exact order pads the epoch
//! to a multiple of the world size, so no rank's batch runs short and the sets never mix),
//! then the batches of all sets shuffled together; rank r takes positions r, r + W, … of each
//! batch. Like every order it depends only on (seed, epoch), so a resumed epoch starts at its
//! batch.
use crate::data::ImageSource;
use crate::train::sampler::epoch_order;
use scdino_base::rng::SplitMix64;
use std::collections::BTreeMap;

/// The training cells grouped by the channels they hold.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelSets {
    /// Per set (ascending channel lists), its cells in `train` order.
    sets: BTreeMap<Vec<usize>, Vec<usize>>,
}

impl ChannelSets {
    /// The sets of `train`'s cells, or `None` when the source gives every cell every channel.
    pub fn of(source: &dyn ImageSource, train: &[usize]) -> Option<Self> {
        let mut sets: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
        for &i in train {
            sets.entry(source.cell_channels(i)?.to_vec())
                .or_default()
                .push(i);
        }
        Some(Self { sets })
    }

    /// Steps per epoch on each rank: every set's global batches.
    pub fn iters_per_epoch(&self, world: usize, batch: usize) -> usize {
        let global = (world * batch).max(1);
        self.sets.values().map(|c| c.len().div_ceil(global)).sum()
    }

    /// Each set and its cell count, for the log.
    pub fn describe(&self, names: &[String]) -> String {
        self.sets
            .iter()
            .map(|(set, cells)| {
                let set: Vec<&str> = set.iter().map(|&c| names[c].as_str()).collect();
                format!("[{}]: {}", set.join(", "), cells.len())
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Rank `rank`'s cells for `epoch`: [`Self::iters_per_epoch`] batches of exactly `batch`
    /// cells, each batch's cells sharing one channel set (see the module doc).
    pub fn epoch_order(
        &self,
        seed: u64,
        epoch: u64,
        rank: usize,
        world: usize,
        batch: usize,
    ) -> Vec<usize> {
        assert!(
            world > 0 && rank < world && batch > 0,
            "rank {rank} of {world}, batch {batch}"
        );
        let global = world * batch;
        let all: Vec<usize> = self.sets.values().flatten().copied().collect();
        let set_of: std::collections::HashMap<usize, &Vec<usize>> = self
            .sets
            .iter()
            .flat_map(|(set, cells)| cells.iter().map(move |&c| (c, set)))
            .collect();
        let mut by_set: BTreeMap<&Vec<usize>, Vec<usize>> = BTreeMap::new();
        for i in epoch_order(&all, seed, epoch, 0, 1) {
            by_set.entry(set_of[&i]).or_default().push(i);
        }
        let mut batches: Vec<Vec<usize>> = by_set
            .values()
            .flat_map(|cells| {
                let padded = cells.len().div_ceil(global) * global;
                let cycled: Vec<usize> = cells.iter().copied().cycle().take(padded).collect();
                cycled
                    .chunks(global)
                    .map(<[usize]>::to_vec)
                    .collect::<Vec<_>>()
            })
            .collect();
        // Its own stream, apart from the cells' shuffle.
        let mut rng = SplitMix64::new(
            seed ^ 0x3C6E_F372_FE94_F82B ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        for i in (1..batches.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            batches.swap(i, j);
        }
        batches
            .into_iter()
            .flat_map(|b| b.into_iter().skip(rank).step_by(world))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Cells 0..n whose set is `set(i)`.
    fn sets(n: usize, set: impl Fn(usize) -> Vec<usize>) -> ChannelSets {
        let mut sets: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
        for i in 0..n {
            sets.entry(set(i)).or_default().push(i);
        }
        ChannelSets { sets }
    }

    fn set_of(i: usize) -> Vec<usize> {
        match i % 3 {
            0 => vec![0, 1, 2],
            1 => vec![1, 3],
            _ => vec![0, 1, 2, 3, 4],
        }
    }

    /// Every batch of every rank holds one set, the ranks' batches of a step share it, every
    /// cell is in the epoch, and only a set's last batch repeats cells (of that set).
    #[test]
    fn each_step_draws_one_set_on_every_rank_and_covers_every_cell() {
        let s = sets(53, set_of);
        for (world, batch) in [(1, 4), (2, 3), (3, 5)] {
            let n = s.iters_per_epoch(world, batch);
            let orders: Vec<Vec<usize>> = (0..world)
                .map(|r| s.epoch_order(9, 2, r, world, batch))
                .collect();
            let mut seen = HashSet::new();
            for order in &orders {
                assert_eq!(order.len(), n * batch, "world {world} batch {batch}");
                seen.extend(order.iter().copied());
            }
            assert_eq!(seen.len(), 53, "every cell in the epoch");
            for step in 0..n {
                let cells: Vec<usize> = orders
                    .iter()
                    .flat_map(|o| o[step * batch..(step + 1) * batch].iter().copied())
                    .collect();
                let first = set_of(cells[0]);
                assert!(
                    cells.iter().all(|&c| set_of(c) == first),
                    "step {step}: {cells:?}"
                );
            }
            // Padding: at most one global batch's worth of repeats per set.
            let total: usize = orders.iter().map(Vec::len).sum();
            assert!(total - 53 < 3 * world * batch);
        }
    }

    #[test]
    fn the_order_depends_on_seed_and_epoch_only() {
        let s = sets(40, set_of);
        assert_eq!(s.epoch_order(1, 3, 0, 2, 4), s.epoch_order(1, 3, 0, 2, 4));
        assert_ne!(s.epoch_order(1, 3, 0, 2, 4), s.epoch_order(1, 4, 0, 2, 4));
        assert_ne!(s.epoch_order(1, 3, 0, 2, 4), s.epoch_order(2, 3, 0, 2, 4));
        // The sets alternate across the epoch, not one set after the other.
        let order = s.epoch_order(1, 3, 0, 1, 2);
        let firsts: Vec<Vec<usize>> = order.chunks(2).map(|b| set_of(b[0])).collect();
        let runs = firsts.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(runs >= 5, "{firsts:?}");
    }

    /// A set smaller than a global batch fills it by repeating its cells; one cell alone too.
    #[test]
    fn a_small_set_fills_its_batch() {
        let s = sets(7, |i| if i == 6 { vec![2] } else { vec![0, 1] });
        assert_eq!(s.iters_per_epoch(2, 4), 2);
        let order: Vec<usize> = (0..2).flat_map(|r| s.epoch_order(0, 0, r, 2, 4)).collect();
        assert_eq!(order.iter().filter(|&&c| c == 6).count(), 8);
        assert_eq!(order.len(), 16);
    }
}
