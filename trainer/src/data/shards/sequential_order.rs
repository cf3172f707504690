//! `data.order: shard_sequential`: an epoch order that reads shards front to back.
//!
//! scDINO's order (a uniform permutation, `data.order: exact`) touches every shard at random
//! offsets; that is fine on local disks and FSx but defeats streaming. Here the shard order is
//! shuffled per epoch, the concatenated training samples are cut into one contiguous block per
//! rank (so each rank streams about `shards / world` shards), and each rank mixes its stream
//! through a WebDataset-style shuffle buffer. Shards were shuffled at pack time, so even a
//! small buffer gives class-mixed batches.
//!
//! Guarantees, as for the exact order: a pure function of (seed, epoch, rank, world), so a
//! resumed run skips to the same place; every rank gets `ceil(N / world)` samples (so the
//! iteration count is unchanged), and together the ranks see every training sample once,
//! plus the same wrap-around padding as the distributed sampler.
use crate::data::group_blocks::rank_block;
use scdino_base::rng::SplitMix64;

/// The samples of `rank` for `epoch`. `layout[s]` lists shard `s`'s sample positions in
/// member order; `train` is the training split (positions outside it are skipped).
pub fn shard_sequential_order(
    layout: &[Vec<usize>],
    train: &[usize],
    buffer: usize,
    seed: u64,
    epoch: u64,
    rank: usize,
    world: usize,
) -> Vec<usize> {
    let epoch_seed = seed ^ epoch.wrapping_mul(0xA24B_AED4_963E_E407) ^ 0x5AD5_5EED;
    let block = rank_block(layout, train, &mut SplitMix64::new(epoch_seed), rank, world);
    if block.is_empty() {
        return block;
    }
    let mut rng =
        SplitMix64::new(epoch_seed ^ (rank as u64 + 1).wrapping_mul(0x9FB2_1C65_1E98_DF25));
    shuffle_buffer(block, buffer.max(1), &mut rng)
}

/// WebDataset's `shuffle(buffer)`: keep up to `size` samples, emit a random one as each new
/// sample arrives, then drain the rest in random order. `size = 1` keeps the stream order.
fn shuffle_buffer(stream: Vec<usize>, size: usize, rng: &mut SplitMix64) -> Vec<usize> {
    let mut out = Vec::with_capacity(stream.len());
    let mut buf: Vec<usize> = Vec::with_capacity(size.min(stream.len()));
    for x in stream {
        if buf.len() < size {
            buf.push(x);
            continue;
        }
        let j = rng.below(size as u64) as usize;
        out.push(std::mem::replace(&mut buf[j], x));
    }
    while !buf.is_empty() {
        let j = rng.below(buf.len() as u64) as usize;
        out.push(buf.swap_remove(j));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `n` samples cut into shards of uneven sizes, positions shuffled across shards.
    pub(crate) fn layout(n: usize, seed: u64) -> Vec<Vec<usize>> {
        let mut rng = SplitMix64::new(seed);
        let mut pos: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            pos.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut out = Vec::new();
        let mut rest = &pos[..];
        while !rest.is_empty() {
            let k = (1 + rng.below(9) as usize).min(rest.len());
            out.push(rest[..k].to_vec());
            rest = &rest[k..];
        }
        out
    }

    #[test]
    fn deterministic_per_epoch_and_reshuffled_across_epochs() {
        let lay = layout(200, 1);
        let train: Vec<usize> = (0..200).filter(|p| p % 5 != 0).collect();
        let a = shard_sequential_order(&lay, &train, 16, 7, 2, 1, 3);
        assert_eq!(a, shard_sequential_order(&lay, &train, 16, 7, 2, 1, 3));
        assert_ne!(a, shard_sequential_order(&lay, &train, 16, 7, 3, 1, 3));
        assert_ne!(a, shard_sequential_order(&lay, &train, 16, 8, 2, 1, 3));
    }

    /// Buffer 1 reads shards front to back: consecutive samples come from one shard, in
    /// member order, and a rank touches only a contiguous run of the epoch's shard order.
    #[test]
    fn buffer_one_streams_whole_shards_in_member_order() {
        let lay = layout(120, 5);
        let all: Vec<usize> = (0..120).collect();
        let shard_of: Vec<usize> = {
            let mut v = vec![0; 120];
            for (s, members) in lay.iter().enumerate() {
                for &p in members {
                    v[p] = s;
                }
            }
            v
        };
        let o = shard_sequential_order(&lay, &all, 1, 3, 0, 0, 1);
        let mut switches = 0;
        for w in o.windows(2) {
            if shard_of[w[0]] != shard_of[w[1]] {
                switches += 1;
            } else {
                let m = &lay[shard_of[w[0]]];
                let i = m.iter().position(|&p| p == w[0]).unwrap();
                assert_eq!(m[i + 1], w[1], "member order kept within a shard");
            }
        }
        assert_eq!(switches, lay.len() - 1, "each shard read in one run");
        // A real buffer mixes: the order is no longer the stream order.
        assert_ne!(o, shard_sequential_order(&lay, &all, 32, 3, 0, 0, 1));
    }
}
