//! The epoch dealer over packings from `pack`/`batch_padded` and over raw arrays that pass
//! `Bins::validate` (the unpickling path), with every option: errors instead of panics;
//! otherwise a bin count that divides by the ranks, every placed token of the packing in
//! exactly one dealt bin (at most one with `drop_last`, the rest counted as dropped), no
//! bin over the budget, epoch tables that deal every kept bin once and are the same when
//! dealt again, and `rest`, `deal_after`, `stats` and `step_costs` that hold up.
#![no_main]

use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tokenbatch_core::deal::{CostKind, DealOptions, Dealer, EpochDeal, Run};
use tokenbatch_core::packing::{Bins, Packing, PackingKind, PolicyCounts};
use tokenbatch_fuzz::packing::{screen, PackCase, MAX_SEGMENTS};
use tokenbatch_fuzz::{Count, Int};

#[derive(Debug, Arbitrary)]
enum Source {
    Packed {
        case: PackCase,
        padded: bool,
    },
    Raw {
        offsets: Vec<u8>,
        segments: Vec<(u8, Int, Int)>,
        max_tokens: u16,
        n_seqs: u8,
    },
}

#[derive(Debug, Arbitrary)]
struct Case {
    source: Source,
    num_replicas: Count,
    seed: u64,
    shuffle: bool,
    balance: Option<u8>,
    drop_last: bool,
    pad_to_multiple_of: u8,
    split_sequences: bool,
    hidden_size: Option<u16>,
    epoch: u64,
    runs: Vec<(u8, u8)>,
}

/// Bins from a real packing, or from arbitrary arrays when they pass validation.
fn bins(source: &Source) -> Option<Bins> {
    match source {
        Source::Packed { case, padded } => {
            let options = case.options()?;
            let lengths = case.lengths();
            if screen(&lengths, &options).ok()? > MAX_SEGMENTS {
                return None;
            }
            let packing = if *padded {
                tokenbatch_core::packing::batch_padded(&lengths, &options)
            } else {
                tokenbatch_core::packing::pack(&lengths, &options)
            }
            .ok()?;
            let kind = if *padded {
                PackingKind::Padded
            } else {
                PackingKind::Packed
            };
            Some(Bins::new(packing, &options, lengths.len(), kind))
        }
        Source::Raw {
            offsets,
            segments,
            max_tokens,
            n_seqs,
        } => {
            let mut bin_offsets = vec![0i64];
            for &step in offsets {
                bin_offsets.push(bin_offsets[bin_offsets.len() - 1] + i64::from(step % 4));
            }
            let n = *bin_offsets.last()? as usize;
            if segments.len() < n {
                return None;
            }
            let segments = &segments[..n];
            let bin_tokens = bin_offsets
                .windows(2)
                .map(|w| {
                    // Not validated (the costs are recomputed): any value will do.
                    segments[w[0] as usize..w[1] as usize]
                        .iter()
                        .fold(0i64, |total, s| total.wrapping_add(s.2.get()))
                })
                .collect();
            let bins = Bins {
                packing: Packing {
                    bin_offsets,
                    indices: segments.iter().map(|s| i64::from(s.0)).collect(),
                    starts: Some(segments.iter().map(|s| s.1.get()).collect()),
                    lengths: segments.iter().map(|s| s.2.get()).collect(),
                    bin_tokens,
                    counts: PolicyCounts::default(),
                    segment_cost: 0,
                },
                max_tokens: u64::from(*max_tokens),
                n_seqs: u64::from(*n_seqs),
                kind: PackingKind::Packed,
                lower_bound: 0,
                group_ids: None,
            };
            bins.validate().ok()?;
            Some(bins)
        }
    }
}

/// Token ranges `(sequence, start, end)` of the given bins' segments, sorted.
fn ranges(deal: &EpochDeal, bins: impl Iterator<Item = usize>) -> Vec<(i64, i64, i64)> {
    let deck = deal.deck();
    let mut out: Vec<(i64, i64, i64)> = bins
        .flat_map(|bin| deck.segment_range(bin))
        .map(|s| {
            (
                deck.indices()[s],
                deck.start(s),
                deck.start(s) + deck.lengths()[s],
            )
        })
        .filter(|r| r.2 > r.1)
        .collect();
    out.sort_unstable();
    out
}

/// Merge touching ranges of the same sequence, refusing overlaps (a token used twice).
fn union(ranges: &[(i64, i64, i64)]) -> Vec<(i64, i64, i64)> {
    let mut out: Vec<(i64, i64, i64)> = Vec::new();
    for &(sequence, start, end) in ranges {
        match out.last_mut() {
            Some(last) if last.0 == sequence && start < last.2 => panic!("a token placed twice"),
            Some(last) if last.0 == sequence && start == last.2 => last.2 = end,
            _ => out.push((sequence, start, end)),
        }
    }
    out
}

fn check_deal(deal: &EpochDeal, dealer: &Dealer, source: &Bins, drop_last: bool) {
    let deck = deal.deck();
    let n_bins = deck.bin_offsets().len() - 1;
    let replicas = deal.num_replicas();
    let steps = deal.steps();
    assert_eq!(steps.len(), deal.n_steps() * replicas);
    let mut dealt: Vec<usize> = steps.iter().map(|&b| b as usize).collect();
    dealt.sort_unstable();
    assert!(dealt.windows(2).all(|w| w[0] < w[1]), "a bin dealt twice");
    assert!(
        dealt.last().is_none_or(|&b| b < n_bins),
        "a bin past the deck"
    );
    let report = deck.report();
    assert_eq!(dealt.len() as u64 + report.dropped_bins, n_bins as u64);
    for &bin in &dealt {
        let tokens: i64 = deck.segment_range(bin).map(|s| deck.lengths()[s]).sum();
        assert!(
            tokens as u64 <= source.max_tokens,
            "bin {bin} over the budget"
        );
    }
    let placed = union(&ranges(deal, dealt.iter().copied()));
    let original = {
        let p = &source.packing;
        let mut r: Vec<(i64, i64, i64)> = (0..p.indices.len())
            .map(|s| (p.indices[s], p.start(s), p.start(s) + p.lengths[s]))
            .filter(|r| r.2 > r.1)
            .collect();
        r.sort_unstable();
        union(&r)
    };
    let dealt_tokens: u64 = placed.iter().map(|r| (r.2 - r.1) as u64).sum();
    if drop_last {
        assert_eq!(dealt_tokens + report.dropped_tokens, source.total_tokens());
    } else {
        assert_eq!(report.dropped_bins, 0);
        assert_eq!(
            placed, original,
            "the deal does not place every token exactly once"
        );
    }
    assert_eq!(
        dealer.deal(deal.epoch()).steps(),
        steps,
        "dealt twice, differently"
    );
    let _ = deal.stats();
    for kind in [CostKind::Tokens, CostKind::Attention, CostKind::Flops] {
        let costs = deal.step_costs(kind);
        let flops_without_h = kind == CostKind::Flops && deck.options().hidden_size.is_none();
        assert_eq!(costs.is_err(), flops_without_h);
    }
    for step in [0, deal.n_steps() / 2, deal.n_steps(), deal.n_steps() + 1] {
        let rest = deal.rest(step);
        assert_eq!(rest.is_err(), step > deal.n_steps());
        if let Ok(rest) = rest {
            assert_eq!(rest.validate(), Ok(()));
        }
    }
}

fuzz_target!(|case: Case| {
    let Some(source) = bins(&case.source) else {
        return;
    };
    let options = DealOptions {
        num_replicas: case.num_replicas.get().min(1 << 40) as usize,
        seed: case.seed,
        shuffle: case.shuffle,
        balance: case.balance.map(|b| match b % 3 {
            0 => CostKind::Tokens,
            1 => CostKind::Attention,
            _ => CostKind::Flops,
        }),
        drop_last: case.drop_last,
        pad_to_multiple_of: u64::from(case.pad_to_multiple_of),
        split_sequences: case.split_sequences,
        hidden_size: case.hidden_size.map(u64::from),
    };
    // Cutting sequences for millions of ranks is a matter of memory, not correctness.
    if options.split_sequences && options.num_replicas as u64 > source.total_tokens().max(1 << 12) {
        return;
    }
    let drop_last = options.drop_last;
    let source = Arc::new(source);
    let Ok(dealer) = Dealer::new(Arc::clone(&source), options) else {
        return;
    };
    let deal = dealer.deal(case.epoch);
    check_deal(&deal, &dealer, &source, drop_last);
    let runs: Vec<Run> = case
        .runs
        .iter()
        .take(3)
        .map(|&(replicas, steps)| Run {
            num_replicas: usize::from(replicas),
            steps: usize::from(steps),
        })
        .collect();
    if let Ok(resumed) = dealer.deal_after(case.epoch, &runs) {
        let n_bins = resumed.deck().bin_offsets().len() - 1;
        let mut dealt: Vec<i64> = resumed.steps().to_vec();
        dealt.sort_unstable();
        assert!(
            dealt.windows(2).all(|w| w[0] < w[1]),
            "a bin dealt twice after a resize"
        );
        assert!(dealt.last().is_none_or(|&b| (b as usize) < n_bins));
    }
});
