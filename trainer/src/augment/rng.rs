//! Deterministic per-sample random numbers.
//!
//! Every crop of every sample gets its own generator, derived only from
//! `(seed, epoch, sample_index, stream)`. The augmentation of a sample is
//! therefore the same whichever loader thread draws it and in whatever order,
//! and the crops of one sample can be generated independently.
//!
//! The generator is xoshiro256++ (Blackman & Vigna), seeded by SplitMix64
//! from a SplitMix-style hash of the four words. Not cryptographic.

pub use scdino_base::rng::mix64;
use scdino_base::rng::GOLDEN;

/// One SplitMix64 step.
#[inline]
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(GOLDEN);
    mix64(*state)
}

/// Identifies one sample of one epoch of one run: the "seed triplet" from
/// which all of the sample's augmentation randomness derives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SampleKey {
    /// Run seed (`run.seed`).
    pub seed: u64,
    /// Epoch number.
    pub epoch: u64,
    /// Dataset index of the sample (not its position in the batch).
    pub index: u64,
}

impl SampleKey {
    pub const fn new(seed: u64, epoch: u64, index: u64) -> Self {
        Self { seed, epoch, index }
    }

    /// The generator of stream `stream` of this sample (the multi-crop module
    /// uses the crop number as the stream).
    pub fn rng(&self, stream: u64) -> SampleRng {
        SampleRng::new(self.seed, self.epoch, self.index, stream)
    }
}

/// xoshiro256++ generator with helpers matching the draws torchvision makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleRng {
    s: [u64; 4],
}

impl SampleRng {
    /// Generator for `(seed, epoch, sample_index, stream)`.
    ///
    /// The words are absorbed one after the other through a bijective mix,
    /// so distinct tuples collide only with probability ~2^-64.
    pub fn new(seed: u64, epoch: u64, sample_index: u64, stream: u64) -> Self {
        let mut h = mix64(seed ^ 0x7363_4449_4e4f_6175); // "scDINOau"
        for (k, w) in [epoch, sample_index, stream].into_iter().enumerate() {
            h = mix64(h.wrapping_add(w.wrapping_mul(GOLDEN)) ^ (k as u64 + 1));
        }
        Self::from_seed(h)
    }

    /// Generator seeded from a single word with SplitMix64 (never all-zero).
    pub fn from_seed(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        // Four consecutive SplitMix64 outputs cannot all be zero (mix64 is a
        // bijection and the four inputs differ), so the state is valid.
        Self { s }
    }

    /// Next raw 64-bit output (xoshiro256++).
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform `f64` in [0, 1) with 53 random bits.
    #[inline]
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform `f64` in [a, b) (`a + (b − a)·u`; b itself only through
    /// rounding, as in Python's `random.uniform`).
    #[inline]
    pub fn uniform_range(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.uniform()
    }

    /// Uniform `f32` in [0, 1) with 24 random bits.
    #[inline]
    pub fn uniform_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Uniform `f32` in [a, b), computed in `f32` like
    /// `torch.empty(1, dtype=float32).uniform_(a, b)`.
    #[inline]
    pub fn uniform_range_f32(&mut self, a: f32, b: f32) -> f32 {
        self.uniform_f32() * (b - a) + a
    }

    /// Uniform integer in [lo, hi) (like `torch.randint(lo, hi)`), without
    /// modulo bias (Lemire's multiply-and-reject). Panics if `lo >= hi`.
    #[inline]
    pub fn int_range(&mut self, lo: i64, hi: i64) -> i64 {
        assert!(lo < hi, "int_range: empty range [{lo}, {hi})");
        let n = hi.wrapping_sub(lo) as u64;
        lo.wrapping_add(self.below(n) as i64)
    }

    /// Uniform integer in [0, n), n > 0.
    #[inline]
    fn below(&mut self, n: u64) -> u64 {
        let mut m = (self.next_u64() as u128) * (n as u128);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = (self.next_u64() as u128) * (n as u128);
            }
        }
        (m >> 64) as u64
    }

    /// `uniform() < p` (torch's `torch.rand(1) < p`, Python's `random.random() < p`).
    #[inline]
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.uniform() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_xoshiro_sequence() {
        // xoshiro256++ reference: state {1, 2, 3, 4} gives 41943041,
        // 58720359, 3588806011781223 (from the authors' C code).
        let mut r = SampleRng { s: [1, 2, 3, 4] };
        assert_eq!(r.next_u64(), 41_943_041);
        assert_eq!(r.next_u64(), 58_720_359);
        assert_eq!(r.next_u64(), 3_588_806_011_781_223);
    }

    #[test]
    fn int_range_bounds_and_coverage() {
        let mut r = SampleRng::new(1, 2, 3, 4);
        let mut seen = [0usize; 7];
        for _ in 0..7000 {
            let v = r.int_range(-3, 4);
            assert!((-3..4).contains(&v));
            seen[(v + 3) as usize] += 1;
        }
        // Each bucket expects 1000 (binomial sd ≈ 29.3); allow 6 sd.
        assert!(seen.iter().all(|&c| (824..=1176).contains(&c)), "{seen:?}");
    }

    #[test]
    fn streams_differ() {
        let a = SampleRng::new(0, 0, 0, 0).next_u64();
        let b = SampleRng::new(0, 0, 0, 1).next_u64();
        let c = SampleRng::new(0, 0, 1, 0).next_u64();
        let d = SampleRng::new(0, 1, 0, 0).next_u64();
        let e = SampleRng::new(1, 0, 0, 0).next_u64();
        let all = [a, b, c, d, e];
        for i in 0..all.len() {
            for j in i + 1..all.len() {
                assert_ne!(all[i], all[j]);
            }
        }
    }
}
