//! Which samples each process sees, in which order, per epoch: scDINO's
//! `DistributedSamplerWrapper(SubsetRandomSampler(train))` semantics: a fresh permutation of
//! the training indices every epoch, padded (by wrapping around) to a multiple of the world
//! size, and rank r taking positions r, r+W, r+2W, ...
//!
//! The permutation comes from our own seeded generator (not torch's), so it is reproducible
//! for (seed, epoch) on every machine; it is not scDINO's exact order (that came from the
//! torch RNG state of each process and never repeated across runs either).

use scdino_base::rng::SplitMix64;

/// The samples of `rank` for `epoch`, in the order its loader must deliver them.
pub fn epoch_order(
    train: &[usize],
    seed: u64,
    epoch: u64,
    rank: usize,
    world: usize,
) -> Vec<usize> {
    assert!(
        world > 0 && rank < world,
        "rank {rank} outside world of {world}"
    );
    let mut order = train.to_vec();
    let mut rng = SplitMix64::new(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    if order.is_empty() {
        return order;
    }
    let total = order.len().div_ceil(world) * world;
    let padded: Vec<usize> = order.iter().copied().cycle().take(total).collect();
    padded.into_iter().skip(rank).step_by(world).collect()
}

/// Iterations per epoch for one process: `ceil(ceil(N / W) / B)` (the loader keeps the last,
/// smaller batch, as scDINO's `drop_last=False`).
pub fn iters_per_epoch(train_len: usize, world: usize, batch: usize) -> usize {
    train_len.div_ceil(world).div_ceil(batch)
}

/// A `data.order` that the dataset cannot give.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error(
        "data.order: shard_sequential needs a packed dataset, but {dataset} is not one (pack it with `trainer data pack`)"
    )]
    NotPacked {
        dataset: crate::config::DatasetLocation,
    },
    #[error(
        "data.order: sites needs a screen read site by site (data.screen), but {dataset} is not one"
    )]
    NotAScreen {
        dataset: crate::config::DatasetLocation,
    },
}

/// The epoch order for `data.order`: [`epoch_order`] (`exact`), the shard-streaming order
/// of [`crate::data::shards::shard_sequential_order`], which needs a packed source, or the
/// site-window order of [`crate::data::screen::site_order::site_window_order`], which needs a
/// screen.
pub fn configured_epoch_order(
    data: &crate::config::DataSection,
    source: &dyn crate::data::ImageSource,
    train: &[usize],
    seed: u64,
    epoch: u64,
    rank: usize,
    world: usize,
) -> Result<Vec<usize>, OrderError> {
    use crate::config::SampleOrder;
    match data.order {
        SampleOrder::Exact => Ok(epoch_order(train, seed, epoch, rank, world)),
        SampleOrder::ShardSequential => {
            let layout = source.shard_layout().ok_or_else(|| OrderError::NotPacked {
                dataset: data.dataset_dir.clone(),
            })?;
            Ok(crate::data::shards::shard_sequential_order(
                layout,
                train,
                data.shuffle_buffer,
                seed,
                epoch,
                rank,
                world,
            ))
        }
        SampleOrder::Sites => {
            let sites = source.site_layout().ok_or_else(|| OrderError::NotAScreen {
                dataset: data.dataset_dir.clone(),
            })?;
            Ok(crate::data::screen::site_order::site_window_order(
                sites,
                train,
                sites_per_window(data),
                seed,
                epoch,
                rank,
                world,
            ))
        }
    }
}

/// With `data.order: sites`, a warning when a window of sites holds fewer cells (on average)
/// than the loader keeps in flight: its workers then reach into windows whose sites the cache
/// no longer holds, and sites are decoded again.
pub fn site_window_warning(
    data: &crate::config::DataSection,
    source: &dyn crate::data::ImageSource,
    batch: usize,
) -> Option<String> {
    let sites = match data.order {
        crate::config::SampleOrder::Sites => source.site_layout()?,
        _ => return None,
    };
    let filled = sites.iter().filter(|s| !s.is_empty()).count().max(1);
    let per_site = sites.iter().map(Vec::len).sum::<usize>() as f64 / filled as f64;
    let window = sites_per_window(data);
    let in_flight = 2 * data.num_workers.max(1) * batch;
    ((per_site * window as f64) < in_flight as f64).then(|| {
        format!(
            "data.order: sites shuffles windows of {window} site{} (half of data.screen.site_cache) \
             holding about {:.0} cells, fewer than the {in_flight} cells the loader holds in flight \
             (2 × num_workers × batch): raise data.screen.site_cache to at least {} so each site \
             is decoded once per epoch",
            if window == 1 { "" } else { "s" },
            per_site * window as f64,
            2 * (in_flight as f64 / per_site).ceil() as usize
        )
    })
}

/// Sites whose cells `data.order: sites` shuffles together: half the site cache, so the
/// window being read and the next one both fit in it.
pub fn sites_per_window(data: &crate::config::DataSection) -> usize {
    data.screen
        .as_ref()
        .map_or(1, |s| (s.site_cache / 2).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_once_per_epoch_across_ranks() {
        let train: Vec<usize> = (100..137).collect();
        for world in [1, 2, 3, 4] {
            let mut all: Vec<usize> = (0..world)
                .flat_map(|r| epoch_order(&train, 7, 3, r, world))
                .collect();
            let per_rank = train.len().div_ceil(world);
            assert_eq!(all.len(), per_rank * world);
            all.sort();
            all.dedup();
            assert_eq!(all, train, "world {world}: not a cover");
        }
        // A new epoch is a new order; the same epoch is the same order.
        assert_ne!(
            epoch_order(&train, 7, 3, 0, 1),
            epoch_order(&train, 7, 4, 0, 1)
        );
        assert_eq!(
            epoch_order(&train, 7, 3, 0, 1),
            epoch_order(&train, 7, 3, 0, 1)
        );
    }

    #[test]
    fn iteration_counts_match_scdino_logs() {
        // N_train = 90852, B = 30: 758/379/253/190 iterations for W = 4/8/12/16.
        let got: Vec<usize> = [4, 8, 12, 16]
            .iter()
            .map(|&w| iters_per_epoch(90852, w, 30))
            .collect();
        assert_eq!(got, vec![758, 379, 253, 190]);
    }

    #[test]
    fn below_is_uniform() {
        let mut rng = SplitMix64::new(1);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[rng.below(6) as usize] += 1;
        }
        // Expected 10,000 each, σ ≈ 91: allow 5σ.
        assert!(
            counts.iter().all(|&c| (c as i64 - 10_000).abs() < 460),
            "{counts:?}"
        );
    }

    // The shard-sequential order against the exact order's length (here, since the sampler
    // calls the shard order).
    use crate::data::shards::sequential_order::tests::layout;
    use crate::data::shards::shard_sequential_order;
    use scdino_base::rng::SplitMix64;

    /// Property-style: for many dataset sizes, splits, buffers and world sizes, the ranks
    /// together see every training sample exactly once plus exactly the padding the exact
    /// order adds, with equal lengths per rank.
    #[test]
    fn every_training_sample_once_across_ranks() {
        let mut rng = SplitMix64::new(99);
        for case in 0..60u64 {
            let n = 1 + rng.below(80) as usize;
            let lay = layout(n, case);
            let train: Vec<usize> = (0..n).filter(|_| rng.below(5) != 0).collect();
            let buffer = [1, 2, 7, 1000][case as usize % 4];
            for world in [1, 2, 3] {
                let orders: Vec<Vec<usize>> = (0..world)
                    .map(|r| shard_sequential_order(&lay, &train, buffer, case, 4, r, world))
                    .collect();
                let exact_len = epoch_order(&train, case, 4, 0, world).len();
                let mut counts = vec![0usize; n];
                for o in &orders {
                    assert_eq!(o.len(), exact_len, "n={n} world={world}");
                    for &p in o {
                        counts[p] += 1;
                    }
                }
                let pad = train.len().div_ceil(world) * world - train.len();
                let extra: usize = counts.iter().map(|&c| c.saturating_sub(1)).sum();
                assert_eq!(extra, pad, "n={n} world={world} buffer={buffer}");
                for (p, &c) in counts.iter().enumerate() {
                    let is_train = train.contains(&p);
                    assert_eq!(c >= 1, is_train, "sample {p} count {c}");
                    assert!(
                        c <= 1 + pad.div_ceil(train.len().max(1)),
                        "sample {p} count {c}"
                    );
                }
            }
        }
    }
}
