"""The scattered grid against the broadcast grid, side by side in one process.

``python benches/grid_ratio.py [ROUNDS]`` builds the million-cell broadcast grid of
``bench_memory.py`` and three lists of 1,013,760 independent configurations (``scattered``
as in the benchmark, with ``recompute`` as strings; ``codes``, the same with integer
codes; ``shuffled``, the broadcast grid's own cells in a random order, with codes, so
that only the access differs), evaluates them in turn for each round after two warm-up
rounds, and prints the broadcast grid's least CPU time and the median and quartiles of
each list's per-round ratio of CPU time to it. CPU time of the whole process (all of the
pool's threads), so that a busy shared machine changes the ratio less than it changes
wall time; a single round's ratio is noisy (the pool's threads spin a little after a grid
ends, and that time can fall in the next measurement), the median is the figure.

``python benches/grid_ratio.py --once NAME`` evaluates one of the four grids once, for
counting its instructions, which unlike times do not depend on the machine's load
(benches/RESULTS.md, "Seventh round")::

    PYTHONHASHSEED=0 RAYON_NUM_THREADS=1 valgrind --tool=callgrind \\
        --toggle-collect='rayon_core::registry::WorkerThread::wait_until_cold' \\
        python benches/grid_ratio.py --once codes
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory import SPEC, _grid_params, _scattered_params

from tokenbatch import estimate_memory_grid


def cpu_seconds(run: Callable[[], Any]) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def as_codes(names: np.ndarray) -> np.ndarray:
    return np.select([names == "none", names == "selective"], [0, 1], 2)


def grids() -> dict[str, dict[str, Any]]:
    broadcast = _grid_params(1_000_000)
    scattered = _scattered_params(1_013_760)
    shape = np.broadcast_shapes(*(np.shape(values) for values in broadcast.values()))
    cells = {name: np.broadcast_to(values, shape).ravel() for name, values in broadcast.items()}
    order = np.random.default_rng(1).permutation(int(np.prod(shape)))
    shuffled = {name: np.ascontiguousarray(values[order]) for name, values in cells.items()}
    return {
        "broadcast": broadcast,
        "scattered": scattered,
        "codes": {**scattered, "recompute": as_codes(scattered["recompute"])},
        "shuffled": {**shuffled, "recompute": as_codes(shuffled["recompute"])},
    }


def main(rounds: int) -> None:
    params = grids()
    times: dict[str, list[float]] = {name: [] for name in params}
    for round_ in range(rounds + 2):
        for name, grid in params.items():
            seconds = cpu_seconds(functools.partial(estimate_memory_grid, SPEC, **grid))
            if round_ >= 2:
                times[name].append(seconds)
    print(f"broadcast: least CPU time {min(times['broadcast']) * 1e3:.1f} ms")
    for name in ("scattered", "codes", "shuffled"):
        ratios = [t / b for t, b in zip(times[name], times["broadcast"], strict=True)]
        low, _, high = statistics.quantiles(ratios, n=4)
        print(f"{name}: median {statistics.median(ratios):.3f}x (quartiles {low:.3f}-{high:.3f})")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--once"]:
        estimate_memory_grid(SPEC, **grids()[sys.argv[2]])
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
