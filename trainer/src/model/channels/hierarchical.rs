//! Hierarchical channel sampling (ChannelViT's HCS), the channel draw of `model.channels:
//! tokens`: each step trains on a random subset of the channels, drawn in two stages, the
//! number k uniformly from 1..=C and then k distinct channels uniformly, so subsets of every
//! size are equally common (independent channel dropout would make mid-sized subsets
//! dominate). The draw depends only on the run's seed and the iteration: every rank takes the
//! same subset in the same step, and a resumed run draws what a straight one would.
use scdino_base::rng::SplitMix64;

/// The channels (ascending indices into the model's channels) step `iteration` trains on.
pub fn hierarchical_sample(seed: u64, iteration: usize, channels: usize) -> Vec<i64> {
    assert!(channels > 0, "a model has at least one channel");
    // Its own stream: not the one that seeds the step's libtorch generator.
    let mut r = SplitMix64::new(
        seed ^ 0xC4A7_75E1_5A3B_1E5D ^ (iteration as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
    );
    let k = 1 + r.below(channels as u64) as usize;
    // Partial Fisher–Yates: the first k of a uniform permutation.
    let mut all: Vec<i64> = (0..channels as i64).collect();
    for i in 0..k {
        let j = i + r.below((channels - i) as u64) as usize;
        all.swap(i, j);
    }
    let mut chosen = all[..k].to_vec();
    chosen.sort_unstable();
    chosen
}

/// The expected number of channels per step under [`hierarchical_sample`]: (C + 1) / 2.
pub fn expected_channels(channels: usize) -> f64 {
    (channels as f64 + 1.0) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn deterministic_sorted_distinct_and_in_range() {
        for it in 0..200 {
            let a = hierarchical_sample(7, it, 5);
            assert_eq!(a, hierarchical_sample(7, it, 5));
            assert!(!a.is_empty() && a.len() <= 5);
            assert!(a.windows(2).all(|w| w[0] < w[1]), "{a:?}");
            assert!(a.iter().all(|&c| (0..5).contains(&c)));
        }
        assert_ne!(
            (0..50)
                .map(|i| hierarchical_sample(7, i, 5))
                .collect::<Vec<_>>(),
            (0..50)
                .map(|i| hierarchical_sample(8, i, 5))
                .collect::<Vec<_>>()
        );
        assert_eq!(hierarchical_sample(3, 9, 1), vec![0]);
    }

    /// Both stages are uniform: every size 1..=C about equally often, and within a size every
    /// subset about equally often (chi-square-free bounds, 40 000 draws).
    #[test]
    fn sizes_and_subsets_are_uniform() {
        let (c, n) = (4usize, 40_000usize);
        let mut by_size = vec![0usize; c + 1];
        let mut by_subset: HashMap<Vec<i64>, usize> = HashMap::new();
        for it in 0..n {
            let s = hierarchical_sample(11, it, c);
            by_size[s.len()] += 1;
            *by_subset.entry(s).or_default() += 1;
        }
        for (k, &m) in by_size.iter().enumerate().skip(1) {
            let share = m as f64 / n as f64;
            assert!((share - 0.25).abs() < 0.015, "size {k}: {share}");
        }
        // Size 2 has 6 subsets: each about 1/24 of all draws.
        for (s, &m) in &by_subset {
            if s.len() == 2 {
                let share = m as f64 / n as f64;
                assert!((share - 1.0 / 24.0).abs() < 0.008, "{s:?}: {share}");
            }
        }
        assert_eq!(
            by_subset.len(),
            15,
            "every non-empty subset of 4 channels occurs"
        );
        let mean = (0..n)
            .map(|it| hierarchical_sample(11, it, c).len())
            .sum::<usize>() as f64
            / n as f64;
        assert!((mean - expected_channels(c)).abs() < 0.03, "{mean}");
    }
}
