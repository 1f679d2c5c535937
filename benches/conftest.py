"""Shared settings of the benchmarks.

By default every benchmark runs at smoke-test sizes, so `pytest benches
--benchmark-disable` doubles as a quick correctness check in CI. Set
TOKENBATCH_BENCH_FULL=1 for the sizes quoted in benches/RESULTS.md.
"""

from __future__ import annotations

import os

FULL = os.environ.get("TOKENBATCH_BENCH_FULL") == "1"


def sizes(full: list[int], smoke: list[int]) -> list[int]:
    """The sizes to benchmark: the full list when TOKENBATCH_BENCH_FULL=1."""
    return full if FULL else smoke
