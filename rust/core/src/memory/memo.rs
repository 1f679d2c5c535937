//! A small cache of values computed from a few fields of a configuration.
//!
//! The cells of a grid share few distinct values of most fields (a sweep over four `tp`
//! and three `recompute`, a list of layouts drawn from a handful of each), and much of an
//! estimate depends on a few fields only. A [`Memo`] keeps the value of each distinct key
//! it met, so that a grid computes it once per key instead of once per cell.

/// Slots of a [`Memo`]: a power of two, few enough to stay in the core's caches.
const SLOT_BITS: u32 = 8;
const SLOTS: usize = 1 << SLOT_BITS;

/// A direct-mapped cache of `V` by a key of `W` words (the bits of the fields it depends
/// on: equal bits, equal value). A key that meets another in its slot replaces it.
#[derive(Debug, Clone)]
pub(crate) struct Memo<const W: usize, V> {
    slots: Vec<Option<([u64; W], V)>>,
}

impl<const W: usize, V> Memo<W, V> {
    pub fn new() -> Self {
        Memo {
            slots: (0..SLOTS).map(|_| None).collect(),
        }
    }

    /// The value of `key`, computed by `compute` unless it is in its slot.
    #[inline(always)]
    pub fn get_or_insert_with(&mut self, key: [u64; W], compute: impl FnOnce() -> V) -> &V {
        let slot = &mut self.slots[slot_of(&key)];
        if slot.as_ref().is_some_and(|(held, _)| !same(held, &key)) {
            *slot = None;
        }
        &slot.get_or_insert_with(|| (key, compute())).1
    }
}

/// Whether two keys are equal: their words' differences or-ed together, which compiles
/// to a few vector instructions where `==` on arrays calls `memcmp`.
#[inline(always)]
fn same<const W: usize>(a: &[u64; W], b: &[u64; W]) -> bool {
    a.iter().zip(b).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The slot of a key: each word rotated by its own amount (the fields are mostly small
/// whole numbers, which differ in their exponent bits), summed, and mixed by a
/// multiplication whose top bits depend on every bit of the sum.
#[inline(always)]
fn slot_of<const W: usize>(key: &[u64; W]) -> usize {
    let sum = key.iter().enumerate().fold(0u64, |sum, (i, word)| {
        sum.wrapping_add(word.rotate_left(11 * i as u32))
    });
    (sum.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOT_BITS)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_stay_right_when_keys_share_slots() {
        // Four times more keys than slots, in rounds: whichever key holds a slot, every
        // look-up returns its own key's value.
        let mut memo: Memo<2, u64> = Memo::new();
        let mut computed = 0;
        for round in 0..3 {
            for key in 0..(4 * SLOTS as u64) {
                let value = *memo.get_or_insert_with([key, 7], || {
                    computed += 1;
                    key * 3
                });
                assert_eq!(value, key * 3, "round {round}");
            }
        }
        assert!(computed >= 4 * SLOTS, "{computed}");
    }

    #[test]
    fn a_key_held_is_not_computed_again() {
        let mut memo: Memo<3, f64> = Memo::new();
        let key = [2.0f64.to_bits(), 1.0f64.to_bits(), 0];
        assert_eq!(*memo.get_or_insert_with(key, || 1.5), 1.5);
        let mut computed = 0;
        for _ in 0..5 {
            let value = *memo.get_or_insert_with(key, || {
                computed += 1;
                0.0
            });
            assert_eq!(value, 1.5);
        }
        assert_eq!(computed, 0);
        // -0.0 and 0.0 are different keys: a key is its fields' bits.
        let negative = [2.0f64.to_bits(), 1.0f64.to_bits(), (-0.0f64).to_bits()];
        assert_eq!(*memo.get_or_insert_with(negative, || 2.5), 2.5);
    }

    #[test]
    fn small_whole_numbers_spread_over_the_slots() {
        // Keys like a sweep's: tp x recompute x sequence_parallel x seq_len, as f64 bits.
        let mut used = std::collections::HashSet::new();
        let mut keys = 0;
        for tp in [1.0f64, 2.0, 4.0, 8.0] {
            for recompute in [0.0f64, 1.0, 2.0] {
                for sp in [0.0f64, 1.0] {
                    for seq in [1024.0f64, 2048.0, 4096.0, 8192.0] {
                        used.insert(slot_of(&[
                            tp.to_bits(),
                            recompute.to_bits(),
                            sp.to_bits(),
                            seq.to_bits(),
                        ]));
                        keys += 1;
                    }
                }
            }
        }
        // 96 keys in 256 slots: a good spread leaves few sharing a slot.
        assert!(used.len() >= 75, "{} slots for {keys} keys", used.len());
    }
}
