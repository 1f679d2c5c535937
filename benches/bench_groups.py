"""Atomic groups and several budgets: what they cost next to plain packing.

Full run (numbers in benches/RESULTS.md, packing section):
    TOKENBATCH_BENCH_FULL=1 pytest benches/bench_groups.py --benchmark-json=groups.json
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import sizes

import tokenbatch as tb
from tokenbatch.datasets import example_lengths

MAX_TOKENS = 8192
#: Budgets of the multimodal bench: language-model tokens, vision patches, images.
MAX_COSTS = [16_384, 32_768, 16]


@pytest.mark.parametrize("n", sizes([10_000_000], [10_000]))
@pytest.mark.parametrize("grouped", [False, True], ids=["ungrouped", "pairs"])
def test_pack_pairs(benchmark: Any, n: int, grouped: bool) -> None:
    """The same lengths packed alone and as pairs (groups of 2, ids in input order)."""
    lengths = example_lengths("lognormal", n, max_length=MAX_TOKENS // 2, seed=0)
    groups = np.arange(n, dtype=np.int64) // 2 if grouped else None
    benchmark.group = f"pack pairs n={n:,}"
    packing = benchmark(tb.pack, lengths, MAX_TOKENS, groups=groups)
    benchmark.extra_info.update(n_bins=packing.n_bins, lower_bound=packing.lower_bound)
    assert packing.n_segments == n


def multimodal_costs(n: int, seed: int = 0) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Tokens, vision patches and images of `n` items: chat-like text, and 30% of the
    items carry 1-4 images of 256-1,024 tokens each (4 patches per token)."""
    rng = np.random.default_rng(seed)
    text = example_lengths("chat", n, max_length=8192, seed=seed)
    images = np.where(rng.random(n) < 0.3, rng.integers(1, 5, n), 0)
    per_image = rng.integers(256, 1025, (n, 4))
    image_tokens = (per_image * (np.arange(4) < images[:, None])).sum(axis=1)
    return np.column_stack([text + image_tokens, 4 * image_tokens, images]).astype(np.int64)


def overflowing_bins(packing: tb.Packing, costs: np.ndarray[Any, Any]) -> int:
    """Bins over any budget of `MAX_COSTS` (packings have no empty bins)."""
    per_bin = np.add.reduceat(costs[packing.indices], packing.bin_offsets[:-1])
    return int((per_bin > np.array(MAX_COSTS)).any(axis=1).sum())


@pytest.mark.parametrize("n", sizes([1_000_000], [10_000]))
@pytest.mark.parametrize("how", ["three columns", "token column bfd"])
def test_pack_multimodal(benchmark: Any, n: int, how: str) -> None:
    costs = multimodal_costs(n)
    benchmark.group = f"multimodal n={n:,}"
    if how == "three columns":
        packing = benchmark(tb.pack_costs, costs, MAX_COSTS)
    else:
        tokens = np.ascontiguousarray(costs[:, 0])
        packing = benchmark(tb.pack, tokens, MAX_COSTS[0])
    column_bound = max(-(-int(costs[:, c].sum()) // MAX_COSTS[c]) for c in range(3))
    benchmark.extra_info.update(
        n_bins=packing.n_bins,
        column_bound=column_bound,
        bins_over_bound=packing.n_bins / column_bound,
        overflowing_bins=overflowing_bins(packing, costs),
    )
    if how == "three columns":
        assert overflowing_bins(packing, costs) == 0
        assert packing.n_bins <= 1.02 * column_bound


@pytest.mark.parametrize("n", sizes([1_000_000], [10_000]))
@pytest.mark.parametrize("how", ["three columns", "token column"])
def test_sampler_multimodal(benchmark: Any, n: int, how: str) -> None:
    """What a vision-language job pays before its first epoch on one rank of 8: the
    sampler built over the items' tokens, with their patches and images as extra costs
    (or on tokens alone), and this rank's batches iterated."""
    from tokenbatch.torch import TokenBudgetBatchSampler

    costs = multimodal_costs(n)
    tokens = np.ascontiguousarray(costs[:, 0])
    extra = {"extra_costs": costs[:, 1:], "max_extra_costs": MAX_COSTS[1:]}
    options = extra if how == "three columns" else {}
    benchmark.group = f"multimodal sampler n={n:,}"

    def construct_and_iterate() -> int:
        sampler = TokenBudgetBatchSampler(tokens, MAX_COSTS[0], num_replicas=8, rank=3, **options)
        return sum(1 for _ in sampler)

    count = benchmark.pedantic(construct_and_iterate, rounds=3, iterations=1)
    column_bound = max(-(-int(costs[:, c].sum()) // MAX_COSTS[c]) for c in range(3))
    assert count * 8 >= column_bound
