use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::packing::{batch_padded, pack, Bins, PackOptions, Packing, PackingKind};

fn bins_of(
    lengths: &[i64],
    max_tokens: i64,
    oversize: &str,
    algorithm: &str,
    multiple: i64,
    padded: bool,
) -> Arc<Bins> {
    let options = PackOptions::new(max_tokens, None, multiple, oversize, algorithm, 11).unwrap();
    let (packing, kind) = if padded {
        (
            batch_padded(lengths, &options).unwrap(),
            PackingKind::Padded,
        )
    } else {
        (pack(lengths, &options).unwrap(), PackingKind::Packed)
    };
    Arc::new(Bins::new(packing, &options, lengths.len(), kind))
}

fn options(num_replicas: usize) -> DealOptions {
    DealOptions {
        num_replicas,
        ..DealOptions::default()
    }
}

/// Token ranges `(start, end)` of every sequence, as the segments of `bins` cover them.
fn coverage(
    indices: &[i64],
    start: impl Fn(usize) -> i64,
    lengths: &[i64],
    segments: impl IntoIterator<Item = usize>,
) -> BTreeMap<i64, Vec<(i64, i64)>> {
    let mut covered: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
    for j in segments {
        covered
            .entry(indices[j])
            .or_default()
            .push((start(j), start(j) + lengths[j]));
    }
    for ranges in covered.values_mut() {
        ranges.sort_unstable();
    }
    covered
}

/// Merge touching ranges, refusing overlaps (a token used twice).
fn merged(ranges: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = Vec::new();
    for &(lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if lo < last.1 => panic!("tokens {lo}..{} used twice", last.1.min(hi)),
            Some(last) if lo == last.1 && hi > lo => last.1 = hi,
            _ => out.push((lo, hi)),
        }
    }
    out
}

fn merged_coverage(covered: &BTreeMap<i64, Vec<(i64, i64)>>) -> BTreeMap<i64, Vec<(i64, i64)>> {
    covered.iter().map(|(&i, r)| (i, merged(r))).collect()
}

/// Segments of the bins `bins` of a deal's deck.
fn segments_of(deck: &Deck, bins: &[i64]) -> Vec<usize> {
    bins.iter()
        .flat_map(|&b| deck.segment_range(b as usize))
        .collect()
}

/// Every invariant of one deal: equal steps, each bin once, no bin empty or over budget,
/// and (unless `drop_last`) every token of the packing exactly once.
fn check_plan(bins: &Bins, deal: &EpochDeal, multiple: u64) {
    let deck = deal.deck();
    let ranks = deal.num_replicas();
    assert_eq!(deal.steps().len(), deal.n_steps() * ranks, "ragged table");
    let mut seen = vec![false; deck.bin_offsets().len() - 1];
    for &bin in deal.steps() {
        assert!(
            !std::mem::replace(&mut seen[bin as usize], true),
            "bin {bin} dealt twice"
        );
        let range = deck.segment_range(bin as usize);
        assert!(!range.is_empty(), "bin {bin} is empty");
        let lengths = &deck.lengths()[range];
        let padded = |l: i64| (l as u64).div_ceil(multiple) * multiple;
        let cost = match bins.kind {
            PackingKind::Packed => lengths.iter().map(|&l| padded(l)).sum::<u64>(),
            PackingKind::Padded => {
                lengths.iter().map(|&l| padded(l)).max().unwrap_or(0) * lengths.len() as u64
            }
        };
        assert!(
            cost <= bins.max_tokens,
            "bin {bin} costs {cost} > {}",
            bins.max_tokens
        );
    }
    let p = &bins.packing;
    let expected = merged_coverage(&coverage(
        &p.indices,
        |j| p.start(j),
        &p.lengths,
        0..p.indices.len(),
    ));
    let used = segments_of(deck, deal.steps());
    let got = merged_coverage(&coverage(
        deck.indices(),
        |j| deck.start(j),
        deck.lengths(),
        used,
    ));
    let report = deck.report();
    if report.dropped_bins == 0 {
        assert_eq!(
            got, expected,
            "the deal does not cover the packing's tokens exactly once"
        );
        assert_eq!(deal.total_real_tokens(), bins.total_tokens());
    } else {
        assert!(report.dropped_bins < ranks as u64);
        assert_eq!(
            deal.total_real_tokens() + report.dropped_tokens,
            bins.total_tokens()
        );
        for (index, ranges) in &got {
            for range in ranges {
                let whole = &expected[index];
                assert!(whole.iter().any(|w| w.0 <= range.0 && range.1 <= w.1));
            }
        }
    }
}

/// The most bins any cutting could make: a segment of `L` tokens gives at most `L` pieces.
fn most_bins(bins: &Bins, split: bool) -> u64 {
    let lengths = &bins.packing.lengths;
    if split {
        lengths.iter().map(|&l| (l as u64).max(1)).sum()
    } else {
        lengths.len() as u64
    }
}

fn arbitrary_options() -> impl Strategy<Value = DealOptions> {
    (
        1usize..10,
        any::<u64>(),
        any::<bool>(),
        prop_oneof![
            Just(None),
            Just(Some(CostKind::Attention)),
            Just(Some(CostKind::Tokens)),
            Just(Some(CostKind::Flops))
        ],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(num_replicas, seed, shuffle, balance, drop_last, split_sequences)| DealOptions {
                num_replicas,
                seed,
                shuffle,
                balance,
                drop_last,
                pad_to_multiple_of: 1,
                split_sequences,
                hidden_size: Some(64),
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_token_once_equal_steps_within_budget(
        lengths in prop::collection::vec(prop_oneof![0i64..40, 0i64..300], 0..120),
        max_tokens in 64i64..400,
        multiple in prop_oneof![Just(1i64), Just(2), Just(8)],
        padded in any::<bool>(),
        split in any::<bool>(),
        mut options in arbitrary_options(),
        epoch in 0u64..4,
    ) {
        let oversize = if split { "split" } else { "truncate" };
        let bins = bins_of(&lengths, max_tokens, oversize, "bfd", multiple, padded);
        options.pad_to_multiple_of = multiple as u64;
        let ranks = options.num_replicas as u64;
        let needed = (bins.n_bins() as u64).div_ceil(ranks) * ranks;
        match Dealer::new(Arc::clone(&bins), options.clone()) {
            Ok(dealer) => {
                let deal = dealer.deal(epoch);
                check_plan(&bins, &deal, multiple as u64);
                if !options.drop_last {
                    prop_assert_eq!(deal.n_steps() as u64 * ranks, needed);
                }
            }
            Err(error) => {
                prop_assert!(!options.drop_last, "drop_last never fails: {}", error);
                prop_assert!(error.to_string().contains("drop_last=True"));
                prop_assert!(most_bins(&bins, options.split_sequences) < needed);
            }
        }
    }

    #[test]
    fn resize_chains_use_every_token_once(
        lengths in prop::collection::vec(1i64..300, 1..150),
        first in 1usize..8,
        chain in prop::collection::vec((1usize..8, 0.0f64..1.0), 0..4),
        split in any::<bool>(),
        seed in any::<u64>(),
        epoch in 0u64..3,
    ) {
        let bins = bins_of(&lengths, 256, "split", "bfd", 1, false);
        let base = DealOptions { seed, split_sequences: split, ..options(first) };
        let Ok(mut dealer) = Dealer::new(Arc::clone(&bins), base.clone()) else {
            return Ok(());
        };
        let mut deal = dealer.deal(epoch);
        let mut runs: Vec<Run> = Vec::new();
        let mut used: Vec<(i64, i64, i64)> = Vec::new();
        for &(size, fraction) in &chain {
            let steps = (fraction * deal.n_steps() as f64) as usize;
            let deck = Arc::clone(deal.deck());
            let ran = &deal.steps()[..steps * deal.num_replicas()];
            used.extend(segments_of(&deck, ran).into_iter().map(|j| (deck.indices()[j], deck.start(j), deck.lengths()[j])));
            runs.push(Run { num_replicas: deal.num_replicas(), steps });
            dealer = Dealer::new(Arc::clone(&bins), DealOptions { num_replicas: size, ..base.clone() }).unwrap_or(dealer);
            match dealer.deal_after(epoch, &runs) {
                Ok(next) => deal = next,
                Err(error) => {
                    prop_assert!(error.to_string().contains("cannot be finished on"), "{}", error);
                    return Ok(());
                }
            }
            prop_assert_eq!(deal.num_replicas(), dealer.deck().options().num_replicas);
        }
        let deck = Arc::clone(deal.deck());
        used.extend(segments_of(&deck, deal.steps()).into_iter().map(|j| (deck.indices()[j], deck.start(j), deck.lengths()[j])));
        let (i, s, l): (Vec<i64>, Vec<i64>, Vec<i64>) = used.iter().fold((vec![], vec![], vec![]), |mut acc, &(i, s, l)| {
            acc.0.push(i); acc.1.push(s); acc.2.push(l); acc
        });
        let got = merged_coverage(&coverage(&i, |j| s[j], &l, 0..i.len()));
        let p = &bins.packing;
        let expected = merged_coverage(&coverage(&p.indices, |j| p.start(j), &p.lengths, 0..p.indices.len()));
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn steps_hold_neighbours_in_cost_order(
        lengths in prop::collection::vec(prop_oneof![1i64..20, Just(100), Just(7)], 1..200),
        ranks in 1usize..9,
        shuffle in any::<bool>(),
        seed in any::<u64>(),
    ) {
        // The balance: the bins of one step are neighbours in the order by cost, so that
        // no step holds a bin cheaper than one step's and one dearer than another's.
        let bins = bins_of(&lengths, 128, "error", "bfd", 1, false);
        let options = DealOptions { seed, shuffle, drop_last: true, ..options(ranks) };
        let deal = Dealer::new(bins, options).unwrap().deal(1);
        let costs = deal.step_costs(CostKind::Attention).unwrap();
        let mut ranges: Vec<(f64, f64)> = costs
            .chunks_exact(ranks)
            .map(|row| (row.iter().copied().fold(f64::INFINITY, f64::min), row.iter().copied().fold(0.0, f64::max)))
            .collect();
        ranges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        for pair in ranges.windows(2) {
            prop_assert!(pair[0].1 <= pair[1].0, "steps {:?} and {:?} interleave", pair[0], pair[1]);
        }
    }
}

#[test]
fn plans_do_not_depend_on_the_thread_count() {
    let lengths: Vec<i64> = (0..200_000).map(|i| (i * 7919 % 4000) + 1).collect();
    let bins = bins_of(&lengths, 8192, "error", "bfd", 1, false);
    let plan_with = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let dealer = Dealer::new(
                Arc::clone(&bins),
                DealOptions {
                    seed: 5,
                    ..options(7)
                },
            )
            .unwrap();
            let deal = dealer.deal(3);
            (deal.steps().to_vec(), deal.deck().bin_offsets().to_vec())
        })
    };
    let one = plan_with(1);
    assert_eq!(one, plan_with(2));
    assert_eq!(one, plan_with(4));
}

#[test]
fn equal_costs_are_ordered_by_index_and_shuffled_by_seed_alone() {
    let bins = bins_of(&[10; 64], 20, "error", "bfd", 1, false);
    let fixed = DealOptions {
        shuffle: false,
        ..options(4)
    };
    let deal = Dealer::new(Arc::clone(&bins), fixed).unwrap().deal(0);
    assert_eq!(deal.steps(), (0..32).collect::<Vec<i64>>());
    let shuffled = |seed| {
        Dealer::new(Arc::clone(&bins), DealOptions { seed, ..options(4) })
            .unwrap()
            .deal(2)
            .steps()
            .to_vec()
    };
    assert_eq!(shuffled(9), shuffled(9));
    assert_ne!(shuffled(9), shuffled(10));
}

#[test]
fn bins_are_cut_between_segments_into_equal_token_runs() {
    assert_eq!(divide::cut_points(&[1, 1, 1, 1], 2), vec![2]);
    assert_eq!(divide::cut_points(&[5, 1, 1, 1, 1, 1], 2), vec![1]);
    assert_eq!(divide::cut_points(&[1, 1, 1], 3), vec![1, 2]);
    assert_eq!(divide::cut_points(&[0, 0, 9], 2), vec![2]);
}

#[test]
fn drop_last_leaves_out_the_least_filled_bins_the_later_first() {
    // Bins of 30, 20, 20, 30 tokens on 3 ranks: one bin goes, the later of the two 20s.
    let bins = bins_of(&[30, 20, 20, 30], 30, "error", "next_fit", 1, false);
    let options = DealOptions {
        drop_last: true,
        ..options(3)
    };
    let deal = Dealer::new(bins, options).unwrap().deal(0);
    let report = deal.deck().report();
    assert_eq!(
        (
            report.dropped_bins,
            report.dropped_seqs,
            report.dropped_tokens
        ),
        (1, 1, 20)
    );
    let mut dealt = deal.steps().to_vec();
    dealt.sort_unstable();
    assert_eq!(dealt, vec![0, 1, 3]);
}

#[test]
fn sequences_are_cut_with_the_oversize_splitter_only_as_far_as_needed() {
    // Three full bins on two ranks: one sequence is cut, into a full piece and the rest.
    let bins = bins_of(&[64, 64, 64], 64, "error", "bfd", 1, false);
    let split = DealOptions {
        split_sequences: true,
        ..options(2)
    };
    let deal = Dealer::new(Arc::clone(&bins), split).unwrap().deal(0);
    assert_eq!(deal.deck().report().split_seqs, 1);
    assert_eq!(deal.n_steps(), 2);
    let deck = deal.deck();
    let pieces: Vec<(i64, i64)> = (0..deck.indices().len())
        .filter(|&j| deck.lengths()[j] < 64)
        .map(|j| (deck.start(j), deck.lengths()[j]))
        .collect();
    assert_eq!(pieces, vec![(0, 32), (32, 32)]);
    let error = Dealer::new(bins, options(2)).unwrap_err().to_string();
    assert!(
        error.contains("num_replicas=2") && error.contains("drop_last=True"),
        "{error}"
    );
}

#[test]
fn attention_counts_padded_lengths() {
    // pad_to_multiple_of=8: a 5-token document occupies, and attends over, 8 slots.
    let bins = bins_of(&[5, 13], 64, "error", "bfd", 8, false);
    let options = DealOptions {
        pad_to_multiple_of: 8,
        ..options(1)
    };
    let deal = Dealer::new(bins, options).unwrap().deal(0);
    assert_eq!(deal.step_costs(CostKind::Tokens).unwrap(), vec![24.0]);
    assert_eq!(
        deal.step_costs(CostKind::Attention).unwrap(),
        vec![(64 + 256) as f64]
    );
    assert_eq!(deal.real_tokens(), vec![18]);
}

#[test]
fn rest_keeps_the_bins_not_yet_run() {
    let lengths: Vec<i64> = (0..300).map(|i| i % 50 + 1).collect();
    let bins = bins_of(&lengths, 128, "error", "bfd", 1, false);
    let deal = Dealer::new(Arc::clone(&bins), options(3)).unwrap().deal(1);
    let rest = deal.rest(2).unwrap();
    assert_eq!(rest.n_bins(), (deal.n_steps() - 2) * 3);
    assert_eq!(rest.packing.counts.input_tokens, rest.total_tokens());
    assert_eq!(rest.lower_bound, rest.packing.segment_cost.div_ceil(128));
    rest.validate().unwrap();
    assert!(deal.rest(deal.n_steps() + 1).is_err());
}

#[test]
fn bad_options_are_refused() {
    let bins = bins_of(&[1, 2, 3], 8, "error", "bfd", 1, false);
    let flops = DealOptions {
        balance: Some(CostKind::Flops),
        hidden_size: None,
        ..options(1)
    };
    assert!(Dealer::new(Arc::clone(&bins), flops)
        .unwrap_err()
        .to_string()
        .contains("hidden_size"));
    assert!(Dealer::new(Arc::clone(&bins), options(0)).is_err());
    let deal = Dealer::new(bins, options(2)).unwrap().deal(0);
    assert!(deal.step_costs(CostKind::Flops).is_err());
    assert!(deal.check_rank(2).is_err() && deal.check_rank(-1).is_err());
}

#[test]
fn rebuilt_bins_without_a_budget_are_refused() {
    // Bins rebuilt from outside (an unpickled Packing) with max_tokens=0 passed validation,
    // and `rest` then divided by zero. Found by the `deal` fuzz target.
    let bins = Bins {
        packing: Packing {
            bin_offsets: vec![0],
            indices: vec![],
            starts: None,
            lengths: vec![],
            bin_tokens: vec![],
            counts: crate::packing::PolicyCounts::default(),
            segment_cost: 0,
        },
        max_tokens: 0,
        n_seqs: 0,
        kind: PackingKind::Packed,
        lower_bound: 0,
        group_ids: None,
    };
    assert!(bins
        .validate()
        .unwrap_err()
        .to_string()
        .contains("max_tokens"));
    let valid = Bins {
        max_tokens: 1,
        ..bins
    };
    valid.validate().unwrap();
    let deal = Dealer::new(Arc::new(valid), options(1)).unwrap().deal(0);
    assert_eq!(deal.rest(0).unwrap().n_bins(), 0);
}

#[test]
fn empty_rebuilt_bins_add_no_cutting_capacity() {
    // An empty bin counted -1 as u64 of capacity to cut: a u64 overflow, and a deal that
    // believed it could make any number of bins. Found by the `deal` fuzz target.
    let bins = Bins {
        packing: Packing {
            bin_offsets: vec![0, 0, 0, 2],
            indices: vec![0, 1],
            starts: Some(vec![0, 0]),
            lengths: vec![3, 4],
            bin_tokens: vec![0, 0, 7],
            counts: crate::packing::PolicyCounts::default(),
            segment_cost: 7,
        },
        max_tokens: 8,
        n_seqs: 2,
        kind: PackingKind::Packed,
        lower_bound: 1,
        group_ids: None,
    };
    bins.validate().unwrap();
    let error = Dealer::new(Arc::new(bins), options(1 << 40)).unwrap_err();
    assert!(error.to_string().contains("cannot give each"), "{error}");
}

/// Bins of `lengths` packed with atomic groups of the given sizes (ids 0, 1, ... in order).
fn grouped_bins(
    lengths: &[i64],
    sizes: &[usize],
    max_tokens: i64,
) -> Option<(Arc<Bins>, Vec<i64>)> {
    let ids: Vec<i64> = sizes
        .iter()
        .enumerate()
        .flat_map(|(id, &size)| std::iter::repeat_n(id as i64, size))
        .take(lengths.len())
        .collect();
    let options = PackOptions::new(max_tokens, None, 1, "error", "bfd", 0).ok()?;
    let packing = crate::packing::pack_grouped(lengths, &ids, &options).ok()?;
    let bins =
        Bins::new(packing, &options, lengths.len(), PackingKind::Packed).with_group_ids(&ids);
    Some((Arc::new(bins), ids))
}

/// Every group's members in one dealt bin, consecutive and in input order.
fn groups_whole(deck: &Deck, bins: &[i64], ids: &[i64]) -> std::result::Result<(), TestCaseError> {
    let mut bin_of: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for &bin in bins {
        let indices = &deck.indices()[deck.segment_range(bin as usize)];
        for (position, &index) in indices.iter().enumerate() {
            let id = ids[index as usize];
            if let Some(&(other_bin, last)) = bin_of.get(&id) {
                prop_assert_eq!(other_bin, bin, "group {} cut across bins", id);
                prop_assert_eq!(last + 1, index, "group {} out of order", id);
                prop_assert!(position > 0);
            }
            bin_of.insert(id, (bin, index));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn deals_and_resized_deals_never_cut_a_group(
        lengths in prop::collection::vec(0i64..60, 1..120),
        sizes in prop::collection::vec(1usize..4, 120),
        first in 1usize..7,
        second in 1usize..7,
        fraction in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let Some((bins, ids)) = grouped_bins(&lengths, &sizes, 128) else {
            return Ok(());
        };
        let base = DealOptions { seed, ..options(first) };
        let Ok(dealer) = Dealer::new(Arc::clone(&bins), base.clone()) else {
            return Ok(());
        };
        let deal = dealer.deal(1);
        check_plan(&bins, &deal, 1);
        groups_whole(deal.deck(), deal.steps(), &ids)?;
        let steps = (fraction * deal.n_steps() as f64) as usize;
        let runs = [Run { num_replicas: first, steps }];
        let Ok(resized) = Dealer::new(Arc::clone(&bins), DealOptions { num_replicas: second, ..base }) else {
            return Ok(());
        };
        if let Ok(rest) = resized.deal_after(1, &runs) {
            groups_whole(rest.deck(), rest.steps(), &ids)?;
        }
    }
}

#[test]
fn too_few_groups_for_the_ranks_are_refused_naming_groups() {
    // Two groups of two sequences, one bin: four ranks would need cuts inside groups.
    let (bins, _) = grouped_bins(&[5, 5, 5, 5], &[2, 2], 100).unwrap();
    let error = Dealer::new(Arc::clone(&bins), options(4))
        .unwrap_err()
        .to_string();
    assert!(error.contains("only between atomic groups"), "{error}");
    // Two ranks: the bin is cut between the groups.
    let deal = Dealer::new(bins, options(2)).unwrap().deal(0);
    assert_eq!(deal.deck().bin_offsets(), &[0, 2, 4]);
}
