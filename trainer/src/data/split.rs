//! numpy-compatible seeded shuffles and the scDINO splits.
//!
//! scDINO selects its train / held-out images with
//! `numpy.random.seed(seed); numpy.random.shuffle(indices)` on
//! `indices = list(range(N))` (`main_dino.py`), and the mean/std subset the
//! same way with a hard-coded seed 42 (`mean_std_dataset.py`). To pick the
//! *same files* we reproduce numpy's legacy `RandomState` exactly:
//!
//! * `np.random.seed(int)` → MT19937 `init_genrand(seed)` (numpy's
//!   `mt19937_seed`; seeds must fit in 32 bits);
//! * `shuffle` of a list → Fisher–Yates from the end: for `i = n-1 .. 1`,
//!   `j = random_interval(i)`, swap `x[i]`, `x[j]`;
//! * `random_interval(max)` → smallest all-ones bit mask ≥ `max`, then draw
//!   32-bit outputs (64-bit if `max > 0xFFFF_FFFF`) and `& mask` until the
//!   value is ≤ `max` (rejection sampling, no modulo bias).
//!
//! The split sizes use the same f64 arithmetic as Python:
//! `split = floor((1 - train_fraction) * n)`, where `1 - 0.8` is
//! `0.19999999999999996`, so n = 100 gives a held-out set of 19, not 20.

use super::data_error::DataError;

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// The 32-bit Mersenne Twister as seeded by numpy's legacy `RandomState`.
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N],
    pos: usize,
}

impl Mt19937 {
    /// Equivalent of `np.random.seed(seed)` for an integer seed
    /// (Matsumoto–Nishimura `init_genrand`).
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; N];
        state[0] = seed;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, pos: N }
    }

    fn generate(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & UPPER_MASK) | (self.state[(i + 1) % N] & LOWER_MASK);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            self.state[i] = self.state[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.pos = 0;
    }

    /// Next tempered 32-bit output (`genrand_int32`).
    pub fn next_u32(&mut self) -> u32 {
        if self.pos >= N {
            self.generate();
        }
        let mut y = self.state[self.pos];
        self.pos += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// numpy's `mt19937_next64`: two 32-bit outputs, high word first.
    pub fn next_u64(&mut self) -> u64 {
        let hi = u64::from(self.next_u32());
        (hi << 32) | u64::from(self.next_u32())
    }

    /// numpy's `random_interval(max)`: uniform integer in `0..=max`.
    pub fn random_interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mut mask = max;
        for shift in [1, 2, 4, 8, 16, 32] {
            mask |= mask >> shift;
        }
        if max <= u64::from(u32::MAX) {
            loop {
                let v = u64::from(self.next_u32()) & mask;
                if v <= max {
                    return v;
                }
            }
        }
        loop {
            let v = self.next_u64() & mask;
            if v <= max {
                return v;
            }
        }
    }

    /// Legacy `RandomState.shuffle` of a Python list (or 1-D array).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.random_interval(i as u64) as usize;
            items.swap(i, j);
        }
    }
}

/// `np.random.seed(seed); x = list(range(n)); np.random.shuffle(x); x`.
pub fn numpy_shuffled_indices(n: usize, seed: u32) -> Vec<usize> {
    let mut indices: Vec<usize> = (0..n).collect();
    Mt19937::new(seed).shuffle(&mut indices);
    indices
}

/// Sample indices (into the `ImageFolder` sample list) of the two parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// `indices[split:]`: used for training (and as the kNN train pool).
    pub train: Vec<usize>,
    /// `indices[:split]`: the held-out part the feature, label and attention
    /// stages run on.
    pub held_out: Vec<usize>,
}

/// `int(np.floor((1 - fraction) * n))` with Python's f64 arithmetic.
fn python_split_point(n: usize, fraction: f64, what: &str) -> Result<usize, DataError> {
    if !(0.0..=1.0).contains(&fraction) {
        return Err(DataError::InvalidArgument(format!(
            "{what} must be within [0, 1], got {fraction}"
        )));
    }
    let validation_split = 1.0 - fraction;
    // In [0, n] because validation_split is in [0, 1]; min() guards rounding.
    Ok(((validation_split * n as f64).floor() as usize).min(n))
}

/// scDINO's train / held-out split (`main_dino.py`, and recomputed
/// identically by the CLS-feature, label and attention stages):
/// `validation_split = 1 - train_fraction`, `split = floor(validation_split * n)`,
/// `np.random.seed(seed)`, shuffle `range(n)`, train = `indices[split:]`,
/// held-out = `indices[:split]`. `seed` is `meta.seed` (40 in the config).
pub fn train_heldout_split(n: usize, train_fraction: f64, seed: u32) -> Result<Split, DataError> {
    let split = python_split_point(n, train_fraction, "train_datasetsplit_fraction")?;
    let mut indices = numpy_shuffled_indices(n, seed);
    let train = indices.split_off(split);
    Ok(Split {
        train,
        held_out: indices,
    })
}

/// The held-out split `data.split` asks for, over `index` (what training, the features
/// stage, evaluation, attention maps and `trainer data` all use, so they agree).
pub fn configured_split(
    index: &super::DatasetIndex,
    data: &crate::config::DataSection,
    seed: u32,
) -> Result<Split, DataError> {
    if let Some(column) = data.screen.as_ref().and_then(|s| s.split_by.as_deref()) {
        let groups = index.groups.as_ref().ok_or_else(|| {
            DataError::InvalidArgument(format!(
                "data.screen.split_by: {column}: the dataset {} carries no groups",
                index.root.display()
            ))
        })?;
        return group_split(groups, data.train_fraction, seed);
    }
    match data.split {
        crate::config::HeldOutSplit::Scdino => {
            train_heldout_split(index.len(), data.train_fraction, seed)
        }
        crate::config::HeldOutSplit::Stratified => {
            let labels: Vec<&str> = index.samples.iter().map(|s| s.label.as_str()).collect();
            stratified_split(&labels, data.train_fraction, seed)
        }
    }
}

/// A held-out split that keeps every group whole (a screen's wells or plates: cells of one
/// well are never on both sides). The distinct groups, sorted, are shuffled with numpy's
/// `shuffle` seeded by `seed`, and held out in that order until they hold at least scDINO's
/// number of held-out images (`floor((1 - fraction) * n)`); at least one group is kept for
/// training. Both lists are in index order.
pub fn group_split(groups: &[String], train_fraction: f64, seed: u32) -> Result<Split, DataError> {
    let n = groups.len();
    let target = python_split_point(n, train_fraction, "data.train_fraction")?;
    let mut sizes: std::collections::HashMap<&str, usize> = Default::default();
    for g in groups {
        *sizes.entry(g.as_str()).or_default() += 1;
    }
    let mut names: Vec<&str> = sizes.keys().copied().collect();
    names.sort_unstable();
    Mt19937::new(seed).shuffle(&mut names);
    let mut held: std::collections::HashSet<&str> = Default::default();
    let mut count = 0;
    for name in names.iter().take(names.len().saturating_sub(1)) {
        if count >= target {
            break;
        }
        held.insert(name);
        count += sizes[name];
    }
    let (held_out, train) = (0..n).partition(|&i| held.contains(groups[i].as_str()));
    Ok(Split { train, held_out })
}

/// scDINO's number of held-out images (`floor((1 - fraction) * n)`), shared among the labels
/// in proportion to their counts: each label gets the floor of its share, the rest go one
/// each to the labels with the largest remainders (ties: the smaller label count, then the
/// label name), and a label with at least two images that got none takes one from the label
/// holding the most while that one keeps two or more. Each label's images are shuffled with
/// numpy's `shuffle` seeded by `seed` and its first ones held out. Both lists are in index
/// order.
pub fn stratified_split(
    labels: &[&str],
    train_fraction: f64,
    seed: u32,
) -> Result<Split, DataError> {
    let n = labels.len();
    let total = python_split_point(n, train_fraction, "data.train_fraction")?;
    let mut groups: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for (i, l) in labels.iter().enumerate() {
        groups.entry(l).or_default().push(i);
    }
    let groups: Vec<(&str, Vec<usize>)> = groups.into_iter().collect();
    let mut quota: Vec<usize> = groups
        .iter()
        .map(|(_, m)| total * m.len() / n.max(1))
        .collect();
    let mut order: Vec<usize> = (0..groups.len()).collect();
    // Remainder of each share, compared exactly as integers: (total·m) mod n.
    order.sort_by_key(|&g| {
        let m = groups[g].1.len();
        (std::cmp::Reverse(total * m % n.max(1)), m, g)
    });
    // Fewer left than labels: each remainder is below one share.
    let left = total - quota.iter().sum::<usize>();
    for &g in order.iter().take(left) {
        quota[g] += 1;
    }
    for g in 0..groups.len() {
        if quota[g] == 0 && groups[g].1.len() >= 2 {
            let richest = (0..groups.len())
                .filter(|&h| quota[h] >= 2)
                .max_by_key(|&h| (quota[h], std::cmp::Reverse(h)));
            if let Some(h) = richest {
                quota[h] -= 1;
                quota[g] += 1;
            }
        }
    }
    let (mut train, mut held_out) = (vec![], vec![]);
    for ((_, members), q) in groups.iter().zip(quota) {
        let order = numpy_shuffled_indices(members.len(), seed);
        held_out.extend(order[..q].iter().map(|&j| members[j]));
        train.extend(order[q..].iter().map(|&j| members[j]));
    }
    train.sort_unstable();
    held_out.sort_unstable();
    Ok(Split { train, held_out })
}

/// The seed `mean_std_dataset.py` hard-codes (it ignores `meta.seed`).
pub const MEAN_STD_SEED: u32 = 42;

/// The images the mean/std stage averages over (`mean_std_dataset.py`):
/// `validation_split = 1 - fraction_for_mean_std_calc`,
/// `split = floor(validation_split * n)`, seed 42, subset = `indices[split:]`
/// (the *last* ≈ `fraction · n` indices of the shuffle). Note that
/// `SubsetRandomSampler` then visits them in a random order and
/// `drop_last=True` with `batch_size = len(subset) // 10` drops up to 9 of
/// them; that is the caller's business.
pub fn mean_std_subset(n: usize, fraction_for_mean_std_calc: f64) -> Result<Vec<usize>, DataError> {
    let split = python_split_point(n, fraction_for_mean_std_calc, "fraction_for_mean_std_calc")?;
    let mut indices = numpy_shuffled_indices(n, MEAN_STD_SEED);
    Ok(indices.split_off(split))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_group_split_keeps_groups_whole() {
        let groups: Vec<String> = (0..100).map(|i| format!("W{}", i % 7)).collect();
        let s = super::group_split(&groups, 0.8, 40).unwrap();
        assert_eq!(s.train.len() + s.held_out.len(), 100);
        assert!(s.held_out.len() >= 20, "{}", s.held_out.len());
        for &h in &s.held_out {
            assert!(
                s.train.iter().all(|&t| groups[t] != groups[h]),
                "{} on both sides",
                groups[h]
            );
        }
        assert_eq!(s, super::group_split(&groups, 0.8, 40).unwrap(), "seeded");
        // One group: nothing can be held out without emptying training.
        let one = vec!["W".to_string(); 5];
        assert_eq!(super::group_split(&one, 0.5, 1).unwrap().held_out.len(), 0);
    }

    use super::*;

    #[test]
    fn stratified_split_keeps_scdinos_count_and_every_class() {
        // 303 images of 4 unequal classes at 0.95: scDINO holds out 15 (floor(0.05·303)).
        let mut labels = vec![];
        for (name, count) in [("a", 200), ("b", 80), ("c", 20), ("d", 3)] {
            labels.extend(std::iter::repeat_n(name, count));
        }
        let s = stratified_split(&labels, 0.95, 40).unwrap();
        assert_eq!(s.held_out.len(), 15);
        assert_eq!(s.train.len() + s.held_out.len(), 303);
        let count = |l: &str| s.held_out.iter().filter(|&&i| labels[i] == l).count();
        // Shares 9.9, 3.96, 0.99, 0.15: floors 9, 3, 0, 0 and the three largest remainders
        // (c .99, b .96, a .90) one more each; d, with 3 images, takes one from a.
        assert_eq!(
            (count("a"), count("b"), count("c"), count("d")),
            (9, 4, 1, 1)
        );
        let mut all: Vec<usize> = s.train.iter().chain(&s.held_out).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..303).collect::<Vec<_>>());
        assert_eq!(s, stratified_split(&labels, 0.95, 40).unwrap());
        assert_ne!(s, stratified_split(&labels, 0.95, 41).unwrap());
        assert_eq!(
            train_heldout_split(303, 0.95, 40).unwrap().held_out.len(),
            15
        );
        assert!(stratified_split(&[], 0.8, 1).unwrap().held_out.is_empty());
        assert!(stratified_split(&["x"], 1.5, 1).is_err());
    }

    #[test]
    fn mt19937_reference_outputs() {
        // init_genrand(5489) — the reference implementation's default seed;
        // the 10000th output is 4123659995 (C++ std::mt19937 requirement).
        let mut mt = Mt19937::new(5489);
        assert_eq!(mt.next_u32(), 3_499_211_612);
        let mut last = 0;
        for _ in 1..10_000 {
            last = mt.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    #[test]
    fn numpy_reference_values() {
        // python: bg = np.random.MT19937(); bg._legacy_seeding(0); bg.random_raw(2)
        let mut mt = Mt19937::new(0);
        assert_eq!(mt.next_u32(), 2_357_136_044);
        assert_eq!(mt.next_u32(), 2_546_248_239);
        // np.random.seed(42); x = list(range(10)); np.random.shuffle(x)
        assert_eq!(
            numpy_shuffled_indices(10, 42),
            vec![8, 1, 5, 0, 7, 2, 9, 4, 3, 6]
        );
    }

    #[test]
    fn python_float_split_points() {
        let s = train_heldout_split(100, 0.8, 40).unwrap();
        assert_eq!((s.train.len(), s.held_out.len()), (81, 19));
        let s = train_heldout_split(113_564, 0.8, 40).unwrap();
        assert_eq!((s.train.len(), s.held_out.len()), (90_852, 22_712));
        assert_eq!(mean_std_subset(100, 0.2).unwrap().len(), 20);
        assert!(train_heldout_split(10, 1.5, 1).is_err());
        assert!(train_heldout_split(10, f64::NAN, 1).is_err());
        assert_eq!(
            train_heldout_split(0, 0.8, 1).unwrap(),
            Split {
                train: vec![],
                held_out: vec![]
            }
        );
    }

    #[test]
    fn split_is_a_partition() {
        let s = train_heldout_split(1000, 0.8, 7).unwrap();
        let mut all: Vec<usize> = s.train.iter().chain(&s.held_out).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn random_interval_64_bit_path_in_range() {
        let mut mt = Mt19937::new(1);
        for _ in 0..100 {
            assert!(mt.random_interval(5_000_000_000) <= 5_000_000_000);
        }
    }
}
