"""Turn pytest-benchmark JSON into the markdown tables of benches/RESULTS.md.

    TOKENBATCH_BENCH_FULL=1 pytest benches/bench_packing.py --benchmark-enable \\
        --benchmark-json=packing.json
    python benches/report.py packing.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import Any


def packing_table(benchmarks: list[dict[str, Any]]) -> str:
    """One row per (n, algorithm): best and median time, ns per sequence and, where the
    pure-Python baseline ran at that size, the speed-up per sequence over it."""
    rows: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for bench in benchmarks:
        info = bench["extra_info"]
        rows[int(info["n"])][str(info["algorithm"])] = bench
    lines = [
        "| n | implementation | best (s) | median (s) | ns / sequence | bins / lower bound | "
        "speed-up vs Python BFD |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for n in sorted(rows):
        baseline = rows[n].get("python bfd (bisect)")
        for algorithm, bench in sorted(rows[n].items()):
            stats, info = bench["stats"], bench["extra_info"]
            per_seq = stats["min"] / n * 1e9
            quality = (
                f"{info['n_bins'] / max(info['lower_bound'], 1):.5f}" if "n_bins" in info else ""
            )
            speedup = (
                f"{baseline['stats']['min'] / stats['min']:,.0f}x"
                if baseline is not None and bench is not baseline
                else ""
            )
            lines.append(
                f"| {n:,} | {algorithm} | {stats['min']:.4f} | {stats['median']:.4f} | "
                f"{per_seq:,.1f} | {quality} | {speedup} |"
            )
    return "\n".join(lines)


def main() -> None:
    with open(sys.argv[1]) as handle:
        data = json.load(handle)
    machine = data.get("machine_info", {})
    print(
        f"Machine: {machine.get('cpu', {}).get('brand_raw', '?')}, "
        f"{machine.get('cpu', {}).get('count', '?')} cores, Python {machine.get('python_version')}"
    )
    print()
    print(packing_table(data["benchmarks"]))


if __name__ == "__main__":
    main()
