"""Packing speed: tokenbatch against pure-Python baselines.

Full run (numbers in benches/RESULTS.md):
    TOKENBATCH_BENCH_FULL=1 pytest benches/bench_packing.py --benchmark-json=packing.json
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import sizes

import tokenbatch as tb
from tokenbatch.datasets import example_lengths
from tokenbatch.reference import reference_pack

MAX_TOKENS = 8192


def lengths_for(n: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    return example_lengths("lognormal", n, max_length=MAX_TOKENS, seed=0)


@pytest.mark.parametrize("n", sizes([10_000, 100_000, 1_000_000, 10_000_000], [10_000]))
@pytest.mark.parametrize("algorithm", ["bfd", "ffd", "next_fit", "first_fit_shuffled"])
def test_tokenbatch_pack(benchmark: Any, n: int, algorithm: str) -> None:
    lengths = lengths_for(n)
    benchmark.group = f"pack n={n:,}"
    benchmark.extra_info.update(n=n, algorithm=algorithm)
    packing = benchmark(tb.pack, lengths, MAX_TOKENS, algorithm=algorithm)
    benchmark.extra_info.update(n_bins=packing.n_bins, lower_bound=packing.lower_bound)
    assert packing.n_segments == n


@pytest.mark.parametrize("n", sizes([10_000, 100_000, 1_000_000, 10_000_000], [10_000]))
def test_tokenbatch_batch_padded(benchmark: Any, n: int) -> None:
    lengths = lengths_for(n)
    benchmark.group = f"pack n={n:,}"
    benchmark.extra_info.update(n=n, algorithm="batch_padded")
    packing = benchmark(tb.batch_padded, lengths, MAX_TOKENS)
    assert packing.n_segments == n


@pytest.mark.parametrize("n", sizes([10_000, 100_000, 1_000_000], [10_000]))
def test_python_best_fit_decreasing(benchmark: Any, n: int) -> None:
    """A careful pure-Python BFD: sorted remaining capacities + bisect."""
    lengths = lengths_for(n).tolist()
    benchmark.group = f"pack n={n:,}"
    benchmark.extra_info.update(n=n, algorithm="python bfd (bisect)")
    result = benchmark.pedantic(reference_pack, args=(lengths, MAX_TOKENS), rounds=1, iterations=1)
    assert len(result.indices) == n


@pytest.mark.parametrize("max_tokens", [8192, 1 << 20, 16_777_216])
def test_pack_three_sequences(benchmark: Any, max_tokens: int) -> None:
    """A tiny input under a large budget costs what the input costs (the best-fit index
    and the decreasing order are sized by the input, not the budget)."""
    benchmark.group = "pack 3 sequences"
    benchmark.extra_info.update(n=3, max_tokens=max_tokens)
    packing = benchmark(tb.pack, [5_000, 700, 9], max_tokens)
    assert packing.n_bins == 1
