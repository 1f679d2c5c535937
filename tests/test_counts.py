"""User-facing counts: integers, and floats that hold a whole number (``469e9``)."""

from __future__ import annotations

import numpy as np
import pytest

import tokenbatch as tb
from tokenbatch import schedule
from tokenbatch.errors import InvalidTypeError, TokenBatchOverflowError


def test_schedules_take_token_counts_written_as_floats() -> None:
    """DeepSeek-V3's ramp as its paper writes it (3072 to 15360 over 469B tokens)."""
    as_floats = schedule.LinearRamp(
        3072, 15360, 469e9, unit="sequences", seq_len=4096, multiple_of=1024
    )
    as_ints = schedule.LinearRamp(
        3072, 15360, 469_000_000_000, unit="sequences", seq_len=4096, multiple_of=1024
    )
    assert as_floats.ramp_tokens == 469_000_000_000
    assert isinstance(as_floats.ramp_tokens, int)
    by_float = as_floats.table(500e9, 4096.0, np.float64(1024))
    by_int = as_ints.table(500_000_000_000, 4096, 1024)
    for column, values in by_int.items():
        np.testing.assert_array_equal(by_float[column], values)
    assert schedule.grad_accum_steps(4.0 * 2**20, 16384, dp=64.0) == 4


@pytest.mark.parametrize("value", [469e9 + 0.5, 0.5, float("nan"), float("inf"), -float("inf")])
def test_fractional_counts_are_refused_with_their_value(value: float) -> None:
    with pytest.raises(InvalidTypeError, match=r"ramp_tokens must be an integer, got"):
        schedule.LinearRamp(3072, 15360, value)
    with pytest.raises(InvalidTypeError, match=repr(float(value)).replace("+", r"\+")):
        schedule.LinearRamp(3072, 15360, value)


def test_scaling_recommend_takes_float_token_counts() -> None:
    advice = tb.scaling.recommend(1e9, 100e9)
    assert advice.batch_tokens == tb.scaling.recommend(10**9, 100 * 10**9).batch_tokens
    with pytest.raises(InvalidTypeError, match=r"tokens must be an integer, got 1000000\.5"):
        tb.scaling.recommend(1e9, 1e6 + 0.5)


def test_counts_elsewhere_take_whole_floats() -> None:
    lengths = [3, 5, 2]
    assert tb.pack(lengths, 8.0).n_bins == tb.pack(lengths, 8).n_bins
    assert tb.datasets.example_lengths("chat", 10.0, max_length=512.0).size == 10
    with pytest.raises(TokenBatchOverflowError, match="max_tokens"):
        tb.pack(lengths, 1e19)


def test_lengths_arrays_keep_refusing_floats() -> None:
    with pytest.raises(InvalidTypeError, match="must hold integers"):
        tb.pack(np.array([1.0, 2.0]), 8)
    with pytest.raises(InvalidTypeError, match="must hold integers"):
        tb.pack([1.0, 2.0], 8)
    with pytest.raises(InvalidTypeError, match="integer"):
        tb.pack([1, 2], "8")
    with pytest.raises(InvalidTypeError, match="integer"):
        tb.pack([1, 2], True)
