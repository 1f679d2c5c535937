"""Batch-size schedules, token arithmetic, step tables and learning rates keyed to tokens."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenbatch
from tokenbatch.errors import InvalidTypeError, InvalidValueError, TokenBatchOverflowError
from tokenbatch.schedule import (
    BatchScaledLR,
    ConstantLR,
    CosineLR,
    LinearRamp,
    MegatronRampup,
    Piecewise,
    WarmupStableDecayLR,
    deepseek_v3_ramp,
    gpt3_ramp,
    grad_accum_steps,
    group_into_steps,
    llama3_405b_schedule,
    rescale_lr,
    sequences_per_step,
    steps_for_tokens,
    tokens_for_steps,
    tokens_per_step,
)

# -- token arithmetic ----------------------------------------------------------------------


def test_token_arithmetic_round_trips() -> None:
    assert tokens_per_step(1024, 4096) == 4 * 2**20
    assert sequences_per_step(4 * 2**20, 4096) == 1024
    assert grad_accum_steps(4 * 2**20, 8192, 64) == 8
    assert steps_for_tokens(10**12, 4 * 2**20) == 10**12 // (4 * 2**20)
    assert tokens_for_steps(238_418, 4 * 2**20) == 238_418 * 4 * 2**20


def test_grad_accum_error_names_nearest_values() -> None:
    with pytest.raises(InvalidValueError) as info:
        grad_accum_steps(1_000_000, 8192, 8)
    message = str(info.value)
    assert "micro_batch_tokens x dp = 8,192 x 8 = 65,536" in message
    assert "983,040 or 1,048,576" in message
    # 1,000,000 / 8 = 125,000 = 2^3 5^6: its divisors nearest 8,192 are 6,250 and 12,500.
    assert "micro_batch_tokens: 6,250 or 12,500" in message


def test_grad_accum_error_suggests_dp() -> None:
    with pytest.raises(InvalidValueError, match=r"dp: 4 or 6"):
        grad_accum_steps(4096 * 24, 4096, 5)


def test_sequences_per_step_refuses_partial_sequences() -> None:
    with pytest.raises(InvalidValueError, match=r"nearest valid batch_tokens: 4,096 or 8,192"):
        sequences_per_step(5000, 4096)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: grad_accum_steps(-1, 1, 1), InvalidValueError),
        (lambda: grad_accum_steps(10, 0, 1), InvalidValueError),
        (lambda: grad_accum_steps(10.5, 1, 1), InvalidTypeError),
        (lambda: grad_accum_steps("10", 1, 1), InvalidTypeError),
        (lambda: tokens_for_steps(2**62, 4), TokenBatchOverflowError),
        (lambda: steps_for_tokens(-5, 4), InvalidValueError),
    ],
)
def test_token_arithmetic_bad_input(call: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        call()  # type: ignore[operator]


# -- Megatron-LM ramp ----------------------------------------------------------------------


def test_megatron_documented_example() -> None:
    ramp = tokenbatch.schedule.MegatronRampup(32, 32, 1000, 1024)
    consumed = [0, 32, 33, 64, 65, 500, 999, 1000, 1001]
    assert ramp.batch_at(consumed).tolist() == [32, 32, 64, 64, 96, 512, 992, 1024, 1024]
    assert ramp.batch_at(33) == 64
    assert isinstance(ramp.batch_at(33), int)


def _megatron_reference(start: int, inc: int, ramp: int, glob: int, consumed: int) -> int:
    """Megatron-LM's RampupBatchsizeNumMicroBatchesCalculator.update, transcribed."""
    per_increment = ramp / ((glob - start) // inc)
    if consumed > ramp:
        return glob
    return start + int(consumed / per_increment) * inc


def _megatron_train_iters_reference(ramp: MegatronRampup, train_samples: int) -> int:
    """Megatron-LM's update_train_iters, transcribed."""
    iterations = consumed = 0
    while consumed <= ramp.ramp_samples:
        consumed += ramp.batch_at(consumed)
        iterations += 1
    return iterations + (train_samples - consumed) // ramp.global_batch


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(1, 512),
    inc=st.integers(1, 64),
    n=st.integers(1, 64),
    ramp=st.integers(1, 10**7),
    points=st.lists(st.integers(0, 2 * 10**7), min_size=1, max_size=40),
)
def test_megatron_matches_the_transcribed_formula(
    start: int, inc: int, n: int, ramp: int, points: list[int]
) -> None:
    glob = start + n * inc
    schedule = MegatronRampup(start, inc, ramp, glob)
    expected = [_megatron_reference(start, inc, ramp, glob, p) for p in points]
    assert schedule.batch_at(points).tolist() == expected


@pytest.mark.parametrize("train_samples", [0, 100, 999, 1000, 5000, 10**6 + 17])
def test_megatron_train_iters(train_samples: int) -> None:
    ramp = MegatronRampup(32, 32, 1000, 1024, seq_len=2048)
    assert ramp.train_iters(train_samples) == _megatron_train_iters_reference(ramp, train_samples)


def test_megatron_table_steps_match_train_iters() -> None:
    ramp = MegatronRampup(16, 16, 300_000, 512, seq_len=2048)
    samples = 5_000_000
    table = ramp.table(samples * 2048, 2 * 2048, 8)
    assert len(table["batch_tokens"]) == ramp.train_iters(samples)
    assert table["batch_sequences"][0] == 16
    assert table["batch_sequences"][-1] == 512
    np.testing.assert_array_equal(table["batch_tokens"], table["batch_sequences"] * 2048)


def test_megatron_bad_input() -> None:
    with pytest.raises(InvalidValueError, match=r"not a multiple of increment=30"):
        MegatronRampup(32, 30, 1000, 1024)
    with pytest.raises(InvalidValueError, match=r"must not decrease"):
        MegatronRampup(64, 32, 1000, 32)
    with pytest.raises(InvalidValueError, match=r"seq_len"):
        MegatronRampup(32, 32, 1000, 1024).table(10**9, 4096, 1)
    with pytest.raises(InvalidValueError, match=r"consumed_samples\[1\] = -1 is negative"):
        MegatronRampup(32, 32, 1000, 1024).batch_at([0, -1])


# -- linear ramps --------------------------------------------------------------------------


def test_deepseek_v3_ramp() -> None:
    ramp = deepseek_v3_ramp()
    assert ramp.batch_at([0, 234_500_000_000, 469_000_000_000, 10**13]).tolist() == [
        3072,
        9216,
        15360,
        15360,
    ]
    assert ramp.batch_tokens_at(0) == 3072 * 4096
    assert ramp.batch_tokens_at(469_000_000_000) == 15360 * 4096


def test_gpt3_ramp_in_tokens() -> None:
    ramp = gpt3_ramp()
    assert ramp.batch_tokens_at(0) == 32_768
    assert ramp.batch_tokens_at(4_000_000_000) == 1536 * 2048
    middle = ramp.batch_at(2_000_000_000)
    assert middle % 16 == 0
    assert middle == (16 + (1536 - 16) // 2) // 16 * 16


def test_linear_ramp_multiple_of_and_shape() -> None:
    ramp = LinearRamp(64, 1024, 10**6, multiple_of=64)
    tokens = np.arange(0, 1_200_000, 997)
    batches = ramp.batch_at(tokens)
    assert np.all(batches % 64 == 0)
    assert np.all(np.diff(batches) >= 0)
    assert batches.min() == 64
    assert batches.max() == 1024
    grid = ramp.batch_at(tokens[:15].reshape(3, 5))
    assert grid.shape == (3, 5)
    np.testing.assert_array_equal(grid.ravel(), batches[:15])


def test_linear_ramp_by_steps_is_linear_in_steps() -> None:
    ramp = LinearRamp(1024, 16384, 50_000_000, by="steps", multiple_of=1024)
    table = ramp.table(100_000_000, 1024, 1)
    batches = table["batch_tokens"]
    in_ramp = batches[table["consumed_tokens"] <= 45_000_000]
    steps = np.arange(in_ramp.size)
    slope, intercept = np.polyfit(steps, in_ramp, 1)
    residual = in_ramp - (slope * steps + intercept)
    assert np.abs(residual).max() <= 1024  # within one rounding step of a straight line
    by_tokens = LinearRamp(1024, 16384, 50_000_000, by="tokens", multiple_of=1024)
    # Linear in steps front-loads growth: fewer, larger steps during the ramp.
    assert len(batches) < len(by_tokens.table(100_000_000, 1024, 1)["batch_tokens"])


def test_linear_ramp_bad_input() -> None:
    with pytest.raises(InvalidValueError, match=r"must not decrease"):
        LinearRamp(1024, 512, 10)
    with pytest.raises(InvalidValueError, match=r"nearest valid start: 960 or 1024"):
        LinearRamp(1000, 2048, 10, multiple_of=64)
    with pytest.raises(InvalidValueError, match=r"needs seq_len"):
        LinearRamp(16, 32, 10, unit="sequences")
    with pytest.raises(InvalidValueError, match=r"unit must be"):
        LinearRamp(16, 32, 10, unit="samples")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match=r"by must be"):
        LinearRamp(16, 32, 10, by="epochs")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match=r"must be an integer, got 4\.5"):
        LinearRamp(16, 32, 4.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match=r"tokens\[0\] = -5 is negative"):
        LinearRamp(16, 32, 10).batch_at(-5)
    with pytest.raises(InvalidTypeError):
        LinearRamp(16, 32, 10).batch_at(np.array([1.5]))


# -- piecewise -----------------------------------------------------------------------------


def test_llama3_405b() -> None:
    schedule = llama3_405b_schedule()
    at = [0, 251_999_999, 252_000_000, 2_870_000_000_000, 15 * 10**12]
    mib = 2**20
    assert schedule.batch_tokens_at(at).tolist() == [4 * mib, 4 * mib, 8 * mib, 16 * mib, 16 * mib]


def test_piecewise_refuses_decrease_unless_allowed() -> None:
    with pytest.raises(InvalidValueError, match=r"decreases at piece 1"):
        Piecewise([(0, 1024), (100, 512)])
    assert Piecewise([(0, 1024), (100, 512)], allow_decrease=True).batch_at(100) == 512
    with pytest.raises(InvalidValueError, match=r"start at 0"):
        Piecewise([(10, 1024)])
    with pytest.raises(InvalidValueError, match=r"must increase"):
        Piecewise([(0, 1), (5, 2), (5, 3)])
    with pytest.raises(InvalidTypeError, match=r"pieces\[1\]"):
        Piecewise([(0, 1), (5,)])  # type: ignore[list-item]
    with pytest.raises(InvalidValueError, match=r"at least one"):
        Piecewise([])


# -- tables --------------------------------------------------------------------------------


def test_table_columns_and_budget() -> None:
    schedule = Piecewise([(0, 4 * 2**20), (252_000_000, 8 * 2**20)])
    table = schedule.table(10**10, 8192, 64)
    assert set(table) == {"batch_sequences", "batch_tokens", "grad_accum_steps", "consumed_tokens"}
    assert all(a.dtype == np.int64 for a in table.values())
    np.testing.assert_array_equal(np.cumsum(table["batch_tokens"]), table["consumed_tokens"])
    np.testing.assert_array_equal(table["grad_accum_steps"] * 8192 * 64, table["batch_tokens"])
    # Without seq_len a "sequence" is a packed row of micro_batch_tokens.
    np.testing.assert_array_equal(table["batch_sequences"] * 8192, table["batch_tokens"])
    assert table["batch_tokens"][0] == 4 * 2**20
    assert table["batch_tokens"][-1] == 8 * 2**20
    last = int(table["consumed_tokens"][-1])
    assert last <= 10**10 < last + 8 * 2**20
    assert steps_for_tokens(10**10, schedule) == len(table["batch_tokens"])


def test_table_names_the_first_undivided_step() -> None:
    schedule = LinearRamp(3072, 15360, 469_000_000_000, unit="sequences", seq_len=4096)
    with pytest.raises(InvalidValueError, match=r"multiple_of=64 sequences"):
        schedule.table(10**12, 4096, 64)


@settings(max_examples=40, deadline=None)
@given(
    start_k=st.integers(1, 30),
    extra_k=st.integers(0, 30),
    ramp=st.integers(1, 10**6),
    micro=st.integers(1, 16),
    dp=st.integers(1, 8),
    total=st.integers(0, 3 * 10**6),
    by=st.sampled_from(["tokens", "steps"]),
)
def test_table_matches_a_python_loop(
    start_k: int, extra_k: int, ramp: int, micro: int, dp: int, total: int, by: str
) -> None:
    round_tokens = micro * dp
    schedule = LinearRamp(
        start_k * round_tokens,
        (start_k + extra_k) * round_tokens,
        ramp,
        by=by,  # type: ignore[arg-type]
        multiple_of=round_tokens,
    )
    table = schedule.table(total, micro, dp)
    consumed, expected = 0, []
    while True:
        batch = schedule.batch_tokens_at(consumed)
        if consumed + batch > total:
            break
        consumed += batch
        expected.append(batch)
    assert table["batch_tokens"].tolist() == expected


def test_million_step_table() -> None:
    table = Piecewise([(0, 4096)]).table(4096 * 10**6, 1024, 2)
    assert len(table["batch_tokens"]) == 10**6
    assert table["consumed_tokens"][-1] == 4096 * 10**6
    assert np.all(table["grad_accum_steps"] == 2)


# -- grouping measured micro-batches into steps -----------------------------------------------


def test_group_into_steps_follows_a_ramp() -> None:
    rng = np.random.default_rng(0)
    dp = 4
    tokens = rng.integers(3000, 4097, size=dp * 5000)
    schedule = LinearRamp(64 * 4096, 256 * 4096, 20 * 10**6)
    offsets = group_into_steps(tokens, schedule, dp)
    rounds = tokens.reshape(-1, dp).sum(axis=1)
    totals = np.add.reduceat(rounds, offsets[:-1])
    starts = np.concatenate([[0], np.cumsum(totals)[:-1]])
    targets = schedule.batch_tokens_at(starts)
    assert offsets[0] == 0
    assert offsets[-1] == rounds.size
    assert np.all(np.diff(offsets) > 0)
    # Every full step is within half a round of its target.
    full = slice(0, len(totals) - 1)
    assert np.all(np.abs(totals[full] - targets[full]) <= rounds.max() / 2)
    assert totals[0] < totals[-2]  # the ramp grows the steps


def test_group_into_steps_bad_input() -> None:
    schedule = Piecewise([(0, 100)])
    with pytest.raises(InvalidValueError, match=r"rounds of dp=2"):
        group_into_steps([1, 2, 3], schedule, 2)
    with pytest.raises(InvalidValueError, match=r"negative"):
        group_into_steps([1, -2], schedule, 1)
    with pytest.raises(InvalidTypeError):
        group_into_steps([1, 2], "schedule", 1)  # type: ignore[arg-type]
    assert group_into_steps([], schedule, 4).tolist() == [0]


# -- learning rate keyed to tokens -----------------------------------------------------------


def test_cosine_lr() -> None:
    lr = CosineLR(3e-4, 1_000_000, warmup_tokens=100_000, min_lr=3e-5)
    assert lr.lr_at(50_000) == pytest.approx(1.5e-4)
    assert lr.lr_at(100_000) == pytest.approx(3e-4)
    assert lr.lr_at(550_000) == pytest.approx((3e-4 + 3e-5) / 2)
    assert lr.lr_at(1_000_000) == pytest.approx(3e-5)
    assert lr.lr_at(5_000_000) == pytest.approx(3e-5)
    values = lr.lr_at(np.arange(100_000, 1_000_001, 1000))
    assert np.all(np.diff(values) <= 1e-18)


@pytest.mark.parametrize("shape", ["linear", "cosine", "sqrt"])
def test_wsd_lr(shape: str) -> None:
    lr = WarmupStableDecayLR(
        1e-3,
        1_000_000,
        warmup_tokens=10_000,
        decay_tokens=200_000,
        min_lr=1e-5,
        decay_shape=shape,  # type: ignore[arg-type]
    )
    assert lr.lr_at(5_000) == pytest.approx(5e-4)
    assert lr.lr_at(10_000) == pytest.approx(1e-3)
    assert lr.lr_at(799_999) == pytest.approx(1e-3)
    assert lr.lr_at(1_000_000) == pytest.approx(1e-5)
    midpoint = {"linear": 0.5, "cosine": 0.5, "sqrt": 1 - math.sqrt(0.5)}[shape]
    assert lr.lr_at(900_000) == pytest.approx(1e-5 + (1e-3 - 1e-5) * midpoint)


def test_lr_keyed_to_tokens_is_independent_of_the_batch() -> None:
    lr = CosineLR(1e-3, 10**9, warmup_tokens=10**7)
    small = LinearRamp(2**18, 2**18, 1).table(10**9, 2**14, 1)
    large = LinearRamp(2**21, 2**21, 1).table(10**9, 2**14, 1)
    # The same token position has the same rate whatever the batch.
    common = np.intersect1d(small["consumed_tokens"], large["consumed_tokens"])
    assert common.size > 100
    np.testing.assert_allclose(lr.lr_at(common), lr.lr_at(common.astype(np.float64)))
    assert lr.lr_at(small["consumed_tokens"])[7] == pytest.approx(
        lr.lr_at(large["consumed_tokens"])[0]
    )


def test_constant_lr_and_rescaling() -> None:
    assert ConstantLR(1e-3, warmup_tokens=100).lr_at([0, 50, 100, 10**9]).tolist() == pytest.approx(
        [0.0, 5e-4, 1e-3, 1e-3]
    )
    assert rescale_lr(1e-3, 2**20, 4 * 2**20) == pytest.approx(2e-3)
    assert rescale_lr(1e-3, 2**20, 4 * 2**20, rule="linear") == pytest.approx(4e-3)
    np.testing.assert_allclose(rescale_lr(1.0, 4, np.array([1, 16])), [0.5, 2.0])
    with pytest.raises(InvalidValueError, match=r"rule must be"):
        rescale_lr(1e-3, 1, 2, rule="cubic")  # type: ignore[arg-type]


def test_batch_scaled_lr_follows_the_ramp() -> None:
    ramp = LinearRamp(2**18, 2**20, 10**8, multiple_of=2**18)
    lr = BatchScaledLR(ConstantLR(1e-3), ramp, 2**20, rule="sqrt")
    assert lr.lr_at(0) == pytest.approx(5e-4)  # a quarter of the batch, half the rate
    assert lr.lr_at(10**9) == pytest.approx(1e-3)


def test_lr_bad_input() -> None:
    with pytest.raises(InvalidValueError, match=r"warmup_tokens"):
        CosineLR(1e-3, 100, warmup_tokens=100)
    with pytest.raises(InvalidValueError, match=r"exceeds total_tokens"):
        WarmupStableDecayLR(1e-3, 100, warmup_tokens=50, decay_tokens=60)
    with pytest.raises(InvalidValueError, match=r"min_lr"):
        CosineLR(1e-3, 100, min_lr=1e-2)
    with pytest.raises(InvalidValueError, match=r"tokens must be finite and >= 0"):
        ConstantLR(1e-3).lr_at(-1)
    with pytest.raises(InvalidTypeError):
        ConstantLR("fast")  # type: ignore[arg-type]
