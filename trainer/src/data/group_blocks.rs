//! What the orders that keep groups of samples together (packed shards, a screen's sites)
//! share: the groups shuffled per epoch, their training samples concatenated, and one
//! contiguous block of that stream per rank, so each rank reads about `groups / world` groups.
//!
//! Every rank gets `ceil(N / world)` samples (so the iteration count is that of the exact
//! order), and together the ranks see every training sample once, plus the same wrap-around
//! padding as the distributed sampler.
use scdino_base::rng::SplitMix64;

/// Rank `rank`'s block of the training samples of `groups` (each a list of sample positions),
/// the groups in an order drawn from `rng`; positions outside `train` are skipped.
pub fn rank_block(
    groups: &[Vec<usize>],
    train: &[usize],
    rng: &mut SplitMix64,
    rank: usize,
    world: usize,
) -> Vec<usize> {
    assert!(
        world > 0 && rank < world,
        "rank {rank} outside world of {world}"
    );
    let n = groups.iter().map(Vec::len).sum::<usize>();
    let mut in_train = vec![false; n.max(train.iter().max().map_or(0, |m| m + 1))];
    for &t in train {
        in_train[t] = true;
    }
    let mut order: Vec<usize> = (0..groups.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let stream: Vec<usize> = order
        .iter()
        .flat_map(|&g| groups[g].iter().copied())
        .filter(|&p| in_train[p])
        .collect();
    if stream.is_empty() {
        return stream;
    }
    let per_rank = stream.len().div_ceil(world);
    stream
        .iter()
        .copied()
        .cycle()
        .skip(rank * per_rank)
        .take(per_rank)
        .collect()
}
