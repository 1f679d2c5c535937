//! Batch-size schedules from arbitrary arguments (Megatron-LM's ramp and step schedule,
//! linear, piecewise): construction, `batch_at`, the per-step
//! table, grouping micro-batches into steps and Megatron's iteration count. Errors for bad
//! input; otherwise batches on the ramp's grid and never decreasing unless allowed, a
//! table whose every step is the schedule's batch at that point, in whole rounds of
//! micro-batches, within the token budget, and step groups that cover every round once.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tokenbatch_core::schedule::{group_into_steps, BatchUnit, Curve, RampBy, Schedule};
use tokenbatch_fuzz::Int;

/// Tables and ramps longer than this many steps are not built (their size, not their
/// correctness, would dominate the run).
const MAX_STEPS: u64 = 1 << 14;

#[derive(Debug, Arbitrary)]
enum Shape {
    Megatron {
        start: Int,
        increment: Int,
        ramp_samples: Int,
        global_batch: Int,
    },
    Linear {
        start: Int,
        end: Int,
        ramp_tokens: Int,
        by_steps: bool,
        multiple_of: Int,
    },
    Piecewise {
        pieces: Vec<(Int, Int)>,
        allow_decrease: bool,
    },
    /// Megatron-LM's step schedule: pieces keyed by consumed samples.
    MegatronSteps { pieces: Vec<(Int, Int)> },
}

#[derive(Debug, Arbitrary)]
struct Case {
    shape: Shape,
    sequences: bool,
    seq_len: Option<Int>,
    consumed: Vec<Int>,
    total_tokens: Int,
    micro_batch_tokens: Int,
    dp: Int,
    micro_batches: Vec<Int>,
    consumed_before: u32,
    train_samples: Int,
}

fn build(case: &Case) -> tokenbatch_core::Result<Schedule> {
    let unit = if case.sequences {
        BatchUnit::Sequences
    } else {
        BatchUnit::Tokens
    };
    let seq_len = case.seq_len.map(Int::get);
    match &case.shape {
        Shape::Megatron {
            start,
            increment,
            ramp_samples,
            global_batch,
        } => Schedule::megatron(
            start.get(),
            increment.get(),
            ramp_samples.get(),
            global_batch.get(),
            seq_len,
        ),
        Shape::Linear {
            start,
            end,
            ramp_tokens,
            by_steps,
            multiple_of,
        } => {
            let by = if *by_steps {
                RampBy::Steps
            } else {
                RampBy::Tokens
            };
            Schedule::linear(
                start.get(),
                end.get(),
                ramp_tokens.get(),
                unit,
                seq_len,
                by,
                multiple_of.get(),
            )
        }
        Shape::Piecewise {
            pieces,
            allow_decrease,
        } => {
            let (from, batches) = columns(pieces);
            Schedule::piecewise(&from, &batches, unit, seq_len, *allow_decrease)
        }
        Shape::MegatronSteps { pieces } => {
            let (from, batches) = columns(pieces);
            Schedule::megatron_steps(&from, &batches, seq_len)
        }
    }
}

/// The boundaries and the batches of `(from, batch)` pieces.
fn columns(pieces: &[(Int, Int)]) -> (Vec<i64>, Vec<i64>) {
    pieces
        .iter()
        .map(|&(from, batch)| (from.get(), batch.get()))
        .unzip()
}

fn check_batch_at(schedule: &Schedule, consumed: &[i64]) {
    let batches = match schedule.batch_at(consumed) {
        Ok(batches) => batches,
        Err(_) => {
            assert!(
                consumed.iter().any(|&c| c < 0),
                "refused non-negative amounts"
            );
            return;
        }
    };
    assert!(
        consumed.iter().all(|&c| c >= 0),
        "accepted a negative amount"
    );
    let curve = schedule.curve();
    let mut points: Vec<(i64, i64)> = consumed.iter().copied().zip(batches).collect();
    points.sort_unstable();
    for &(at, batch) in &points {
        assert!(
            batch >= 1 && batch as u64 <= curve.max_batch(),
            "batch {batch} at {at}"
        );
        let at = at as u64;
        match curve {
            Curve::Linear(ramp) => {
                assert_eq!(
                    batch as u64 % ramp.multiple_of,
                    0,
                    "batch {batch} off the grid"
                );
                if at == 0 {
                    assert_eq!(batch as u64, ramp.start);
                }
                if at >= ramp.ramp_tokens {
                    assert_eq!(batch as u64, ramp.end);
                }
            }
            Curve::Megatron(ramp) if at > ramp.ramp_samples => {
                assert_eq!(batch as u64, ramp.global_batch)
            }
            Curve::Piecewise(pieces) => {
                let piece = pieces
                    .from
                    .iter()
                    .rposition(|&from| from <= at)
                    .unwrap_or(0);
                assert_eq!(batch as u64, pieces.batches[piece]);
            }
            Curve::Megatron(_) => {}
        }
    }
    let may_decrease =
        matches!(curve, Curve::Piecewise(p) if p.batches.windows(2).any(|w| w[1] < w[0]));
    if !may_decrease {
        assert!(
            points.windows(2).all(|w| w[0].1 <= w[1].1),
            "the batch decreases: {points:?}"
        );
    }
}

fn check_table(schedule: &Schedule, total: i64, micro: i64, dp: i64) {
    let positive = |v: i64| u64::try_from(v).ok().filter(|&v| v > 0);
    let round = positive(micro)
        .zip(positive(dp))
        .and_then(|(m, d)| m.checked_mul(d));
    if round.is_some_and(|round| total.unsigned_abs() / round > MAX_STEPS) {
        return;
    }
    let Ok(table) = schedule.table(total, micro, dp) else {
        return;
    };
    let round = round.unwrap_or(0);
    assert!(
        round > 0 && total >= 0,
        "a table for total={total}, micro={micro}, dp={dp}"
    );
    let row_len = schedule.seq_len().unwrap_or(micro as u64);
    let mut consumed = 0u64;
    for step in 0..table.len() {
        let batch = table.batch_tokens[step] as u64;
        assert_eq!(
            schedule.batch_tokens_at(consumed).ok(),
            Some(batch),
            "step {step}"
        );
        assert!(
            batch > 0 && batch % round == 0,
            "step {step}: {batch} tokens"
        );
        assert_eq!(table.grad_accum_steps[step] as u64 * round, batch);
        assert_eq!(table.batch_sequences[step] as u64 * row_len, batch);
        consumed += batch;
        assert_eq!(table.consumed_tokens[step] as u64, consumed);
    }
    assert!(consumed <= total as u64);
    if let Ok(next) = schedule.batch_tokens_at(consumed) {
        assert!(
            next > total as u64 - consumed,
            "the table stops with a whole batch left"
        );
    }
}

fn check_grouping(schedule: &Schedule, micro_batches: &[i64], dp: i64, before: u64) {
    let Ok(offsets) = group_into_steps(micro_batches, schedule, dp, before) else {
        return;
    };
    let ranks = usize::try_from(dp).unwrap_or(0);
    assert!(
        ranks > 0 && micro_batches.len() % ranks == 0,
        "grouped with dp={dp}"
    );
    assert!(
        micro_batches.iter().all(|&t| t >= 0),
        "grouped negative micro-batches"
    );
    let rounds = (micro_batches.len() / ranks) as i64;
    assert_eq!(offsets.first(), Some(&0));
    assert_eq!(*offsets.last().unwrap_or(&0), rounds);
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]),
        "an empty step: {offsets:?}"
    );
}

fuzz_target!(|case: Case| {
    let Ok(schedule) = build(&case) else {
        return;
    };
    let consumed: Vec<i64> = case.consumed.iter().map(|c| c.get()).collect();
    check_batch_at(&schedule, &consumed);
    check_table(
        &schedule,
        case.total_tokens.get(),
        case.micro_batch_tokens.get(),
        case.dp.get(),
    );
    let micro_batches: Vec<i64> = case.micro_batches.iter().map(|m| m.get()).collect();
    check_grouping(
        &schedule,
        &micro_batches,
        case.dp.get(),
        u64::from(case.consumed_before),
    );
    if let Curve::Megatron(ramp) = schedule.curve() {
        if ramp.ramp_samples / ramp.start <= MAX_STEPS {
            let _ = ramp.train_iters(case.train_samples.get());
        }
    }
});
