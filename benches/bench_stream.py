"""Streaming packing: fill against buffer size, and throughput.

Full run (numbers in benches/RESULTS.md):
    TOKENBATCH_BENCH_FULL=1 pytest benches/bench_stream.py --benchmark-enable
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import FULL, sizes

import tokenbatch as tb
from tokenbatch.datasets import example_lengths

MAX_TOKENS = 8192
N = sizes([1_000_000], [20_000])[0]


def stream_bins(lengths: list[int], buffer_size: int) -> int:
    packer = tb.StreamPacker(
        lengths, MAX_TOKENS, buffer_size=buffer_size, length_fn=int, output="segments"
    )
    return sum(1 for _ in packer)


@pytest.mark.parametrize("distribution", ["lognormal", "chat"])
@pytest.mark.parametrize("buffer_size", sizes([64, 256, 1024, 4096, 16384], [64, 1024]))
def test_stream_packer(benchmark: Any, buffer_size: int, distribution: str) -> None:
    lengths = example_lengths(distribution, N, max_length=MAX_TOKENS, seed=0)
    values = lengths.tolist()
    benchmark.group = f"stream {distribution} n={N:,}"
    n_bins = benchmark.pedantic(stream_bins, args=(values, buffer_size), rounds=1, iterations=1)
    whole = tb.pack(lengths, MAX_TOKENS)
    stream_efficiency = int(lengths.sum()) / (n_bins * MAX_TOKENS)
    benchmark.extra_info.update(
        n=N,
        buffer_size=buffer_size,
        bins=n_bins,
        bfd_bins=whole.n_bins,
        efficiency=round(stream_efficiency, 6),
        bfd_efficiency=round(whole.efficiency, 6),
    )
    assert n_bins >= whole.lower_bound
    # A buffer of a thousand sequences or more comes within a percent of packing everything.
    assert stream_efficiency > whole.efficiency - (0.01 if buffer_size >= 1024 else 0.1)


@pytest.mark.parametrize("max_tokens", [8192, 1 << 20])
def test_stream_packer_budget(benchmark: Any, max_tokens: int) -> None:
    """The same stream under an ordinary and a huge budget: each repack costs what the
    buffer costs, not what the budget does."""
    lengths = example_lengths("lognormal", N, max_length=MAX_TOKENS, seed=0).tolist()
    benchmark.group = f"stream budget n={N:,}"

    def run() -> int:
        packer = tb.StreamPacker(lengths, max_tokens, length_fn=int, output="segments")
        return sum(1 for _ in packer)

    n_bins = benchmark.pedantic(run, rounds=3 if FULL else 1, iterations=1)
    benchmark.extra_info.update(n=N, max_tokens=max_tokens, buffer_size=4096, bins=n_bins)
    assert n_bins >= sum(lengths) // max_tokens
