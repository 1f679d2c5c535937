// Sources are indexed in step with their lengths, shares and caps.
#![allow(clippy::needless_range_loop)]

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::deal::DealOptions;
use crate::packing::{PackOptions, PackingKind};
use crate::schedule::{BatchUnit, Schedule};

fn constant(batch: i64) -> Schedule {
    Schedule::piecewise(&[0], &[batch], BatchUnit::Tokens, None, false).unwrap()
}

fn mixture(
    sources: &[Vec<i64>],
    shares: &[f64],
    max_repetition: &[i64],
    exhausted: Exhausted,
) -> Mixture {
    let names = (0..sources.len()).map(|s| format!("s{s}")).collect();
    let sizes: Vec<i64> = sources.iter().map(|s| s.len() as i64).collect();
    let schedule =
        ShareSchedule::new(&[0], shares, sources.len(), Interpolation::Constant).unwrap();
    Mixture::new(
        names,
        sources.concat(),
        &sizes,
        max_repetition,
        schedule,
        exhausted,
    )
    .unwrap()
}

fn pack_options(max_tokens: i64) -> PackOptions {
    PackOptions::new(max_tokens, None, 1, "error", "bfd", 0).unwrap()
}

fn deal_options(num_replicas: usize) -> DealOptions {
    DealOptions {
        num_replicas,
        seed: 5,
        ..DealOptions::default()
    }
}

/// Uses of every global index per source, from a composition.
fn uses(mixture: &Mixture, composition: &Composition) -> Vec<BTreeMap<u32, u64>> {
    let mut counts = vec![BTreeMap::new(); mixture.n_sources()];
    for take in &composition.steps {
        for (s, &(start, end)) in take.ranges.iter().enumerate() {
            let n = mixture.source_lengths(s).len() as u64;
            for position in start..end {
                let local = composition.orders[s][(position / n) as usize][(position % n) as usize];
                *counts[s].entry(local).or_insert(0) += 1;
            }
        }
    }
    counts
}

fn lengths_strategy() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(1i64..200, 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn each_source_near_its_quota_and_repetitions_exact(
        a in lengths_strategy(),
        b in lengths_strategy(),
        c in lengths_strategy(),
        raw in prop::collection::vec(1u32..10, 3),
        caps in prop::collection::vec(1i64..4, 3),
        renormalize in any::<bool>(),
        budget in 400i64..3000,
        epoch in 0u64..3,
    ) {
        let total: u32 = raw.iter().sum();
        let shares: Vec<f64> = raw.iter().map(|&r| f64::from(r) / f64::from(total)).collect();
        let exhausted = if renormalize { Exhausted::Renormalize } else { Exhausted::Stop };
        let sources = vec![a, b, c];
        let mix = mixture(&sources, &shares, &caps, exhausted);
        let options = pack_options(256);
        let composition = compose(&mix, &constant(budget), &options, 3, epoch, 0).unwrap();
        let counts = uses(&mix, &composition);
        for s in 0..3 {
            let n = sources[s].len() as u64;
            let used: u64 = counts[s].values().sum();
            let full = used / n;
            // Complete repetitions use every sequence once, the one begun a subset, and
            // no sequence is used more often than the cap allows.
            prop_assert!(full <= caps[s] as u64);
            for &k in counts[s].values() {
                prop_assert!(k == full || k == full + 1);
                prop_assert!(k <= caps[s] as u64);
            }
        }
        // Each step's tokens per source are within half the source's longest sequence of
        // its target (a joined last step: within a whole one).
        let n_steps = composition.steps.len();
        for (k, take) in composition.steps.iter().enumerate() {
            let slack = if k + 1 == n_steps { 1.0 } else { 0.5 };
            for s in 0..3 {
                let longest = *sources[s].iter().max().unwrap() as f64;
                prop_assert!(
                    (take.tokens[s] as f64 - take.targets[s]).abs() <= slack * longest + 1e-6,
                    "step {k} source {s}: {} tokens for a target of {}", take.tokens[s], take.targets[s]
                );
            }
        }
        if exhausted == Exhausted::Renormalize {
            // Every source with a share runs out before the pass ends.
            for s in 0..3 {
                let n = sources[s].len() as u64;
                prop_assert_eq!(counts[s].values().sum::<u64>(), n * caps[s] as u64);
            }
        } else {
            // Some source ran out, and every step but the last takes its quotas in full
            // share: the targets of every step are the shares.
            let ran_out = (0..3).any(|s| {
                counts[s].values().sum::<u64>() == sources[s].len() as u64 * caps[s] as u64
            });
            prop_assert!(ran_out);
            for take in &composition.steps {
                let sum: f64 = take.targets.iter().sum();
                for s in 0..3 {
                    prop_assert!((take.targets[s] / sum - shares[s]).abs() < 1e-9);
                }
            }
        }
    }

    #[test]
    fn plan_deals_every_composed_sequence_once_on_any_world_size(
        a in lengths_strategy(),
        b in lengths_strategy(),
        ranks in 1usize..5,
        budget in 2000i64..4000,
    ) {
        let sources = vec![a, b];
        let mix = mixture(&sources, &[0.6, 0.4], &[2, 3], Exhausted::Stop);
        let options = pack_options(256);
        let schedule = constant(budget);
        let composition = compose(&mix, &schedule, &options, 9, 1, 0).unwrap();
        let plan = plan(&mix, &schedule, &options, PackingKind::Packed, &DealOptions {
            num_replicas: ranks, seed: 9, ..DealOptions::default()
        }, 1, 0);
        let Ok(plan) = plan else {
            // Too few sequences in a step for this many ranks is refused, not hidden.
            return Ok(());
        };
        prop_assert_eq!(plan.step_offsets.len(), composition.steps.len() + 1);
        let deal = &plan.deal;
        let deck = deal.deck();
        for (k, take) in composition.steps.iter().enumerate() {
            let mut planned: Vec<i64> = Vec::new();
            for micro in plan.step_offsets[k] as usize..plan.step_offsets[k + 1] as usize {
                for rank in 0..ranks {
                    planned.extend_from_slice(&deck.indices()[deck.segment_range(deal.bin_at(micro, rank))]);
                }
            }
            let mut composed: Vec<i64> = Vec::new();
            for (s, &(start, end)) in take.ranges.iter().enumerate() {
                let n = sources[s].len() as u64;
                let offset = mix.offsets()[s] as i64;
                for p in start..end {
                    composed.push(offset + i64::from(composition.orders[s][(p / n) as usize][(p % n) as usize]));
                }
            }
            planned.sort_unstable();
            composed.sort_unstable();
            prop_assert_eq!(planned, composed);
            let tokens: i64 = plan.source_tokens[k * 2..k * 2 + 2].iter().sum();
            let dealt: i64 = deal.real_tokens()[plan.step_offsets[k] as usize * ranks
                ..plan.step_offsets[k + 1] as usize * ranks].iter().sum();
            prop_assert_eq!(tokens, dealt);
        }
    }
}

#[test]
fn plans_do_not_depend_on_the_thread_count() {
    let sources: Vec<Vec<i64>> = (0..3)
        .map(|s| (0..3000).map(|i| 1 + (i * 7919 + s * 31) % 900).collect())
        .collect();
    let mix = mixture(
        &sources,
        &[0.7, 0.2, 0.1],
        &[1, 2, 4],
        Exhausted::Renormalize,
    );
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let plan = plan(
                &mix,
                &constant(50_000),
                &pack_options(2048),
                PackingKind::Packed,
                &deal_options(4),
                2,
                0,
            )
            .unwrap();
            (
                plan.deal.steps().to_vec(),
                plan.deal.deck().indices().to_vec(),
                plan.step_offsets,
            )
        })
    };
    assert_eq!(run(1), run(4));
}

#[test]
fn shares_follow_the_schedule() {
    let schedule = ShareSchedule::new(
        &[0, 100, 300],
        &[1.0, 0.0, 0.5, 0.5, 0.0, 1.0],
        2,
        Interpolation::Linear,
    )
    .unwrap();
    assert_eq!(schedule.at(0), vec![1.0, 0.0]);
    assert_eq!(schedule.at(50), vec![0.75, 0.25]);
    assert_eq!(schedule.at(200), vec![0.25, 0.75]);
    assert_eq!(schedule.at(1000), vec![0.0, 1.0]);
    let constant = ShareSchedule::new(
        schedule
            .points()
            .iter()
            .map(|&p| p as i64)
            .collect::<Vec<_>>()
            .as_slice(),
        schedule.shares(),
        2,
        Interpolation::Constant,
    )
    .unwrap();
    assert_eq!(constant.at(99), vec![1.0, 0.0]);
    assert_eq!(constant.at(100), vec![0.5, 0.5]);
}

#[test]
fn bad_mixtures_are_refused_with_their_reason() {
    let share =
        |values: &[f64]| ShareSchedule::new(&[0], values, values.len(), Interpolation::Constant);
    let message = |result: Result<ShareSchedule>| result.unwrap_err().to_string();
    assert!(message(share(&[0.5, 0.4])).contains("sum to 1"));
    assert!(message(share(&[1.5, -0.5])).contains("non-negative"));
    assert!(message(ShareSchedule::new(&[5], &[1.0], 1, Interpolation::Constant)).contains("at 0"));
    let ok = share(&[0.5, 0.5]).unwrap();
    let build = |sizes: &[i64], caps: &[i64]| {
        Mixture::new(
            vec!["web".into(), "math".into()],
            vec![3; sizes.iter().sum::<i64>() as usize],
            sizes,
            caps,
            ok.clone(),
            Exhausted::Stop,
        )
        .unwrap_err()
        .to_string()
    };
    assert!(build(&[2, 0], &[1, 1]).contains("source 'math' has no sequences"));
    assert!(build(&[2, 2], &[1, 0]).contains("max_repetition of source 'math'"));
}

#[test]
fn a_step_too_small_for_any_sequence_is_refused() {
    let mix = mixture(
        &[vec![100; 10], vec![100; 10]],
        &[0.5, 0.5],
        &[1, 1],
        Exhausted::Stop,
    );
    let error = compose(&mix, &constant(60), &pack_options(256), 0, 0, 0).unwrap_err();
    assert!(error.to_string().contains("too small"), "{error}");
}

#[test]
fn oversize_sequences_are_named_by_source() {
    let mix = mixture(
        &[vec![10, 20], vec![30, 999]],
        &[0.5, 0.5],
        &[1, 1],
        Exhausted::Stop,
    );
    let error = plan(
        &mix,
        &constant(100),
        &pack_options(256),
        PackingKind::Packed,
        &deal_options(1),
        0,
        0,
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("sequence 1 of source 's1'"),
        "{error}"
    );
}

#[test]
fn split_sequences_are_placed_whole_across_the_joined_steps() {
    // One sequence of source 1 is split; the steps without it have no starts of their own.
    let mut long = vec![40; 30];
    long[7] = 700;
    let mix = mixture(
        &[vec![50; 40], long],
        &[0.5, 0.5],
        &[1, 1],
        Exhausted::Renormalize,
    );
    let options = PackOptions::new(256, None, 1, "split", "bfd", 0).unwrap();
    let result = plan(
        &mix,
        &constant(800),
        &options,
        PackingKind::Packed,
        &deal_options(2),
        0,
        0,
    )
    .unwrap();
    assert!(result.step_offsets.len() > 3);
    let deck = result.deal.deck();
    let packing = &deck.source().packing;
    let starts = packing
        .starts
        .as_ref()
        .expect("a split sequence gives starts");
    // Every token of every sequence placed once: pieces of a sequence tile it from 0.
    let mut pieces: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
    for j in 0..packing.indices.len() {
        pieces
            .entry(packing.indices[j])
            .or_default()
            .push((starts[j], packing.lengths[j]));
    }
    assert_eq!(pieces.len(), mix.lengths().len());
    for (&index, found) in &mut pieces {
        found.sort_unstable();
        let mut end = 0;
        for &(start, length) in found.iter() {
            assert_eq!(start, end, "sequence {index}: {found:?}");
            end += length;
        }
        assert_eq!(end, mix.lengths()[index as usize], "sequence {index}");
    }
    for b in 0..packing.n_bins() {
        let (first, last) = (
            packing.bin_offsets[b] as usize,
            packing.bin_offsets[b + 1] as usize,
        );
        assert!(packing.lengths[first..last].iter().sum::<i64>() <= 256);
    }
}
