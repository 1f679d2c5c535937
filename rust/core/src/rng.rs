//! A tiny, fully specified pseudo-random generator.
//!
//! Determinism across machines, versions and ranks is a feature of tokenbatch, so the
//! generator is written out here (SplitMix64, Steele et al. 2014) instead of depending
//! on a crate whose stream could change between releases. The Python reference
//! implementation in `tokenbatch.reference` reproduces the same stream bit for bit.

/// SplitMix64: 64-bit state, passes BigCrush, trivially reproducible in any language.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..bound` (`bound > 0`), by Lemire's multiply-shift.
    ///
    /// The tiny bias of the plain multiply-shift (at most bound / 2^64) is irrelevant for
    /// shuffling and keeps the stream easy to reproduce.
    pub fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// Shuffle `items` in place (Fisher-Yates, from the back).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// Mix several integers into one seed, so `(seed, epoch)` pairs give unrelated streams.
pub fn mix_seed(parts: &[u64]) -> u64 {
    let mut rng = SplitMix64::new(0x5EED_0F70_4B3B_A7C4);
    let mut acc = rng.next_u64();
    for &part in parts {
        rng = SplitMix64::new(acc ^ part);
        acc = rng.next_u64();
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_stream() {
        // First outputs for seed 0 from the reference C implementation.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn below_stays_in_range() {
        let mut rng = SplitMix64::new(7);
        for bound in 1..200u64 {
            assert!(rng.below(bound) < bound);
        }
    }

    #[test]
    fn shuffle_is_a_permutation_and_seeded() {
        let mut a: Vec<u32> = (0..1000).collect();
        let mut b = a.clone();
        SplitMix64::new(3).shuffle(&mut a);
        SplitMix64::new(3).shuffle(&mut b);
        assert_eq!(a, b);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<u32>>());
        assert_ne!(a, sorted);
    }

    #[test]
    fn mix_seed_separates_epochs() {
        assert_ne!(mix_seed(&[0, 0]), mix_seed(&[0, 1]));
        assert_eq!(mix_seed(&[5, 9]), mix_seed(&[5, 9]));
    }
}
