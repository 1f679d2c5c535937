"""Benchmarks of the distributed batch sampler: epoch plans, iteration and resume.

Full run (numbers in benches/RESULTS.md), 10,000,000 sequences on 8 ranks::

    TOKENBATCH_BENCH_FULL=1 pytest benches/bench_sampler.py --benchmark-enable \
        --benchmark-columns=min,mean,max,rounds

Without TOKENBATCH_BENCH_FULL=1 every benchmark runs on 100,000 sequences (smoke test).
The pure-Python baseline builds the same kind of plan (costs per bin, sort by cost, deal
into steps, shuffle steps) with lists and ``random``, from the same packing.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from conftest import FULL

from tokenbatch import Packing, pack
from tokenbatch.datasets import example_lengths
from tokenbatch.distribute import Planner
from tokenbatch.torch import TokenBudgetBatchSampler

N_SEQS = 10_000_000 if FULL else 100_000
MAX_TOKENS = 8192
RANKS = 8


_cache: dict[int, tuple[np.ndarray, Packing]] = {}


def lengths_and_packing(n: int) -> tuple[np.ndarray, Packing]:
    if n not in _cache:
        lengths = example_lengths("lognormal", n, max_length=MAX_TOKENS, seed=0)
        _cache[n] = (lengths, pack(lengths, MAX_TOKENS))
    return _cache[n]


def python_plan(bins: list[list[int]], lengths: list[int], ranks: int, seed: int) -> list[Any]:
    """A straightforward pure-Python planner: the baseline."""
    costs = [sum(lengths[i] * lengths[i] for i in b) for b in bins]
    order = sorted(range(len(bins)), key=lambda b: -costs[b])
    while len(order) % ranks:  # the baseline drops the remainder
        order.pop()
    steps = [order[s : s + ranks] for s in range(0, len(order), ranks)]
    rng = random.Random(seed)
    rng.shuffle(steps)
    for step in steps:
        rng.shuffle(step)
    return steps


def test_epoch_plan_from_packing(benchmark: Any) -> None:
    """Everything that depends on the packing and the ranks: splitting, costs, dealing."""
    _, packing = lengths_and_packing(N_SEQS)

    def build() -> int:
        return Planner(packing, RANKS, seed=1).plan(3).n_steps

    n_steps = benchmark.pedantic(build, rounds=5, iterations=1, warmup_rounds=1)
    assert n_steps * RANKS >= len(packing)


def test_epoch_plan_next_epoch(benchmark: Any) -> None:
    """What ``set_epoch`` costs once the packing-dependent work is cached."""
    _, packing = lengths_and_packing(N_SEQS)
    planner = Planner(packing, RANKS, seed=1)
    epochs = iter(range(1, 10**6))
    plan = benchmark(lambda: planner.plan(next(epochs)))
    assert plan.n_steps * RANKS >= len(packing)


def test_sampler_construction_with_packing(benchmark: Any) -> None:
    """Sampler construction from raw lengths: BFD packing (Rust) plus the epoch-0 plan."""
    lengths, packing = lengths_and_packing(N_SEQS)

    def build() -> int:
        return len(TokenBudgetBatchSampler(lengths, MAX_TOKENS, num_replicas=RANKS, rank=0))

    n_steps = benchmark.pedantic(build, rounds=3, iterations=1)
    assert n_steps * RANKS >= len(packing)


def test_python_baseline_plan(benchmark: Any) -> None:
    lengths, packing = lengths_and_packing(N_SEQS)
    bins = [b.tolist() for b in packing]
    length_list = lengths.tolist()
    steps = benchmark.pedantic(
        python_plan, args=(bins, length_list, RANKS, 1), rounds=3, iterations=1
    )
    assert len(steps) == len(bins) // RANKS


def test_iteration_per_batch(benchmark: Any) -> None:
    """One rank's whole epoch; divide the time by ``n_steps`` for the per-batch cost."""
    lengths, _ = lengths_and_packing(N_SEQS)
    sampler = TokenBudgetBatchSampler(lengths, MAX_TOKENS, num_replicas=RANKS, rank=3)

    def iterate() -> int:
        count = 0
        for _ in sampler:
            count += 1
        return count

    count = benchmark.pedantic(iterate, rounds=3, iterations=1)
    assert count == len(sampler)
    if not benchmark.disabled:
        benchmark.extra_info["n_steps"] = count
        benchmark.extra_info["us_per_batch"] = benchmark.stats.stats.mean / count * 1e6


def test_python_baseline_iteration_per_batch(benchmark: Any) -> None:
    lengths, packing = lengths_and_packing(N_SEQS)
    bins = [b.tolist() for b in packing]
    steps = python_plan(bins, lengths.tolist(), RANKS, 1)

    def iterate() -> int:
        count = 0
        for step in steps:
            batch = list(bins[step[3]])
            count += len(batch) > 0
        return count

    count = benchmark.pedantic(iterate, rounds=3, iterations=1)
    assert count == len(steps)


def test_resume_mid_epoch(benchmark: Any) -> None:
    """Load a mid-epoch state of a new epoch and get the first batch: the epoch plan is
    recomputed and skipped into, nothing is replayed."""
    lengths, _ = lengths_and_packing(N_SEQS)
    sampler = TokenBudgetBatchSampler(lengths, MAX_TOKENS, num_replicas=RANKS, rank=0)
    state = sampler.state_dict()
    middle = len(sampler) // 2
    epochs = iter(range(1, 10**6))

    def resume() -> tuple[int, list[int]]:
        epoch = next(epochs)
        sampler.load_state_dict({**state, "epoch": epoch, "step": middle})
        batch: list[int] = next(iter(sampler))  # type: ignore[assignment]
        return epoch, batch

    epoch, batch = benchmark.pedantic(resume, rounds=3, iterations=1)
    planner = Planner(pack(lengths, MAX_TOKENS), RANKS)
    assert batch == next(planner.plan(epoch).batches(0, middle))
