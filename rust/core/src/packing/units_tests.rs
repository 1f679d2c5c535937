//! Property tests of atomic groups and several budgets.

use proptest::prelude::*;

use super::*;
use crate::error::Error;

/// Lengths with group ids: runs of 1 to 4 sequences, ids shuffled (distinct, unsorted).
fn grouped_input() -> impl Strategy<Value = (Vec<i64>, Vec<i64>)> {
    prop::collection::vec((1usize..5, prop::collection::vec(0i64..60, 4)), 0..80).prop_map(|runs| {
        let (mut lengths, mut groups) = (Vec::new(), Vec::new());
        for (r, (size, values)) in runs.into_iter().enumerate() {
            // Distinct ids that neither rise nor fall throughout.
            let id = (r as i64 * 7919) % 1009 - 500;
            for &value in &values[..size] {
                lengths.push(value);
                groups.push(id);
            }
        }
        (lengths, groups)
    })
}

/// Every kept group sits whole, in input order and consecutively, in one bin; every
/// sequence is placed at most once, and those left out are exactly the members of
/// groups over a budget. Returns the bin of each sequence.
fn check_groups(packing: &Packing, groups: &[i64], kept: &dyn Fn(usize) -> bool) {
    let n = groups.len();
    let mut bin_of = vec![None; n];
    let mut slot_of = vec![0usize; n];
    for bin in 0..packing.n_bins() {
        let (lo, hi) = (
            packing.bin_offsets[bin] as usize,
            packing.bin_offsets[bin + 1] as usize,
        );
        assert!(hi > lo, "bin {bin} is empty");
        for slot in lo..hi {
            let i = packing.indices[slot] as usize;
            assert!(bin_of[i].is_none(), "sequence {i} placed twice");
            bin_of[i] = Some(bin);
            slot_of[i] = slot;
        }
    }
    for i in 0..n {
        assert_eq!(bin_of[i].is_some(), kept(i), "sequence {i}");
        if i > 0 && groups[i] == groups[i - 1] && kept(i) {
            assert_eq!(bin_of[i], bin_of[i - 1], "group {} split", groups[i]);
            assert_eq!(
                slot_of[i],
                slot_of[i - 1] + 1,
                "group {} not in order",
                groups[i]
            );
        }
    }
}

/// The sum of `cost` over the members of the group of sequence `i`.
fn group_total(groups: &[i64], i: usize, cost: impl Fn(usize) -> u64) -> u64 {
    let (mut first, mut end) = (i, i + 1);
    while first > 0 && groups[first - 1] == groups[i] {
        first -= 1;
    }
    while end < groups.len() && groups[end] == groups[i] {
        end += 1;
    }
    (first..end).map(cost).sum()
}

proptest! {
    #[test]
    fn groups_stay_whole_in_order_and_within_budget(
        (lengths, groups) in grouped_input(),
        max_tokens in 1i64..150,
        max_seqs in prop::option::of(1i64..8),
        k in 1i64..4,
        algorithm in prop::sample::select(vec!["bfd", "ffd", "next_fit", "first_fit_shuffled"]),
    ) {
        prop_assume!(k <= max_tokens);
        let opts = PackOptions::new(max_tokens, max_seqs, k, "drop", algorithm, 3).unwrap();
        let cost = |i: usize| opts.cost(lengths[i] as u64);
        let fits = |i: usize| {
            group_total(&groups, i, cost) <= opts.max_tokens
                && group_total(&groups, i, |_| 1) <= opts.max_seqs
        };
        let packing = pack_grouped(&lengths, &groups, &opts).unwrap();
        check_groups(&packing, &groups, &fits);
        for (bin, w) in packing.bin_offsets.windows(2).enumerate() {
            let (lo, hi) = (w[0] as usize, w[1] as usize);
            let tokens: u64 = packing.indices[lo..hi].iter().map(|&i| cost(i as usize)).sum();
            prop_assert_eq!(packing.bin_tokens[bin] as u64, tokens);
            prop_assert!(tokens <= opts.max_tokens);
            prop_assert!((hi - lo) as u64 <= opts.max_seqs);
            for j in lo..hi {
                prop_assert_eq!(packing.lengths[j], lengths[packing.indices[j] as usize]);
            }
        }
        let dropped: u64 = (0..lengths.len()).filter(|&i| !fits(i)).count() as u64;
        prop_assert_eq!(packing.counts.dropped_seqs, dropped);
        prop_assert_eq!(&packing, &pack_grouped(&lengths, &groups, &opts).unwrap());

        // Padded batches: each costs members x longest, within the budget.
        let padded = batch_padded_grouped(&lengths, &groups, &opts).unwrap();
        let padded_fits = |i: usize| {
            let members = group_total(&groups, i, |_| 1);
            let longest = (0..lengths.len())
                .filter(|&j| groups[j] == groups[i])
                .map(cost)
                .max()
                .unwrap_or(0);
            members * longest <= opts.max_tokens && members <= opts.max_seqs
        };
        check_groups(&padded, &groups, &padded_fits);
        for (bin, w) in padded.bin_offsets.windows(2).enumerate() {
            let members = &padded.indices[w[0] as usize..w[1] as usize];
            let longest = members.iter().map(|&i| cost(i as usize)).max().unwrap_or(0);
            prop_assert_eq!(padded.bin_tokens[bin] as u64, members.len() as u64 * longest);
            prop_assert!(padded.bin_tokens[bin] as u64 <= opts.max_tokens);
            prop_assert!(members.len() as u64 <= opts.max_seqs);
        }
    }

    #[test]
    fn singleton_groups_pack_as_sequences(
        lengths in prop::collection::vec(0i64..60, 0..120),
        algorithm in prop::sample::select(vec!["bfd", "ffd", "next_fit", "first_fit_shuffled"]),
    ) {
        let opts = PackOptions::new(100, None, 1, "error", algorithm, 3).unwrap();
        let ids: Vec<i64> = (0..lengths.len() as i64).collect();
        prop_assert_eq!(pack_grouped(&lengths, &ids, &opts).unwrap(), pack(&lengths, &opts).unwrap());
    }

    #[test]
    fn every_column_of_every_bin_within_its_budget(
        rows in prop::collection::vec(prop::collection::vec(0i64..40, 3), 0..150),
        budgets in prop::collection::vec(1i64..100, 3),
        columns in 1usize..4,
        grouped in any::<bool>(),
        max_seqs in prop::option::of(1i64..6),
    ) {
        let n = rows.len();
        let costs: Vec<i64> = rows.iter().flat_map(|row| row[..columns].to_vec()).collect();
        let groups: Vec<i64> = (0..n as i64).map(|i| 50 - (i / 3) * ((i / 3) % 2 * 2 - 1)).collect();
        let groups = grouped.then_some(groups.as_slice());
        let max_costs = &budgets[..columns];
        let options = CostOptions { max_seqs, pad_to_multiple_of: 1, oversize: "drop" };
        let bins = pack_costs(&costs, columns, max_costs, groups, options).unwrap();
        let packing = &bins.packing;
        let ids: Vec<i64> = match groups {
            Some(ids) => ids.to_vec(),
            None => (0..n as i64).collect(),
        };
        let limit = max_seqs.map_or(u64::MAX, |m| m as u64);
        let fits = |i: usize| {
            (0..columns).all(|c| {
                group_total(&ids, i, |j| costs[j * columns + c] as u64) <= max_costs[c] as u64
            }) && group_total(&ids, i, |_| 1) <= limit
        };
        check_groups(packing, &ids, &fits);
        for w in packing.bin_offsets.windows(2) {
            let members = &packing.indices[w[0] as usize..w[1] as usize];
            prop_assert!(members.len() as u64 <= limit);
            for c in 0..columns {
                let total: i64 = members.iter().map(|&i| costs[i as usize * columns + c]).sum();
                prop_assert!(total <= max_costs[c], "column {} over budget", c);
            }
        }
        prop_assert!(packing.n_bins() as u64 >= bins.lower_bound);
    }
}

#[test]
fn bad_input_is_refused_by_name() {
    let opts = PackOptions::new(10, None, 1, "error", "bfd", 0).unwrap();
    let message = |result: crate::Result<Packing>| result.unwrap_err().to_string();
    assert!(message(pack_grouped(&[1i64, 2], &[0], &opts)).contains("groups has 1 ids for 2"));
    assert!(message(pack_grouped(&[1i64, 2, 3], &[4, 5, 4], &opts)).contains("sequences 0 and 2"));
    let over = pack_grouped(&[6i64, 6, 1], &[3, 3, 8], &opts).unwrap_err();
    assert!(matches!(over, Error::OversizeGroup(_)));
    assert!(over
        .to_string()
        .contains("group 3 (sequences 0 to 1, 2 sequences) costs 12 tokens"));
    let split = PackOptions::new(10, None, 1, "split", "bfd", 0).unwrap();
    assert!(message(pack_grouped(&[1i64], &[0], &split)).contains("oversize='split'"));
    assert!(message(pack_grouped(&[-1i64], &[0], &opts)).contains("lengths[0] = -1"));

    let options = CostOptions {
        max_seqs: None,
        pad_to_multiple_of: 1,
        oversize: "error",
    };
    let refuse = |costs: &[i64], columns, max_costs: &[i64], groups: Option<&[i64]>| {
        pack_costs(costs, columns, max_costs, groups, options)
            .unwrap_err()
            .to_string()
    };
    assert!(refuse(&[1, 2], 2, &[5], None).contains("2 columns but max_costs has 1"));
    assert!(refuse(&[1, 2], 2, &[5, 0], None).contains("max_costs[1] = 0"));
    assert!(refuse(&[1, -2], 2, &[5, 5], None).contains("costs[0, 1] = -2"));
    assert!(refuse(&[1; 9], 9, &[5; 9], None).contains("1 to 8 columns"));
    assert!(refuse(&[1, 2], 2, &[5, 5], Some(&[0, 1])).contains("groups has 2 ids for 1"));
    let over = refuse(&[1, 4, 1, 4], 2, &[5, 6], Some(&[2, 2]));
    assert!(
        over.contains("group 2 (sequences 0 to 1, 2 sequences) costs 8 in column 1"),
        "{over}"
    );
    let dropping = CostOptions {
        oversize: "drop",
        ..options
    };
    let bins = pack_costs(&[1, 4, 1, 4, 2, 2], 2, &[5, 6], Some(&[2, 2, 9]), dropping).unwrap();
    assert_eq!(bins.packing.indices, vec![2]);
    assert_eq!(bins.packing.counts.dropped_seqs, 2);
}

#[test]
fn costs_respect_the_scarce_column() {
    // Images are the scarce budget: 2 per bin, whatever room the tokens leave.
    let rows: Vec<[i64; 2]> = (0..10).map(|_| [10, 1]).collect();
    let costs: Vec<i64> = rows.concat();
    let options = CostOptions {
        max_seqs: None,
        pad_to_multiple_of: 8,
        oversize: "error",
    };
    let bins = pack_costs(&costs, 2, &[1000, 2], None, options).unwrap();
    assert_eq!(bins.packing.n_bins(), 5);
    assert_eq!(bins.lower_bound, 5);
    // Column 0 gives the lengths; the bin cost is rounded per sequence.
    assert_eq!(bins.packing.lengths, vec![10; 10]);
    assert_eq!(bins.packing.bin_tokens, vec![32; 5]);
}

#[test]
fn sequences_costing_only_tokens_fill_the_tightest_token_room_last() {
    // Rows 0 and 1 cost images and open a bin each (token room 5, then 3); the text row
    // comes after them whatever its size, and goes where its 3 tokens fit tightest.
    let options = CostOptions {
        max_seqs: None,
        pad_to_multiple_of: 1,
        oversize: "error",
    };
    let bins = pack_costs(&[5, 4, 7, 1, 3, 0], 2, &[10, 5], None, options).unwrap();
    let packing = &bins.packing;
    assert_eq!(packing.n_bins(), 2);
    let bin_of_row = |row: i64| {
        let at = packing.indices.iter().position(|&i| i == row).unwrap();
        packing
            .bin_offsets
            .iter()
            .rposition(|&o| o as usize <= at)
            .unwrap()
    };
    assert_eq!(bin_of_row(0), 0);
    assert_eq!(bin_of_row(1), 1);
    assert_eq!(bin_of_row(2), 1);
}
