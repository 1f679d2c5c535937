use proptest::prelude::*;

use super::*;
use crate::error::Error;

fn megatron(start: i64, inc: i64, ramp: i64, global: i64, seq_len: Option<i64>) -> Schedule {
    Schedule::megatron(start, inc, ramp, global, seq_len).unwrap()
}

fn linear(start: i64, end: i64, ramp: i64, by: RampBy, multiple_of: i64) -> Schedule {
    Schedule::linear(start, end, ramp, BatchUnit::Tokens, None, by, multiple_of).unwrap()
}

#[test]
fn megatron_matches_the_documented_example() {
    let schedule = megatron(32, 32, 1000, 1024, None);
    let consumed = [0, 32, 33, 64, 65, 500, 999, 1000, 1001];
    assert_eq!(
        schedule.batch_at(&consumed).unwrap(),
        vec![32, 32, 64, 64, 96, 512, 992, 1024, 1024]
    );
}

#[test]
fn megatron_constant_when_start_equals_global() {
    let schedule = megatron(64, 8, 0, 64, None);
    assert_eq!(
        schedule.batch_at(&[0, 10, 1 << 40]).unwrap(),
        vec![64, 64, 64]
    );
}

#[test]
fn megatron_refuses_what_megatron_asserts() {
    let undivided = Schedule::megatron(32, 30, 1000, 1024, None).unwrap_err();
    assert!(undivided
        .to_string()
        .contains("not a multiple of increment=30"));
    assert!(
        undivided.to_string().contains("1022 or 1052"),
        "{undivided}"
    );
    let decreasing = Schedule::megatron(64, 32, 1000, 32, None).unwrap_err();
    assert!(decreasing.to_string().contains("must not decrease"));
    assert!(Schedule::megatron(0, 32, 1000, 1024, None).is_err());
    assert!(Schedule::megatron(32, 0, 1000, 1024, None).is_err());
    assert!(Schedule::megatron(32, 32, -1, 1024, None).is_err());
    assert!(Schedule::megatron(32, 32, 0, 1024, None).is_err());
    assert!(Schedule::megatron(32, 32, 10, 1024, Some(0)).is_err());
    let Curve::Megatron(ramp) = megatron(32, 32, 1000, 1024, None).curve().clone() else {
        unreachable!()
    };
    assert!(ramp.train_iters(-1).is_err());
}

/// Megatron-LM's `update_train_iters`, transcribed with the batch calculator inline.
fn megatron_train_iters_reference(ramp: &MegatronRampup, train_samples: i64) -> i64 {
    let mut iterations = 0_i64;
    let mut consumed = 0_i64;
    while consumed <= ramp.ramp_samples as i64 {
        consumed += ramp.batch_at(consumed as u64) as i64;
        iterations += 1;
    }
    iterations + (train_samples - consumed).div_euclid(ramp.global_batch as i64)
}

#[test]
fn megatron_train_iters_counts_the_ramp_then_whole_batches() {
    let Curve::Megatron(ramp) = megatron(32, 32, 1000, 1024, None).curve().clone() else {
        unreachable!()
    };
    // Ramp: 32 (x2: 0, 32), then 64 at 64, 96 at 128, ... computed step by step.
    let mut consumed = 0_u64;
    let mut steps = 0_u64;
    while consumed <= 1000 {
        consumed += ramp.batch_at(consumed);
        steps += 1;
    }
    assert_eq!(ramp.train_iters(consumed as i64).unwrap(), steps);
    assert_eq!(
        ramp.train_iters(consumed as i64 + 1024 * 5 + 7).unwrap(),
        steps + 5
    );
    for train in [0_i64, 1, 500, 1000, 5000, 123_456] {
        assert_eq!(
            ramp.train_iters(train).unwrap() as i64,
            megatron_train_iters_reference(&ramp, train),
            "train_samples={train}"
        );
    }
}

#[test]
fn linear_ramp_by_tokens_hits_the_endpoints() {
    let schedule = linear(3072, 15360, 469_000, RampBy::Tokens, 1);
    assert_eq!(
        schedule
            .batch_at(&[0, 234_500, 468_999, 469_000, 10_000_000])
            .unwrap(),
        vec![3072, 9216, 15359, 15360, 15360]
    );
}

#[test]
fn linear_ramp_rounds_down_to_the_multiple() {
    let schedule = linear(64, 1024, 1000, RampBy::Tokens, 64);
    let batches = schedule.batch_at(&(0..1100).collect::<Vec<_>>()).unwrap();
    assert!(batches.iter().all(|b| b % 64 == 0));
    assert_eq!(batches[0], 64);
    assert_eq!(batches[999], 960);
    assert_eq!(batches[1000], 1024);
}

#[test]
fn linear_ramp_by_steps_grows_evenly_per_step() {
    let schedule = linear(1000, 10_000, 10_000_000, RampBy::Steps, 1);
    let table = schedule.table(10_000_000, 1, 1).unwrap();
    let ramp_steps: Vec<i64> = table
        .batch_tokens
        .iter()
        .zip(&table.consumed_tokens)
        .filter(|(_, &consumed)| consumed < 9_000_000)
        .map(|(&batch, _)| batch)
        .collect();
    let increments: Vec<i64> = ramp_steps.windows(2).map(|w| w[1] - w[0]).collect();
    let (lo, hi) = (
        increments.iter().min().unwrap(),
        increments.iter().max().unwrap(),
    );
    // Even growth per step: K ~ 2 R / (start + end) = 1818 steps, ~4.95 tokens per step.
    assert!(*lo >= 4 && *hi <= 6, "increments between {lo} and {hi}");
    let steps_in_ramp = table
        .consumed_tokens
        .iter()
        .filter(|&&c| c <= 10_000_000)
        .count();
    assert!((1810..=1830).contains(&steps_in_ramp), "{steps_in_ramp}");
}

#[test]
fn linear_ramp_refusals() {
    let err = |r: Result<Schedule>| r.unwrap_err().to_string();
    let s = |start, end, ramp, m| {
        Schedule::linear(start, end, ramp, BatchUnit::Tokens, None, RampBy::Tokens, m)
    };
    assert!(err(s(100, 50, 10, 1)).contains("must not decrease"));
    assert!(err(s(100, 1000, 0, 1)).contains("ramp_tokens must be > 0"));
    assert!(err(s(100, 1000, 10, 64)).contains("start=100 is not a multiple of multiple_of=64"));
    assert!(err(s(128, 1000, 10, 64)).contains("nearest valid end: 960 or 1024"));
    assert!(err(s(-1, 1000, 10, 1)).contains("start must be > 0"));
    assert!(err(s(8, 4096, 10, 4096)).contains("nearest valid start: 4096"));
}

#[test]
fn piecewise_llama3() {
    let schedule = Schedule::piecewise(
        &[0, 252_000_000, 2_870_000_000_000],
        &[4_000_000, 8_000_000, 16_000_000],
        BatchUnit::Tokens,
        None,
        false,
    )
    .unwrap();
    assert_eq!(
        schedule
            .batch_at(&[
                0,
                251_999_999,
                252_000_000,
                2_869_999_999_999,
                2_870_000_000_000
            ])
            .unwrap(),
        vec![4_000_000, 4_000_000, 8_000_000, 8_000_000, 16_000_000]
    );
}

#[test]
fn piecewise_refusals() {
    let p = |from: &[i64], b: &[i64], allow| {
        Schedule::piecewise(from, b, BatchUnit::Tokens, None, allow).map(|_| ())
    };
    assert!(p(&[], &[], false).is_err());
    assert!(p(&[5], &[1], false)
        .unwrap_err()
        .to_string()
        .contains("start at 0"));
    assert!(p(&[0, 0], &[1, 2], false)
        .unwrap_err()
        .to_string()
        .contains("must increase"));
    assert!(p(&[0, 5], &[2, 1], false)
        .unwrap_err()
        .to_string()
        .contains("decreases at piece 1"));
    assert!(p(&[0, 5], &[2, 1], true).is_ok());
    assert!(p(&[0, 5], &[2, 0], true).is_err());
    assert!(p(&[0, 5], &[2], true).is_err());
}

#[test]
fn megatron_steps_keys_by_samples_and_may_decrease() {
    // "0:768 250B:1536 500B:512" with --seq-length 4096: thresholds in samples.
    let schedule =
        Schedule::megatron_steps(&[0, 61_035_156, 122_070_312], &[768, 1536, 512], Some(4096))
            .unwrap();
    assert_eq!(schedule.key(), Key::Samples);
    assert_eq!(
        schedule
            .batch_at(&[0, 61_035_155, 61_035_156, 122_070_312, i64::MAX])
            .unwrap(),
        vec![768, 768, 1536, 512, 512]
    );
    // In tokens, the batch switches at whole samples: after 61,035,156 x 4096 tokens.
    assert_eq!(
        schedule.batch_tokens_at(61_035_156 * 4096 - 1).unwrap(),
        768 * 4096
    );
    assert_eq!(
        schedule.batch_tokens_at(61_035_156 * 4096).unwrap(),
        1536 * 4096
    );
    let error = schedule.batch_at(&[-1]).unwrap_err();
    assert_eq!(
        error,
        Error::invalid("consumed_samples[0] = -1 is negative")
    );
}

#[test]
fn megatron_steps_refusals_name_samples() {
    let err = |from: &[i64], b: &[i64]| {
        Schedule::megatron_steps(from, b, None)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&[5], &[1]).contains("start at 0 samples"));
    assert!(err(&[0, 0], &[1, 2]).contains("from_samples must increase"));
    assert!(err(&[0, 5], &[1, 0]).contains("batch of piece 1 must be > 0"));
    let unknown = Schedule::megatron_steps(&[0], &[8], None).unwrap();
    assert!(unknown
        .table(1 << 20, 4096, 1)
        .unwrap_err()
        .to_string()
        .contains("seq_len"));
}

#[test]
fn negative_consumed_is_refused() {
    let schedule = linear(1, 10, 10, RampBy::Tokens, 1);
    let error = schedule.batch_at(&[0, -3]).unwrap_err();
    assert_eq!(error, Error::invalid("tokens[1] = -3 is negative"));
}

#[test]
fn table_of_a_megatron_ramp_in_tokens() {
    let schedule = megatron(32, 32, 1000, 1024, Some(2048));
    // micro-batch of 4 sequences, dp=8: rounds of 32 sequences.
    let table = schedule.table(2048 * 100_000, 4 * 2048, 8).unwrap();
    // Consumed 0, 32, 64, 128 samples: 128 / (1000 / 31) = 3.97 increments.
    assert_eq!(table.batch_sequences[..4], [32, 32, 64, 128]);
    assert_eq!(table.grad_accum_steps[..4], [1, 1, 2, 4]);
    assert_eq!(*table.batch_sequences.last().unwrap(), 1024);
    let Curve::Megatron(ramp) = schedule.curve() else {
        unreachable!()
    };
    assert_eq!(table.len() as u64, ramp.train_iters(100_000).unwrap());
}

#[test]
fn table_needs_seq_len_for_sequences() {
    let schedule = megatron(32, 32, 1000, 1024, None);
    let error = schedule.table(1 << 30, 4096, 1).unwrap_err();
    assert!(error.to_string().contains("seq_len"));
}

#[test]
fn table_reports_undivided_batches() {
    let schedule = linear(1000, 4000, 100_000, RampBy::Tokens, 1);
    let error = schedule.table(1_000_000, 1000, 1).unwrap_err().to_string();
    assert!(error.starts_with("step 1 (after 1000 tokens)"), "{error}");
    assert!(error.contains("micro_batch_tokens x dp = 1000 x 1 = 1000"));
}

#[test]
fn table_refuses_bad_arguments() {
    let schedule = linear(1000, 4000, 100_000, RampBy::Tokens, 1000);
    assert!(schedule.table(-1, 1000, 1).is_err());
    assert!(schedule.table(10, 0, 1).is_err());
    assert!(schedule.table(10, 1000, 0).is_err());
    assert!(schedule.table(0, 1000, 1).unwrap().is_empty());
    let with_seq_len = Schedule::linear(
        1024,
        4096,
        10,
        BatchUnit::Tokens,
        Some(512),
        RampBy::Tokens,
        1024,
    )
    .unwrap();
    assert!(with_seq_len.table(1 << 20, 768, 1).is_err());
}

#[test]
fn table_step_limit() {
    let schedule = linear(1, 1, 1, RampBy::Tokens, 1);
    let error = schedule.table(i64::MAX, 1, 1).unwrap_err();
    assert!(error.to_string().contains("more than"));
}

#[test]
fn grouping_follows_the_target() {
    let schedule =
        Schedule::piecewise(&[0, 100], &[40, 100], BatchUnit::Tokens, None, false).unwrap();
    // dp=2, rounds of 10 + 10 = 20 tokens.
    let tokens = vec![10_i64; 2 * 12];
    let offsets = group_into_steps(&tokens, &schedule, 2, 0).unwrap();
    // Steps of 40 tokens (2 rounds) until 120 consumed, then 100 tokens (5 rounds).
    assert_eq!(offsets, vec![0, 2, 4, 6, 11, 12]);
}

#[test]
fn grouping_refusals() {
    let schedule = linear(10, 10, 1, RampBy::Tokens, 1);
    assert!(group_into_steps(&[1, 2, 3], &schedule, 2, 0).is_err());
    assert!(group_into_steps(&[1, -2], &schedule, 2, 0).is_err());
    assert!(group_into_steps(&[1, 2], &schedule, 0, 0).is_err());
    assert_eq!(group_into_steps(&[], &schedule, 4, 0).unwrap(), vec![0]);
}

fn reference_linear(start: u64, end: u64, ramp: u64, m: u64, t: u64) -> u64 {
    if t >= ramp {
        return end;
    }
    let exact = start as u128 + (end - start) as u128 * t as u128 / ramp as u128;
    (exact as u64 / m * m).max(start)
}

proptest! {
    #[test]
    fn megatron_is_monotone_on_the_grid_and_bounded(
        start in 1_i64..200, inc in 1_i64..50, n in 0_i64..40, ramp in 1_i64..100_000,
        points in proptest::collection::vec(0_i64..200_000, 1..50),
    ) {
        let global = start + inc * n;
        let schedule = megatron(start, inc, ramp, global, None);
        let mut sorted = points.clone();
        sorted.sort_unstable();
        let batches = schedule.batch_at(&sorted).unwrap();
        for (w, &b) in batches.windows(2).zip(&batches[1..]) {
            prop_assert!(w[0] <= w[1]);
            prop_assert!((b - start) % inc == 0);
        }
        for (&at, &b) in sorted.iter().zip(&batches) {
            prop_assert!(b >= start && b <= global);
            if at > ramp { prop_assert_eq!(b, global); }
            if n > 0 {
                // Megatron's float formula agrees with exact arithmetic away from ties.
                let exact = start + (at as i128 * n as i128 / ramp as i128) as i64 * inc;
                if at <= ramp && (at as i128 * n as i128) % ramp as i128 != 0 {
                    prop_assert_eq!(b, exact.min(global));
                }
            }
        }
    }

    #[test]
    fn linear_ramp_is_monotone_rounded_and_bounded(
        start_k in 1_u64..100, extra_k in 0_u64..100, m in 1_u64..64, ramp in 1_u64..1_000_000,
        points in proptest::collection::vec(0_u64..2_000_000, 1..50), by_steps: bool,
    ) {
        let (start, end) = (start_k * m, (start_k + extra_k) * m);
        let by = if by_steps { RampBy::Steps } else { RampBy::Tokens };
        let schedule = linear(start as i64, end as i64, ramp as i64, by, m as i64);
        let mut sorted: Vec<i64> = points.iter().map(|&p| p as i64).collect();
        sorted.sort_unstable();
        let batches = schedule.batch_at(&sorted).unwrap();
        for w in batches.windows(2) { prop_assert!(w[0] <= w[1]); }
        for (&t, &b) in sorted.iter().zip(&batches) {
            let b = b as u64;
            prop_assert!(b % m == 0 && b >= start && b <= end);
            if t as u64 >= ramp { prop_assert_eq!(b, end); }
            let by_tokens = reference_linear(start, end, ramp, m, t as u64);
            if by_steps {
                // sqrt(start^2 + (end^2 - start^2) f) >= start + (end - start) f (concavity).
                prop_assert!(b >= by_tokens);
            } else {
                prop_assert_eq!(b, by_tokens);
            }
        }
    }

    #[test]
    fn table_rows_are_consistent(
        start_k in 1_i64..20, extra_k in 0_i64..20, ramp in 1_i64..100_000,
        micro in 1_i64..64, dp in 1_i64..8, total in 0_i64..2_000_000, by_steps: bool,
    ) {
        let round = micro * dp;
        let by = if by_steps { RampBy::Steps } else { RampBy::Tokens };
        let schedule = linear(start_k * round, (start_k + extra_k) * round, ramp, by, round);
        let table = schedule.table(total, micro, dp).unwrap();
        let mut consumed = 0_i64;
        for step in 0..table.len() {
            let batch = table.batch_tokens[step];
            prop_assert_eq!(batch, schedule.batch_at(&[consumed]).unwrap()[0]);
            prop_assert_eq!(table.grad_accum_steps[step] * round, batch);
            prop_assert_eq!(table.batch_sequences[step] * micro, batch);
            consumed += batch;
            prop_assert_eq!(table.consumed_tokens[step], consumed);
        }
        prop_assert!(consumed <= total);
        prop_assert!(consumed + schedule.batch_at(&[consumed]).unwrap()[0] > total);
    }

    #[test]
    fn grouping_partitions_rounds_and_tracks_targets(
        tokens in proptest::collection::vec(0_i64..500, 0..300), dp in 1_usize..5,
        start in 1_i64..2000, extra in 0_i64..4000, ramp in 1_i64..50_000,
    ) {
        let usable = tokens.len() / dp * dp;
        let tokens = &tokens[..usable];
        let schedule = linear(start, start + extra, ramp, RampBy::Tokens, 1);
        let offsets = group_into_steps(tokens, &schedule, dp as i64, 0).unwrap();
        let rounds = (usable / dp) as i64;
        prop_assert_eq!(offsets[0], 0);
        prop_assert_eq!(*offsets.last().unwrap(), rounds);
        for w in offsets.windows(2) { prop_assert!(w[0] < w[1]); }
        let round_tokens: Vec<u64> =
            tokens.chunks_exact(dp).map(|c| c.iter().map(|&t| t as u64).sum()).collect();
        let mut consumed = 0_u64;
        let n_steps = offsets.len() - 1;
        for s in 0..n_steps {
            let (lo, hi) = (offsets[s] as usize, offsets[s + 1] as usize);
            let total: u64 = round_tokens[lo..hi].iter().sum();
            let target = schedule.batch_tokens_at(consumed).unwrap();
            // The last round was worth adding, and (except at the end) the next one was not.
            let without_last = total - round_tokens[hi - 1];
            if hi - lo > 1 {
                prop_assert!(without_last < target);
                prop_assert!(
                    total <= target || total.abs_diff(target) < without_last.abs_diff(target)
                );
            }
            if s + 1 < n_steps {
                let next = total + round_tokens[hi];
                prop_assert!(total >= target || next.abs_diff(target) >= total.abs_diff(target));
            }
            consumed += total;
        }
    }
}

#[test]
fn long_arrays_take_the_parallel_path_with_the_same_result() {
    let schedule = linear(1000, 9000, 1 << 20, RampBy::Steps, 8);
    let consumed: Vec<i64> = (0..200_000_i64).map(|i| i * 7).collect();
    let batches = schedule.batch_at(&consumed).unwrap();
    for (&at, &batch) in consumed.iter().zip(&batches) {
        assert_eq!(batch as u64, schedule.curve().batch_at(at as u64));
    }
    let mut negative = consumed.clone();
    negative[150_000] = -1;
    let error = schedule.batch_at(&negative).unwrap_err();
    assert_eq!(error, Error::invalid("tokens[150000] = -1 is negative"));
}
