//! A seeded uniform permutation of a source's sequences, with their lengths in its order.
//!
//! Every index goes to one of `2^bits` buckets by a hash of `(seed, index)`; the buckets
//! are laid out one after the other, each in index order, and each is then shuffled on its
//! own (Fisher-Yates, seeded by `(seed, bucket)`). The result is uniform (the multinomial
//! bucket sizes times the shuffles' orders sum to `1 / n!` for every permutation), and it
//! touches memory in a few sequential streams and cache-sized buckets: a sort by hash keys
//! followed by a gather of the lengths through the permutation cost a cache and TLB miss
//! per sequence, and took more than twice as long on 10M sequences.

use rayon::prelude::*;

use crate::buffers::with_capacity_huge;
use crate::rng::{mix_seed, SplitMix64};

/// Sequences per bucket aimed at: a bucket's indices and lengths (12 bytes each) stay
/// within a core's L2 cache while it is shuffled.
const BUCKET_TARGET: usize = 16_384;
/// At most `2^MAX_BITS` buckets, so that a bucket id fits a byte and the scatter writes
/// to few enough places at once to keep them in cache.
const MAX_BITS: u32 = 8;

/// A seeded random permutation of `0..values.len()` (at most `u32::MAX` items) and
/// `values` in its order; the same on every machine and at every thread count.
pub fn shuffled(values: &[i64], seed: u64) -> (Vec<u32>, Vec<i64>) {
    let n = values.len();
    let bits = (n / BUCKET_TARGET)
        .checked_ilog2()
        .map_or(0, |b| (b + 1).min(MAX_BITS));
    let bucket_of = |i: usize| -> u8 {
        if bits == 0 {
            return 0;
        }
        let hash =
            SplitMix64::new(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64();
        (hash >> (64 - bits)) as u8
    };
    let n_buckets = 1usize << bits;
    let mut buckets: Vec<u8> = with_capacity_huge(n);
    (0..n)
        .into_par_iter()
        .map(bucket_of)
        .collect_into_vec(&mut buckets);
    let mut starts = vec![0usize; n_buckets + 1];
    for &b in &buckets {
        starts[b as usize + 1] += 1;
    }
    for b in 0..n_buckets {
        starts[b + 1] += starts[b];
    }
    let mut order: Vec<u32> = with_capacity_huge(n);
    order.resize(n, 0);
    let mut ordered: Vec<i64> = with_capacity_huge(n);
    ordered.resize(n, 0);
    let mut next = starts.clone();
    for ((i, &b), &value) in buckets.iter().enumerate().zip(values) {
        let at = &mut next[b as usize];
        order[*at] = i as u32;
        ordered[*at] = value;
        *at += 1;
    }
    split_by(&mut order, &mut ordered, starts.iter().copied())
        .into_par_iter()
        .enumerate()
        .for_each(|(b, (order, ordered))| {
            let mut rng = SplitMix64::new(mix_seed(&[seed, b as u64]));
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
                ordered.swap(i, j);
            }
        });
    (order, ordered)
}

/// `order` and `ordered` cut at the same nondecreasing `bounds` (the first 0, the last
/// their length) into pairs of pieces.
fn split_by<'a>(
    mut order: &'a mut [u32],
    mut ordered: &'a mut [i64],
    bounds: impl Iterator<Item = usize>,
) -> Vec<(&'a mut [u32], &'a mut [i64])> {
    let mut pieces = Vec::new();
    let mut at = 0;
    for bound in bounds.skip(1) {
        let (head, tail) = std::mem::take(&mut order).split_at_mut(bound - at);
        let (head_values, tail_values) = std::mem::take(&mut ordered).split_at_mut(bound - at);
        pieces.push((head, head_values));
        (order, ordered, at) = (tail, tail_values, bound);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_once_with_its_value_and_a_new_order_per_seed() {
        for n in [0usize, 1, 5, 40_000, 300_000] {
            let values: Vec<i64> = (0..n as i64).map(|i| i * 3 + 1).collect();
            let (order, ordered) = shuffled(&values, 7);
            let mut seen = vec![false; n];
            for (&i, &v) in order.iter().zip(&ordered) {
                assert!(!std::mem::replace(&mut seen[i as usize], true));
                assert_eq!(v, values[i as usize]);
            }
            assert!(seen.iter().all(|&s| s));
            if n > 1_000 {
                let (other, _) = shuffled(&values, 8);
                assert_ne!(order, other);
                // Within the buckets too, the next place holds a larger index half the time.
                let ascents = order.windows(2).filter(|w| w[1] > w[0]).count() as f64;
                assert!(
                    (ascents / (n - 1) as f64 - 0.5).abs() < 0.01,
                    "{ascents} ascents of {n}"
                );
            }
        }
    }

    #[test]
    fn the_same_at_every_thread_count() {
        let values: Vec<i64> = (0..200_000).collect();
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let three = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        assert_eq!(
            one.install(|| shuffled(&values, 3)),
            three.install(|| shuffled(&values, 3))
        );
    }

    #[test]
    fn every_item_is_equally_likely_at_every_place() {
        // Chi-square of item x place counts over many seeds, on a size that uses several
        // buckets.
        let n = 4 * BUCKET_TARGET;
        let values: Vec<i64> = (0..n as i64).collect();
        let (places, rounds) = (8usize, 200u64);
        let mut counts = vec![0f64; places * places];
        for seed in 0..rounds {
            let (order, _) = shuffled(&values, seed);
            for (p, &i) in order.iter().enumerate() {
                counts[(i as usize * places / n) * places + p * places / n] += 1.0;
            }
        }
        let expected = (n as u64 * rounds) as f64 / (places * places) as f64;
        let chi2: f64 = counts
            .iter()
            .map(|&c| (c - expected).powi(2) / expected)
            .sum();
        // 63 degrees of freedom: the 99.9% quantile is about 103.
        assert!(chi2 < 103.0, "chi-square {chi2}");
    }
}
