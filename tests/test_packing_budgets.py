"""Packing under budgets far larger than the input: the work and memory follow the input."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tokenbatch as tb

PEAK_MEMORY_SCRIPT = """
import resource, sys
import tokenbatch as tb
tb.pack([5, 7, 9], 1000)  # load everything the call needs before the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in range(3):
    tb.pack([5, 7, 9], int(sys.argv[1]), algorithm=sys.argv[2])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) * 1024)
"""


@pytest.mark.parametrize("algorithm", ["bfd", "ffd"])
@pytest.mark.parametrize("max_tokens", [1 << 20, 16_777_216])
def test_a_few_sequences_under_a_huge_budget_take_little_memory(
    max_tokens: int, algorithm: str
) -> None:
    # A best-fit index sized by the budget took 361 MB (and 0.3 s) for three sequences
    # at 16,777,216 tokens; sized by the input it takes a few hundred bytes.
    result = subprocess.run(
        [sys.executable, "-c", PEAK_MEMORY_SCRIPT, str(max_tokens), algorithm],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    grown = int(result.stdout)
    assert grown < 4 << 20, f"peak memory grew by {grown / 2**20:.1f} MiB"


@pytest.mark.parametrize("max_tokens", [1 << 20, 16_777_216, 100_000_000])
def test_large_budgets_give_the_packing_of_small_ones(max_tokens: int) -> None:
    # The same lengths scaled with the budget: the sparse index and the comparison sort
    # must make the choices of the dense index and the counting sort.
    lengths = tb.datasets.example_lengths("chat", 2_000, max_length=1000, seed=4)
    scale = max_tokens // 1000
    small = tb.pack(lengths, 1000, pad_to_multiple_of=8)
    large = tb.pack(lengths * scale, max_tokens, pad_to_multiple_of=8 * scale)
    assert np.array_equal(small.bin_offsets, large.bin_offsets)
    assert np.array_equal(small.indices, large.indices)
