use proptest::prelude::*;

use super::*;
use crate::error::Error;

fn options(
    max_tokens: i64,
    max_seqs: Option<i64>,
    k: i64,
    oversize: &str,
    algorithm: &str,
) -> PackOptions {
    PackOptions::new(max_tokens, max_seqs, k, oversize, algorithm, 7).unwrap()
}

/// Check every invariant of a packing of `input` and return nothing on success.
fn check_invariants(input: &[i64], packing: &Packing, opts: &PackOptions) {
    let n_bins = packing.n_bins();
    assert_eq!(packing.bin_offsets[0], 0);
    assert_eq!(
        *packing.bin_offsets.last().unwrap() as usize,
        packing.indices.len()
    );
    assert_eq!(packing.bin_tokens.len(), n_bins);
    for bin in 0..n_bins {
        let (lo, hi) = (
            packing.bin_offsets[bin] as usize,
            packing.bin_offsets[bin + 1] as usize,
        );
        assert!(hi > lo, "bin {bin} is empty");
        assert!(
            (hi - lo) as u64 <= opts.max_seqs,
            "bin {bin} holds too many segments"
        );
        let cost: u64 = packing.lengths[lo..hi]
            .iter()
            .map(|&l| opts.cost(l as u64))
            .sum();
        assert!(packing.bin_tokens[bin] as u64 >= cost);
        assert!(
            packing.bin_tokens[bin] as u64 <= opts.max_tokens,
            "bin {bin} over budget"
        );
    }
    // Token coverage: per sequence, the segments tile a prefix of it exactly once.
    let mut covered: Vec<Vec<(i64, i64)>> = vec![Vec::new(); input.len()];
    for s in 0..packing.indices.len() {
        covered[packing.indices[s] as usize].push((packing.start(s), packing.lengths[s]));
    }
    let capacity = opts.capacity() as i64;
    for (i, pieces) in covered.iter_mut().enumerate() {
        pieces.sort_unstable();
        let length = input[i];
        match opts.oversize {
            Oversize::Drop if length > capacity => assert!(pieces.is_empty()),
            Oversize::Truncate if length > capacity => assert_eq!(pieces, &vec![(0, capacity)]),
            Oversize::Split if length > capacity => {
                let mut next = 0;
                for &(start, len) in pieces.iter() {
                    assert_eq!(start, next);
                    assert!(len > 0 && len <= capacity);
                    next += len;
                }
                assert_eq!(next, length);
            }
            _ => assert_eq!(pieces, &vec![(0, length)], "sequence {i}"),
        }
    }
}

fn lower_bound_ratio(packing: &Packing, opts: &PackOptions) -> f64 {
    packing.n_bins() as f64 / packing.lower_bound(opts).max(1) as f64
}

#[test]
fn best_fit_fills_bins_exactly_when_possible() {
    let input = [6i64, 4, 5, 5, 3, 7];
    let opts = options(10, None, 1, "error", "bfd");
    let packing = pack(&input, &opts).unwrap();
    check_invariants(&input, &packing, &opts);
    assert_eq!(packing.n_bins(), 3);
    assert_eq!(packing.bin_tokens, vec![10, 10, 10]);
    // Decreasing order, ties by index: 7 then 3 fill bin 0; a bin lists input order.
    assert_eq!(packing.indices[..2], [4, 5]);
}

#[test]
fn next_fit_keeps_input_order() {
    let input = [3i64, 3, 3, 9, 1];
    let opts = options(10, None, 1, "error", "next_fit");
    let packing = pack(&input, &opts).unwrap();
    assert_eq!(packing.indices, vec![0, 1, 2, 3, 4]);
    assert_eq!(packing.bin_offsets, vec![0, 3, 5]);
}

#[test]
fn max_seqs_closes_bins() {
    let input = [1i64; 10];
    for algorithm in ["bfd", "ffd", "next_fit", "first_fit_shuffled"] {
        let opts = options(100, Some(3), 1, "error", algorithm);
        let packing = pack(&input, &opts).unwrap();
        check_invariants(&input, &packing, &opts);
        assert_eq!(packing.n_bins(), 4, "{algorithm}");
        assert_eq!(packing.lower_bound(&opts), 4);
    }
}

#[test]
fn oversize_policies() {
    let input = [25i64, 4, 10];
    let err = pack(&input, &options(10, None, 1, "error", "bfd")).unwrap_err();
    assert!(matches!(
        err,
        Error::Oversize {
            index: 0,
            length: 25,
            ..
        }
    ));
    assert!(err.to_string().contains("sequence 0 has 25 tokens"));

    let opts = options(10, None, 1, "truncate", "bfd");
    let packing = pack(&input, &opts).unwrap();
    check_invariants(&input, &packing, &opts);
    assert_eq!(packing.counts.truncated_tokens, 15);

    let opts = options(10, None, 1, "split", "bfd");
    let packing = pack(&input, &opts).unwrap();
    check_invariants(&input, &packing, &opts);
    assert_eq!(
        (packing.counts.split_seqs, packing.counts.split_pieces),
        (1, 3)
    );
    assert_eq!(packing.lengths.iter().sum::<i64>(), 39);

    let opts = options(10, None, 1, "drop", "bfd");
    let packing = pack(&input, &opts).unwrap();
    check_invariants(&input, &packing, &opts);
    assert_eq!(
        (packing.counts.dropped_seqs, packing.counts.dropped_tokens),
        (1, 25)
    );
}

#[test]
fn pad_to_multiple_lowers_the_capacity() {
    // max_tokens 10 with k=4: the longest segment that fits is 8 tokens.
    let err = pack(&[9i64], &options(10, None, 4, "error", "bfd")).unwrap_err();
    assert!(err.to_string().contains("at most 8"));
    let opts = options(10, None, 4, "split", "bfd");
    let packing = pack(&[9i64, 1], &opts).unwrap();
    check_invariants(&[9, 1], &packing, &opts);
    assert!(packing.bin_tokens.iter().all(|&t| t <= 10 && t % 4 == 0));
}

#[test]
fn bad_lengths_are_named() {
    let err = pack(&[3i64, -1], &options(10, None, 1, "error", "bfd")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "lengths[1] = -1 is negative; sequence lengths must be >= 0"
    );
    let err = pack(&[i64::MAX, 5], &options(10, None, 1, "truncate", "bfd")).unwrap_err();
    assert!(matches!(err, Error::Overflow(_)), "{err}");
    let err = pack(&[1i64 << 60], &options(1, None, 1, "split", "bfd")).unwrap_err();
    assert!(matches!(err, Error::Overflow(_)), "{err}");
}

#[test]
fn empty_and_zero_length_inputs() {
    let opts = options(10, Some(2), 1, "error", "bfd");
    let packing = pack::<i64>(&[], &opts).unwrap();
    assert_eq!(packing.bin_offsets, vec![0]);
    let input = [0i64, 0, 0, 10];
    let packing = pack(&input, &opts).unwrap();
    check_invariants(&input, &packing, &opts);
    assert_eq!(packing.n_bins(), 2);
}

#[test]
fn padded_batches_cost_count_times_longest() {
    let input = [5i64, 3, 2, 2, 9, 1];
    let opts = options(10, None, 1, "error", "bfd");
    let packing = batch_padded(&input, &opts).unwrap();
    check_invariants(&input, &packing, &opts);
    assert_eq!(packing.indices, vec![4, 0, 1, 2, 3, 5]);
    assert_eq!(packing.bin_offsets, vec![0, 1, 3, 6]);
    assert_eq!(packing.bin_tokens, vec![9, 10, 6]);
}

#[test]
fn large_budgets_use_the_ordered_index() {
    let input: Vec<i64> = (0..2000).map(|i| (i * 7919 % 50_000_000) + 1).collect();
    let opts = options(100_000_000, None, 1, "error", "bfd");
    let packing = pack(&input, &opts).unwrap();
    check_invariants(&input, &packing, &opts);
}

fn lengths_strategy() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(prop_oneof![0i64..40, 0i64..200], 0..300)
}

proptest! {
    #[test]
    fn every_algorithm_places_everything_once(
        input in lengths_strategy(),
        max_tokens in 1i64..120,
        max_seqs in prop::option::of(1i64..6),
        k in 1i64..5,
        oversize in prop::sample::select(vec!["truncate", "split", "drop"]),
        algorithm in prop::sample::select(vec!["bfd", "ffd", "next_fit", "first_fit_shuffled"]),
    ) {
        prop_assume!(k <= max_tokens);
        let opts = options(max_tokens, max_seqs, k, oversize, algorithm);
        let packing = pack(&input, &opts).unwrap();
        check_invariants(&input, &packing, &opts);
        prop_assert_eq!(&packing, &pack(&input, &opts).unwrap());
        // A packed bin costs exactly its segments' costs.
        for (bin, w) in packing.bin_offsets.windows(2).enumerate() {
            let cost: u64 = packing.lengths[w[0] as usize..w[1] as usize]
                .iter()
                .map(|&l| opts.cost(l as u64))
                .sum();
            prop_assert_eq!(packing.bin_tokens[bin] as u64, cost);
        }
        prop_assert_eq!(packing.segment_cost, packing.bin_tokens.iter().map(|&t| t as u64).sum::<u64>());
        let padded = batch_padded(&input, &opts).unwrap();
        check_invariants(&input, &padded, &opts);
    }

    #[test]
    fn any_fit_leaves_no_two_mergeable_bins(
        input in prop::collection::vec(0i64..=100, 1..400),
        algorithm in prop::sample::select(vec!["bfd", "ffd", "first_fit_shuffled"]),
    ) {
        // A later bin was opened only because its first segment fitted no earlier bin, and
        // bins only grow: so any two bins together exceed the budget.
        let opts = options(100, None, 1, "error", algorithm);
        let packing = pack(&input, &opts).unwrap();
        let mut tokens = packing.bin_tokens.clone();
        tokens.sort_unstable();
        if tokens.len() >= 2 {
            prop_assert!(tokens[0] + tokens[1] > 100, "{:?}", &tokens[..2]);
        }
        prop_assert!(lower_bound_ratio(&packing, &opts) < 2.0 || packing.n_bins() <= 2);
    }
}

/// Runs of equal costs in decreasing order, as the by-cost order produces them.
fn runs_strategy() -> impl Strategy<Value = Vec<(u64, u32)>> {
    prop::collection::btree_map(0u64..=60, 1u32..40, 0..25)
        .prop_map(|runs| runs.into_iter().rev().collect())
}

proptest! {
    #[test]
    fn run_based_fits_match_one_at_a_time_fits(
        runs in runs_strategy(),
        max_seqs in prop::option::of(1i64..6),
        algorithm in prop::sample::select(vec!["bfd", "ffd"]),
    ) {
        let opts = options(60, max_seqs, 1, "error", algorithm);
        let n: usize = runs.iter().map(|&(_, count)| count as usize).sum();
        let costs = || runs.iter().flat_map(|&(cost, count)| std::iter::repeat_n(cost, count as usize));
        let (bulk, single) = if algorithm == "bfd" {
            let index = || assign::best_fit_index(n, &opts);
            (
                assign::best_fit_runs(index(), &runs, n, &opts),
                assign::best_fit(index(), costs(), n, &opts),
            )
        } else {
            (assign::first_fit_runs(&runs, n, &opts), assign::first_fit(costs(), n, &opts))
        };
        prop_assert_eq!(bulk.bin_of, single.bin_of);
        prop_assert_eq!(bulk.bins, single.bins);
    }
}

#[test]
fn equal_costs_keep_input_order_above_the_counting_sort_range() {
    // A budget beyond the counting sort's keys takes the comparison sort. With a multiple,
    // lengths 131, 33,667 and 33,282 all cost one multiple: they must be offered by index
    // (the documented order), not by raw length. Found by the `batch_padded` fuzz target.
    let opts = PackOptions::new(2_204_803_583, Some(30), 1_090_536_703, "error", "bfd", 0).unwrap();
    let input = [131i64, 33_667, 0, 33_282];
    let padded = batch_padded(&input, &opts).unwrap();
    assert_eq!(padded.bin_offsets, vec![0, 2, 4]);
    assert_eq!(padded.indices, vec![0, 1, 2, 3]);
    let input = [131i64, 33_667, 33_282];
    let opts = PackOptions::new(2_204_803_583, None, 1_090_536_703, "error", "ffd", 0).unwrap();
    assert_eq!(pack(&input, &opts).unwrap().indices, vec![0, 1, 2]);
}

/// The packing of `lengths` with the offer order `order` makes of its segments.
fn pack_in_order(
    lengths: &[i64],
    opts: &PackOptions,
    order: fn(&segments::Segments, &PackOptions) -> OfferOrder,
) -> Packing {
    let segments = segments::segment(lengths, opts).unwrap();
    let order = order(&segments, opts);
    let (assignment, outputs) =
        with_outputs(segments.output_shape(), || order.assign(&segments, opts));
    finish(segments, &order, assignment, opts, None, outputs)
}

#[test]
fn a_large_budget_costs_time_and_memory_of_the_input_not_the_budget() {
    // The dense index and the counting sort would need hundreds of megabytes here; the
    // sparse ones hold a handful of entries. Both checked for equal results below.
    let opts = options(16_777_216, None, 1, "error", "bfd");
    assert!(matches!(
        assign::best_fit_index(3, &opts),
        capacity_index::BestFitIndex::Ordered(_)
    ));
    let segments = segments::segment(&[5i64, 7, 9], &opts).unwrap();
    assert!(matches!(
        OfferOrder::decreasing_cost(&segments, &opts),
        OfferOrder::Permutation(_)
    ));
    let packing = pack(&[5i64, 7, 9], &opts).unwrap();
    assert_eq!(packing.bin_offsets, vec![0, 3]);
    // Many segments under an ordinary budget keep the dense structures.
    let opts = options(8192, None, 1, "error", "bfd");
    assert!(matches!(
        assign::best_fit_index(100_000, &opts),
        capacity_index::BestFitIndex::Buckets { .. }
    ));
}

proptest! {
    #[test]
    fn dense_and_sparse_best_fit_indexes_give_the_same_bins(
        costs in prop::collection::vec(0u64..=300, 0..300),
        max_seqs in prop::option::of(1i64..6),
    ) {
        let opts = options(300, max_seqs, 1, "error", "bfd");
        let n = costs.len();
        let dense = assign::best_fit(
            capacity_index::BestFitIndex::dense(300), costs.iter().copied(), n, &opts);
        let sparse = assign::best_fit(
            capacity_index::BestFitIndex::sparse(), costs.iter().copied(), n, &opts);
        prop_assert_eq!(&dense.bin_of, &sparse.bin_of);
        prop_assert_eq!(&dense.bins, &sparse.bins);
        let mut runs: Vec<(u64, u32)> = Vec::new();
        let mut sorted = costs.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        for cost in sorted {
            match runs.last_mut() {
                Some((last, count)) if *last == cost => *count += 1,
                _ => runs.push((cost, 1)),
            }
        }
        let dense = assign::best_fit_runs(capacity_index::BestFitIndex::dense(300), &runs, n, &opts);
        let sparse = assign::best_fit_runs(capacity_index::BestFitIndex::sparse(), &runs, n, &opts);
        prop_assert_eq!(dense.bin_of, sparse.bin_of);
        prop_assert_eq!(dense.bins, sparse.bins);
    }

    #[test]
    fn counting_and_comparison_orders_give_the_same_packing(
        input in prop::collection::vec(prop_oneof![0i64..40, 0i64..3000], 0..300),
        max_tokens in 1i64..3000,
        max_seqs in prop::option::of(1i64..6),
        k in 1i64..9,
        oversize in prop::sample::select(vec!["truncate", "split", "drop"]),
        algorithm in prop::sample::select(vec!["bfd", "ffd"]),
    ) {
        prop_assume!(k <= max_tokens);
        let opts = options(max_tokens, max_seqs, k, oversize, algorithm);
        let counted = pack_in_order(&input, &opts, OfferOrder::decreasing_cost_by_counting);
        let compared = pack_in_order(&input, &opts, OfferOrder::decreasing_cost_by_comparison);
        check_invariants(&input, &counted, &opts);
        prop_assert_eq!(&counted, &compared);
        prop_assert_eq!(&counted, &pack(&input, &opts).unwrap());
    }
}

#[test]
fn bins_whose_segments_share_a_token_are_refused() {
    // Rebuilt bins (an unpickled packing) with two segments over the same tokens passed
    // validation, and a deal dealt those tokens twice. Found by the `deal` fuzz target.
    let bins = |indices: Vec<i64>, starts: Vec<i64>, lengths: Vec<i64>| {
        let n = indices.len() as i64;
        Bins {
            packing: Packing {
                bin_offsets: vec![0, n],
                indices,
                starts: Some(starts),
                lengths,
                bin_tokens: vec![0],
                counts: PolicyCounts::default(),
                segment_cost: 0,
            },
            max_tokens: 65_406,
            n_seqs: 142,
            kind: PackingKind::Packed,
            lower_bound: 0,
            group_ids: None,
        }
    };
    let refused = |b: Bins| b.validate().unwrap_err().to_string();
    // The fuzz target's case: pieces of sequence 131 at the same start.
    let error = refused(bins(vec![131, 131], vec![131, 131], vec![33_725, 27]));
    assert!(
        error.contains("segments 0 and 1 both hold tokens of sequence 131"),
        "{error}"
    );
    // A piece that runs into the next one; a sequence placed whole twice (the unsplit path).
    assert!(
        refused(bins(vec![5, 7, 5], vec![10, 0, 0], vec![4, 3, 11])).contains("segments 0 and 2")
    );
    assert!(refused(bins(vec![5, 7, 5], vec![0, 0, 0], vec![4, 3, 4])).contains("segments 0 and 2"));
    // Pieces that touch, and empty segments, are fine.
    bins(vec![5, 5, 7, 7], vec![0, 4, 0, 0], vec![4, 9, 3, 0])
        .validate()
        .unwrap();
    bins(vec![5, 7, 7], vec![0, 0, 0], vec![4, 3, 0])
        .validate()
        .unwrap();
}

#[test]
fn rebuilt_bins_over_their_budget_are_refused() {
    // Rebuilt bins (an unpickled packing) whose segments each fit the budget but not
    // together passed validation, and a deal dealt a bin over it. Found by the `deal`
    // fuzz target: three segments of 73, 73 and 34,952 tokens in one bin of 34,952.
    let bins = |lengths: Vec<i64>| Bins {
        packing: Packing {
            bin_offsets: vec![0, 3],
            indices: vec![73, 61, 73],
            starts: Some(vec![0, 73, 136]),
            lengths,
            bin_tokens: vec![0],
            counts: PolicyCounts::default(),
            segment_cost: 0,
        },
        max_tokens: 34_952,
        n_seqs: 136,
        kind: PackingKind::Packed,
        lower_bound: 0,
        group_ids: None,
    };
    let error = bins(vec![73, 73, 34_952])
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("bin 0 holds 35098 tokens, more than max_tokens=34952"),
        "{error}"
    );
    // Exactly the budget is fine, and so are huge lengths that overflow a sum in i64.
    bins(vec![73, 73, 34_806]).validate().unwrap();
    let huge = Bins {
        max_tokens: i64::MAX as u64,
        ..bins(vec![i64::MAX, i64::MAX, 0])
    };
    assert!(huge
        .validate()
        .unwrap_err()
        .to_string()
        .contains("more than"));
}
