"""A Rust panic never reaches Python as pyo3's ``PanicException`` (a ``BaseException``
that ``except Exception`` misses): the binding boundary raises ``InternalError``."""

from __future__ import annotations

import numpy as np
import pytest

import tokenbatch as tb
from tokenbatch import _core


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("binding", "with the GIL held"),
        ("detached", "with the GIL released"),
        ("worker", "on a worker thread"),
    ],
)
def test_a_panic_becomes_internal_error_naming_the_function(location: str, message: str) -> None:
    with pytest.raises(tb.InternalError) as caught:
        _core._panic_for_test(location)
    error = caught.value
    assert isinstance(error, tb.TokenBatchError)
    assert isinstance(error, RuntimeError)
    assert f"tokenbatch._core._panic_for_test: deliberate panic {message}" in str(error)
    assert "this is a bug in tokenbatch" in str(error)


def test_except_exception_catches_it_and_the_library_still_works() -> None:
    # pytest.raises(Exception) catches what `except Exception` does; PanicException escapes.
    with pytest.raises(Exception, match="deliberate panic") as caught:
        _core._panic_for_test("worker")
    assert type(caught.value) is tb.InternalError
    # The thread pool survives a panicking job: a packing large enough to run in parallel.
    lengths = np.random.default_rng(0).integers(1, 4096, size=1 << 17)
    packing = tb.pack(lengths, 4096)
    assert np.array_equal(np.sort(packing.indices), np.arange(lengths.size))


def test_an_unpickled_packing_without_a_budget_is_refused() -> None:
    """Rebuilt bins with max_tokens=0 passed validation and planning them divided by zero."""
    empty = np.zeros(0, dtype=np.int64)
    offsets = np.zeros(1, dtype=np.int64)
    with pytest.raises(tb.InvalidValueError, match="max_tokens must be at least 1"):
        tb.Packing._from_parts(offsets, empty, empty, empty, empty, [0] * 7, 0, 0, "packed", 0)


def test_an_unpickled_packing_with_a_bin_over_its_budget_is_refused() -> None:
    """Segments that each fit the budget but not together passed validation, and a plan
    dealt the bin over the budget."""
    packing = tb.pack(np.array([5, 9, 3]), 16)
    parts = packing.__reduce__()[1]
    # Sequences 0 and 1 (5 + 9 tokens) in one bin of a 12-token budget.
    budget = list(parts)
    budget[6] = 12
    with pytest.raises(
        tb.InvalidValueError, match="bin 0 holds 14 tokens, more than max_tokens=12"
    ):
        tb.Packing._from_parts(
            np.array([0, 2], dtype=np.int64),
            np.array([0, 1], dtype=np.int64),
            np.zeros(2, dtype=np.int64),
            np.array([5, 9], dtype=np.int64),
            np.array([14], dtype=np.int64),
            *budget[5:],
        )


def test_an_unpickled_packing_that_places_a_token_twice_is_refused() -> None:
    """Two segments over the same tokens passed validation, and a plan dealt them twice."""
    packing = tb.pack(np.array([5, 9, 3]), 16)
    parts = packing.__reduce__()[1]
    assert tb.Packing._from_parts(*parts).n_bins == packing.n_bins
    # Sequence 0 whole in each of two bins; counts, budget, n_seqs... as pickled.
    with pytest.raises(
        tb.InvalidValueError, match="segments 0 and 1 both hold tokens of sequence 0"
    ):
        tb.Packing._from_parts(
            np.array([0, 1, 2], dtype=np.int64),
            np.zeros(2, dtype=np.int64),
            np.zeros(2, dtype=np.int64),
            np.array([5, 5], dtype=np.int64),
            np.array([5, 5], dtype=np.int64),
            *parts[5:],
        )
