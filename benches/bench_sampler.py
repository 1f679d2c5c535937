"""Benchmarks of the distributed batch sampler: epoch deals, iteration and resume.

Full run (numbers in benches/RESULTS.md), 10,000,000 heavy-tailed sequences on 8 ranks::

    TOKENBATCH_BENCH_FULL=1 pytest benches/bench_sampler.py --benchmark-enable \
        --benchmark-columns=min,median,max,rounds

Without TOKENBATCH_BENCH_FULL=1 every benchmark runs on 100,000 sequences (smoke test).
Lengths: the ``documents`` example (Pareto tail, many sequences at the cap) capped at
8,192 tokens, ``max_tokens=8192``. The pure-Python baseline builds the same kind of deal
(costs per bin, sort by cost, deal into steps, shuffle steps) with lists and ``random``,
from the same packing.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from conftest import FULL

from tokenbatch import Packing, pack
from tokenbatch.datasets import example_lengths
from tokenbatch.distribute import Dealer
from tokenbatch.mixture import Mixture
from tokenbatch.schedule import LinearRamp, Piecewise
from tokenbatch.torch import TokenBudgetBatchSampler

N_SEQS = 10_000_000 if FULL else 100_000
MAX_TOKENS = 8192
RANKS = 8


_cache: dict[int, tuple[np.ndarray, Packing]] = {}


def lengths_and_packing(n: int) -> tuple[np.ndarray, Packing]:
    if n not in _cache:
        lengths = example_lengths("documents", n, max_length=MAX_TOKENS, seed=0)
        _cache[n] = (lengths, pack(lengths, MAX_TOKENS))
    return _cache[n]


def python_deal(bins: list[list[int]], lengths: list[int], ranks: int, seed: int) -> list[Any]:
    """A straightforward pure-Python dealer: the baseline."""
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


def test_pack_alone(benchmark: Any) -> None:
    """``tb.pack`` of the same lengths: the yardstick of the sampler's start-up."""
    lengths, _ = lengths_and_packing(N_SEQS)
    benchmark.group = "sampler start-up"
    packing = benchmark.pedantic(pack, args=(lengths, MAX_TOKENS), rounds=5, iterations=1)
    assert packing.n_segments == N_SEQS


def _time_one_rank_epoch(benchmark: Any, lengths: Any, **options: Any) -> int:
    """Time building a sampler of rank 3 and iterating its epoch; the batches it yields."""
    benchmark.group = "sampler start-up"

    def construct_and_iterate() -> int:
        sampler = TokenBudgetBatchSampler(
            lengths, MAX_TOKENS, num_replicas=RANKS, rank=3, **options
        )
        return sum(1 for _ in sampler)

    count: int = benchmark.pedantic(construct_and_iterate, rounds=5, iterations=1)
    return count


def test_sampler_construction_and_one_rank_epoch(benchmark: Any) -> None:
    """What a job pays before and during its first epoch on one rank: packing, the
    epoch-0 deal, and iterating all of this rank's batches."""
    lengths, packing = lengths_and_packing(N_SEQS)
    count = _time_one_rank_epoch(benchmark, lengths)
    assert count * RANKS >= packing.n_bins


def test_mixture_construction_and_one_rank_epoch(benchmark: Any) -> None:
    """The same for a mixture of the same lengths as three sources (half, 30% and 20% of
    them, in those token shares), steps of 4M tokens: composing every step, packing and
    dealing each, and iterating this rank's batches. ``renormalize`` runs the pass until
    every sequence is used, as the single-source epoch does."""
    lengths, packing = lengths_and_packing(N_SEQS)
    cuts = [0, N_SEQS // 2, N_SEQS * 8 // 10, N_SEQS]
    sources = {name: lengths[cuts[i] : cuts[i + 1]] for i, name in enumerate(("a", "b", "c"))}
    mixture = Mixture({"a": 0.5, "b": 0.3, "c": 0.2}, exhausted="renormalize")
    schedule = Piecewise([(0, 1 << 22)])
    count = _time_one_rank_epoch(benchmark, sources, mixture=mixture, schedule=schedule)
    assert count * RANKS >= packing.n_bins


def test_epoch_deal_from_packing(benchmark: Any) -> None:
    """Everything that depends on the packing and the ranks: cutting, costs, order."""
    _, packing = lengths_and_packing(N_SEQS)

    def build() -> int:
        return Dealer(packing, RANKS, seed=1).deal(3).n_steps

    n_steps = benchmark.pedantic(build, rounds=5, iterations=1, warmup_rounds=1)
    assert n_steps * RANKS >= packing.n_bins


def test_epoch_deal_next_epoch(benchmark: Any) -> None:
    """What ``set_epoch`` costs once the packing-dependent work is cached."""
    _, packing = lengths_and_packing(N_SEQS)
    dealer = Dealer(packing, RANKS, seed=1)
    epochs = iter(range(1, 10**6))
    deal = benchmark(lambda: dealer.deal(next(epochs)))
    assert deal.n_steps * RANKS >= packing.n_bins


def test_python_baseline_deal(benchmark: Any) -> None:
    lengths, packing = lengths_and_packing(N_SEQS)
    bins = [b.tolist() for b in packing]
    length_list = lengths.tolist()
    steps = benchmark.pedantic(
        python_deal, args=(bins, length_list, RANKS, 1), rounds=3, iterations=1
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
    steps = python_deal(bins, lengths.tolist(), RANKS, 1)

    def iterate() -> int:
        count = 0
        for step in steps:
            batch = list(bins[step[3]])
            count += len(batch) > 0
        return count

    count = benchmark.pedantic(iterate, rounds=3, iterations=1)
    assert count == len(steps)


def test_resume_mid_epoch(benchmark: Any) -> None:
    """Load a mid-epoch state of a new epoch and get the first batch: the epoch deal is
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
    dealer = Dealer(pack(lengths, MAX_TOKENS), RANKS)
    assert batch == next(dealer.deal(epoch).batches(0, middle))


@pytest.mark.parametrize("epoch", [1, 100])
def test_step_offsets_at_epoch(benchmark: Any, epoch: int) -> None:
    """Optimizer steps under a schedule at a late epoch cost what they cost at epoch 1:
    the tokens of earlier epochs come from a closed form, not from their deals."""
    lengths, _ = lengths_and_packing(N_SEQS)
    ramp = LinearRamp(MAX_TOKENS, 64 * MAX_TOKENS, 50 * int(lengths.sum()), unit="tokens")
    sampler = TokenBudgetBatchSampler(
        lengths, MAX_TOKENS, num_replicas=RANKS, rank=0, schedule=ramp
    )

    def at_epoch() -> tuple[tuple[TokenBudgetBatchSampler], dict[str, Any]]:
        # Steps are cached per epoch: fill the cache with another epoch's, then come back
        # with this epoch's deal built, so that the round times the step grouping alone.
        sampler.set_epoch(epoch + 1)
        sampler.step_offsets()
        sampler.set_epoch(epoch)
        sampler.plan()
        return (sampler,), {}

    offsets = benchmark.pedantic(
        TokenBudgetBatchSampler.step_offsets, setup=at_epoch, rounds=5, iterations=1
    )
    assert offsets is not None
    assert offsets[-1] == len(sampler)
