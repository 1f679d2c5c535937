"""Bad input gets a clear tokenbatch exception, never a panic, a hang or a wrong answer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tokenbatch as tb
from tokenbatch.errors import (
    InvalidTypeError,
    InvalidValueError,
    TokenBatchError,
    TokenBatchOverflowError,
)


@pytest.mark.parametrize(
    ("lengths", "error", "message"),
    [
        ([3, -1, 2], InvalidValueError, r"lengths\[1\] = -1 is negative"),
        (np.array([1.0, 2.0]), InvalidTypeError, "must hold integers.*float64"),
        ([1.5, 2], InvalidTypeError, "must hold integers"),
        ([1, float("nan")], InvalidTypeError, "must hold integers"),
        (np.array([[1, 2], [3, 4]]), InvalidTypeError, r"one-dimensional.*\(2, 2\)"),
        (np.array([True, False]), InvalidTypeError, "must hold integers.*bool"),
        (["1", "2"], InvalidTypeError, "must hold integers"),
        ("123", InvalidTypeError, "got str"),
        (5, InvalidTypeError, "got int"),
        ([1, 2**70], TokenBatchOverflowError, r"lengths\[1\].*64-bit"),
        ([1, None], InvalidTypeError, r"lengths\[1\] = None"),
        (np.array([2**63], dtype=np.uint64), TokenBatchOverflowError, "64-bit"),
        ([2**62, 2**62, 2**62], TokenBatchOverflowError, "more than 2\\^63"),
        ([[1, 2], [3]], InvalidTypeError, "could not be read"),
    ],
)
def test_bad_lengths(lengths: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        tb.pack(lengths, 10, oversize="truncate")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_tokens": 0}, InvalidValueError, "max_tokens must be positive"),
        ({"max_tokens": -5}, InvalidValueError, "max_tokens must be positive"),
        ({"max_tokens": 2**40}, InvalidValueError, "supported maximum"),
        ({"max_tokens": 2**70}, TokenBatchOverflowError, "max_tokens"),
        ({"max_tokens": 10.5}, InvalidTypeError, r"max_tokens must be an integer, got 10\.5"),
        ({"max_tokens": float("nan")}, InvalidTypeError, "max_tokens must be an integer, got nan"),
        ({"max_tokens": 1e30}, TokenBatchOverflowError, "max_tokens"),
        ({"max_tokens": True}, InvalidTypeError, "max_tokens must be an integer"),
        ({"max_seqs": 0}, InvalidValueError, "max_seqs must be at least 1"),
        ({"pad_to_multiple_of": 0}, InvalidValueError, "pad_to_multiple_of must be at least 1"),
        ({"pad_to_multiple_of": 64}, InvalidValueError, "larger than max_tokens"),
        ({"algorithm": "best"}, InvalidValueError, "unknown algorithm 'best'"),
        ({"algorithm": 3}, InvalidTypeError, "algorithm must be a string"),
        ({"oversize": "clip"}, InvalidValueError, "unknown oversize policy 'clip'"),
        ({"seed": -1}, InvalidValueError, "seed must be in"),
        ({"seed": 1.5}, InvalidTypeError, "seed must be an integer"),
    ],
)
def test_bad_options(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    arguments: dict[str, Any] = {"max_tokens": 32, **kwargs}
    with pytest.raises(error, match=message):
        tb.pack([1, 2, 3], **arguments)


def test_every_error_is_a_tokenbatch_error_and_a_builtin() -> None:
    assert issubclass(InvalidValueError, ValueError)
    assert issubclass(InvalidTypeError, TypeError)
    assert issubclass(TokenBatchOverflowError, OverflowError)
    assert issubclass(tb.OversizeError, InvalidValueError)
    for error in (InvalidValueError, InvalidTypeError, TokenBatchOverflowError):
        assert issubclass(error, TokenBatchError)


def test_split_that_would_explode_is_refused() -> None:
    with pytest.raises(TokenBatchOverflowError, match="segments"):
        tb.pack([2**40], 1, oversize="split")


def test_batch_padded_validates_like_pack() -> None:
    with pytest.raises(tb.OversizeError, match="sequence 0"):
        tb.batch_padded([11], 10)
    with pytest.raises(InvalidValueError, match="max_tokens"):
        tb.batch_padded([1], 0)
