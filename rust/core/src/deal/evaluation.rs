//! Dealing bins for evaluation: every bin exactly once, no bin cut, dropped or repeated.
//!
//! Training deals make the bin count divide by the world size by cutting bins; an
//! evaluation pass keeps every bin whole instead and pads the last step with empty slots,
//! which the ranks run as empty micro-batches so that every rank takes part in the same
//! number of collectives. Bins are dealt costliest first (ties by increasing index),
//! `num_replicas` neighbours per step, so the ranks of one step run bins of about the same
//! cost and only the last step has empty slots. Nothing is random: the table is a pure
//! function of the packing and the options, the same on every rank.

use super::costs::{bin_costs, CostKind};
use super::steps::order_by_cost;
use super::DealOptions;
use crate::error::{Error, Result};
use crate::packing::Bins;

/// The bin of a slot where the rank runs an empty micro-batch.
pub const EMPTY_SLOT: i64 = -1;

/// The `(n_steps x num_replicas)` table of an evaluation pass over `bins`, row-major:
/// `table[s * num_replicas + r]` is the bin rank `r` runs at step `s`, or [`EMPTY_SLOT`].
///
/// Every bin appears exactly once; `n_steps = ceil(n_bins / num_replicas)`, and only the
/// last step holds empty slots (on its highest ranks). With a `balance` cost, bins go by
/// decreasing cost (ties by increasing index); without one, in packing order.
/// `pad_to_multiple_of` and `hidden_size` shape the costs as in training deals.
pub fn evaluation_table(
    bins: &Bins,
    num_replicas: usize,
    balance: Option<CostKind>,
    pad_to_multiple_of: u64,
    hidden_size: Option<u64>,
) -> Result<Vec<i64>> {
    let options = DealOptions {
        num_replicas,
        seed: 0,
        shuffle: false,
        balance,
        drop_last: false,
        pad_to_multiple_of,
        split_sequences: false,
        hidden_size,
    };
    options.validate()?;
    let packing = &bins.packing;
    let costs = bin_costs(
        &packing.bin_offsets,
        &packing.lengths,
        bins.kind,
        pad_to_multiple_of,
    );
    let (order, _) = order_by_cost(&costs, &[], &options);
    let n_steps = order.len().div_ceil(num_replicas);
    let slots = n_steps
        .checked_mul(num_replicas)
        .ok_or_else(|| Error::invalid("the evaluation table has more slots than fit in memory"))?;
    let mut table = Vec::with_capacity(slots);
    table.extend(order.iter().map(|&bin| i64::from(bin)));
    table.resize(slots, EMPTY_SLOT);
    Ok(table)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::packing::{batch_padded, pack, PackOptions, PackingKind};

    fn bins_of(lengths: &[i64], max_tokens: i64, algorithm: &str, padded: bool) -> Bins {
        let options = PackOptions::new(max_tokens, None, 1, "error", algorithm, 3).unwrap();
        let (packing, kind) = if padded {
            (
                batch_padded(lengths, &options).unwrap(),
                PackingKind::Padded,
            )
        } else {
            (pack(lengths, &options).unwrap(), PackingKind::Packed)
        };
        Bins::new(packing, &options, lengths.len(), kind)
    }

    #[test]
    fn fewer_bins_than_ranks_leave_ranks_with_one_empty_step() {
        let bins = bins_of(&[5, 5, 5], 6, "bfd", false);
        let table = evaluation_table(&bins, 5, Some(CostKind::Tokens), 1, None).unwrap();
        assert_eq!(table, vec![0, 1, 2, EMPTY_SLOT, EMPTY_SLOT]);
    }

    #[test]
    fn no_bins_give_no_steps() {
        let bins = bins_of(&[], 8, "bfd", false);
        let table = evaluation_table(&bins, 3, Some(CostKind::Attention), 1, None).unwrap();
        assert!(table.is_empty());
    }

    #[test]
    fn costliest_bins_come_first_ties_by_index() {
        // Bins [7, 1] and [3, 3]: attention 50 and 18.
        let bins = bins_of(&[7, 3, 3, 1], 8, "ffd", false);
        let costs = bin_costs(
            &bins.packing.bin_offsets,
            &bins.packing.lengths,
            bins.kind,
            1,
        );
        let table = evaluation_table(&bins, 2, Some(CostKind::Attention), 1, None).unwrap();
        let dealt: Vec<u64> = table
            .iter()
            .filter(|&&b| b != EMPTY_SLOT)
            .map(|&b| costs[b as usize].attention)
            .collect();
        assert!(dealt.windows(2).all(|pair| pair[0] >= pair[1]), "{dealt:?}");
    }

    #[test]
    fn invalid_options_are_refused() {
        let bins = bins_of(&[1, 2], 8, "bfd", false);
        assert!(evaluation_table(&bins, 0, None, 1, None).is_err());
        assert!(evaluation_table(&bins, 2, None, 0, None).is_err());
        assert!(evaluation_table(&bins, 2, Some(CostKind::Flops), 1, None).is_err());
        assert!(evaluation_table(&bins, 2, Some(CostKind::Flops), 1, Some(0)).is_err());
    }

    proptest! {
        #[test]
        fn every_sequence_exactly_once_and_padding_only_at_the_end(
            lengths in prop::collection::vec(0i64..40, 0..120),
            ranks in 1usize..9,
            balance in prop::option::of(prop_oneof![
                Just(CostKind::Tokens), Just(CostKind::Attention), Just(CostKind::Flops)
            ]),
            algorithm in prop_oneof![Just("bfd"), Just("ffd"), Just("next_fit")],
            padded in any::<bool>(),
        ) {
            let bins = bins_of(&lengths, 48, algorithm, padded);
            let table = evaluation_table(&bins, ranks, balance, 1, Some(16)).unwrap();
            let n_bins = bins.packing.n_bins();
            prop_assert_eq!(table.len(), n_bins.div_ceil(ranks) * ranks);
            // Empty slots only after the last bin.
            let first_empty = table.iter().position(|&b| b == EMPTY_SLOT).unwrap_or(table.len());
            prop_assert_eq!(first_empty, n_bins);
            prop_assert!(table[first_empty..].iter().all(|&b| b == EMPTY_SLOT));
            let mut seen = BTreeMap::new();
            for &bin in &table[..first_empty] {
                let range = bins.packing.bin_offsets[bin as usize] as usize
                    ..bins.packing.bin_offsets[bin as usize + 1] as usize;
                for &index in &bins.packing.indices[range] {
                    *seen.entry(index).or_insert(0) += 1;
                }
            }
            prop_assert_eq!(seen.len(), lengths.len());
            prop_assert!(seen.values().all(|&count| count == 1));
            // A pure function of its inputs.
            let again = evaluation_table(&bins, ranks, balance, 1, Some(16)).unwrap();
            prop_assert_eq!(table, again);
        }
    }
}
