"""Time `tb.pack` of two or more builds in one run, alternating fresh processes.

A build is a folder holding the `tokenbatch` package with its extension (an unpacked wheel:
`python -m zipfile -e tokenbatch-*.whl FOLDER`). Each round starts one process per build,
in turn (the order reversed every other round), so that a shared machine's load weighs
on every build alike; the ratios are taken round by round against the first build.

    python benches/compare_builds.py first 14 1000000,10000000 before=DIR_A after=DIR_B
    python benches/compare_builds.py warm 6 1000000 before=DIR_A after=DIR_B
    python benches/compare_builds.py sampler 6 10000000 before=DIR_A after=DIR_B

`first`: the first `tb.pack` of the process (after `np.sort` of the same lengths, as in
bench_first_call.py), `documents` lengths capped at 8,192. `warm`: the median of 5 calls
of `tb.pack` (bfd) and of `tb.batch_padded` after one untimed call, `lognormal` lengths.
`sampler`: building a `TokenBudgetBatchSampler` of rank 3 of 8 over `documents` lengths
and iterating its epoch, the first of the process (as `bench_sampler.py` times it).
Wall-clock and CPU seconds (every thread of the process) are both reported.
A build may carry environment variables: `NAME=DIR,VAR=VALUE,...`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

FIRST = """
import json, sys, time
import numpy as np
import tokenbatch as tb
lengths = np.load(sys.argv[1])
np.sort(lengths)
wall, cpu = time.perf_counter(), time.process_time()
tb.pack(lengths, 8192)
print(json.dumps({"pack": time.perf_counter() - wall, "pack_cpu": time.process_time() - cpu}))
"""

WARM = """
import json, statistics, sys, time
import numpy as np
import tokenbatch as tb
lengths = np.load(sys.argv[1])
out = {}
for name, call in [("pack", tb.pack), ("batch_padded", tb.batch_padded)]:
    call(lengths, 8192)
    walls, cpus = [], []
    for _ in range(5):
        wall, cpu = time.perf_counter(), time.process_time()
        call(lengths, 8192)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    out[name], out[name + "_cpu"] = statistics.median(walls), statistics.median(cpus)
print(json.dumps(out))
"""

SAMPLER = """
import json, sys, time
import numpy as np
from tokenbatch.torch import TokenBudgetBatchSampler
lengths = np.load(sys.argv[1])
wall, cpu = time.perf_counter(), time.process_time()
sampler = TokenBudgetBatchSampler(lengths, 8192, num_replicas=8, rank=3)
batches = sum(1 for _ in sampler)
print(json.dumps({"sampler": time.perf_counter() - wall, "sampler_cpu": time.process_time() - cpu}))
"""
SCRIPTS = {
    "first": ("documents", FIRST),
    "warm": ("lognormal", WARM),
    "sampler": ("documents", SAMPLER),
}


def main(mode: str, rounds: int, sizes: list[int], builds: list[str]) -> None:
    envs: dict[str, dict[str, str]] = {}
    for build in builds:
        name, _, rest = build.partition("=")
        folder, *variables = rest.split(",")
        envs[name] = dict(os.environ, PYTHONPATH=folder)
        envs[name].update(variable.split("=", 1) for variable in variables)
    names = list(envs)
    sys.path.insert(0, envs[names[0]]["PYTHONPATH"])
    from tokenbatch.datasets import example_lengths

    kind, script = SCRIPTS[mode]
    with tempfile.TemporaryDirectory() as folder:
        for n in sizes:
            path = Path(folder) / f"lengths-{n}.npy"
            np.save(path, example_lengths(kind, n, max_length=8192, seed=0))
            times: dict[str, list[dict[str, float]]] = {name: [] for name in names}
            for round_ in range(rounds):
                for name in names if round_ % 2 == 0 else names[::-1]:
                    done = subprocess.run(
                        [sys.executable, "-c", script, str(path)],
                        env=envs[name],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    times[name].append(json.loads(done.stdout))
            print(f"{mode} n={n:,}, {rounds} rounds: median ms (min), median ratio to {names[0]}")
            for key in times[names[0]][0]:
                cells = []
                for name in names:
                    values = [t[key] for t in times[name]]
                    ratios = [
                        t[key] / b[key] for t, b in zip(times[name], times[names[0]], strict=True)
                    ]
                    cells.append(
                        f"{name} {statistics.median(values) * 1e3:.1f} ({min(values) * 1e3:.1f}) "
                        f"{statistics.median(ratios):.3f}"
                    )
                print(f"  {key:<16} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), [int(n) for n in sys.argv[3].split(",")], sys.argv[4:])
