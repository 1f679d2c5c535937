"""The first `tb.pack` of a process against `np.sort` of the same lengths in that process.

A data pipeline packs once per process, in a process that has often allocated and freed
a lot of memory already; what it pays is the first call, page faults included. Each round
runs two fresh interpreters that time `np.sort` and then the first `tb.pack` of the same
array (1M and 10M `documents` lengths capped at 8,192 in the full run), the second one
after allocating and freeing about 2 GB; the ratio of the two times is recorded per
process, in wall-clock and in CPU seconds.

Full run (numbers in benches/RESULTS.md):
    TOKENBATCH_BENCH_FULL=1 pytest benches/bench_first_call.py --benchmark-enable
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from conftest import FULL, sizes

from tokenbatch.datasets import example_lengths

ROUNDS = 9 if FULL else 1

FIRST_CALL = """
import json, sys, time
import numpy as np
if sys.argv[2] == "after_2gb":
    # A pipeline's history: large arrays and many small objects, allocated and freed.
    blocks = [np.ones(1 << 24) for _ in range(16)]  # 16 x 128 MB
    del blocks
    small = [bytearray(4096) for _ in range(100_000)]
    del small
import tokenbatch as tb
lengths = np.load(sys.argv[1])
start, start_cpu = time.perf_counter(), time.process_time()
np.sort(lengths)
sorted_at, sorted_cpu = time.perf_counter(), time.process_time()
tb.pack(lengths, 8192)
packed_at, packed_cpu = time.perf_counter(), time.process_time()
print(json.dumps({
    "sort": sorted_at - start,
    "pack": packed_at - sorted_at,
    "sort_cpu": sorted_cpu - start_cpu,
    "pack_cpu": packed_cpu - sorted_cpu,
}))
"""


@pytest.mark.parametrize("n", sizes([1_000_000, 10_000_000], [200_000]))
def test_first_pack_against_sort(
    benchmark: Any, n: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each round runs one process of each history, one after the other, so that both
    see the same machine (a shared machine's load moves the ratio more than anything)."""
    lengths_file = tmp_path_factory.mktemp("first_call") / "lengths.npy"
    np.save(lengths_file, example_lengths("documents", n, max_length=8192, seed=0))
    timings: dict[str, list[dict[str, float]]] = {"fresh": [], "after_2gb": []}

    def one_process_each() -> None:
        for history, results in timings.items():
            result = subprocess.run(
                [sys.executable, "-c", FIRST_CALL, str(lengths_file), history],
                capture_output=True,
                text=True,
                timeout=300,
                check=True,
            )
            results.append(json.loads(result.stdout))

    benchmark.group = f"first call n={n:,}"
    benchmark.pedantic(one_process_each, rounds=ROUNDS, iterations=1)
    benchmark.extra_info["n"] = n
    for history, results in timings.items():
        ratios = [t["pack"] / t["sort"] for t in results]
        # CPU seconds (both of pack's threads) do not depend on how many cores the process
        # got, which on a shared machine moves the wall-clock ratio more than anything.
        cpu_ratios = [t["pack_cpu"] / t["sort_cpu"] for t in results]
        benchmark.extra_info[history] = {
            "sort_median_s": statistics.median(t["sort"] for t in results),
            "pack_median_s": statistics.median(t["pack"] for t in results),
            "ratio_median": statistics.median(ratios),
            "ratios": [round(r, 2) for r in ratios],
            "sort_cpu_median_s": statistics.median(t["sort_cpu"] for t in results),
            "pack_cpu_median_s": statistics.median(t["pack_cpu"] for t in results),
            "cpu_ratio_median": statistics.median(cpu_ratios),
        }
        assert all(t["pack"] > 0 and t["sort"] > 0 for t in results)
