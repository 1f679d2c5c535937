"""TokenBudgetBatchSampler under several budgets at once: every column of every batch
within its budget, every sequence once per epoch over the ranks, resumes and resizes."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from resized_runs import batches_over_runs

from tokenbatch.errors import InvalidTypeError, InvalidValueError, OversizeError
from tokenbatch.mixture import Mixture
from tokenbatch.schedule import Piecewise
from tokenbatch.torch import TokenBudgetBatchSampler

MAX_TOKENS = 1024


def vision_items(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Text tokens, and (patches, images) of every item: 30% carry 1-4 images."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 600, n)
    images = np.where(rng.random(n) < 0.3, rng.integers(1, 5, n), 0)
    patches = images * rng.integers(64, 257, n)
    return lengths, np.column_stack([patches, images])


def check_batches(
    batches: list[list[int]], lengths: np.ndarray, costs: np.ndarray, budgets: list[int]
) -> None:
    """Every sequence once; tokens and every extra column of every batch in budget."""
    assert Counter(i for batch in batches for i in batch) == Counter(range(len(lengths)))
    for batch in batches:
        assert lengths[batch].sum() <= MAX_TOKENS
        assert (costs[batch].sum(axis=0) <= budgets).all(), costs[batch].sum(axis=0)


def sampler(
    lengths: Any, costs: Any, budgets: Any, replicas: int, rank: int, **options: Any
) -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler(
        lengths,
        MAX_TOKENS,
        num_replicas=replicas,
        rank=rank,
        extra_costs=costs,
        max_extra_costs=budgets,
        **options,
    )


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 700), st.integers(0, 300), st.integers(0, 3)),
        min_size=8,
        max_size=150,
    ),
    budgets=st.tuples(st.integers(300, 900), st.integers(3, 8)),
    replicas=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    balance=st.sampled_from(["attention", "tokens", None]),
)
def test_every_budget_holds_and_every_sequence_is_used_once(
    rows: list[tuple[int, int, int]],
    budgets: tuple[int, int],
    replicas: int,
    seed: int,
    balance: str | None,
) -> None:
    matrix = np.array(rows, dtype=np.int64)
    lengths, costs = matrix[:, 0], matrix[:, 1:]
    options: dict[str, Any] = {"seed": seed, "balance": balance}
    ranks = [
        list(sampler(lengths, costs, budgets, replicas, r, **options)) for r in range(replicas)
    ]
    assert len({len(batches) for batches in ranks}) == 1
    check_batches([b for batches in ranks for b in batches], lengths, costs, list(budgets))
    # The same plan on every construction: ranks need no communication.
    assert list(sampler(lengths, costs, budgets, replicas, 0, **options)) == ranks[0]


def test_the_batches_are_those_of_pack_costs_and_pack_tighter_than_tokens_alone() -> None:
    import tokenbatch as tb

    lengths, costs = vision_items(3000, seed=1)
    budgets = [2048, 8]
    batches = list(sampler(lengths, costs, budgets, 1, 0, shuffle=False, balance=None))
    packing = tb.pack_costs(np.column_stack([lengths, costs]), [MAX_TOKENS, *budgets])
    assert sorted(map(sorted, batches)) == sorted(sorted(b.tolist()) for b in packing)
    # Packed on the tokens alone, batches overflow the image budgets.
    by_tokens = TokenBudgetBatchSampler(lengths, MAX_TOKENS, num_replicas=1, rank=0)
    overflowing = [b for b in by_tokens if (costs[b].sum(axis=0) > budgets).any()]
    assert overflowing


def test_a_sequence_over_an_extra_budget_is_dropped_and_counted() -> None:
    lengths, costs = vision_items(400, seed=5)
    costs[[3, 17], 1] = 9  # more images than a batch takes
    ranks = [sampler(lengths, costs, [2048, 8], 2, r, oversize="drop") for r in range(2)]
    used = Counter(i for each in ranks for batch in each for i in batch)
    assert used == Counter(set(range(400)) - {3, 17})
    assert ranks[0].stats()["dropped_seqs"] == 2


@pytest.mark.parametrize("runs", [[(4, 3), (3, None)], [(2, 5), (3, 2), (5, None)]])
def test_resume_and_resize_keep_every_budget_and_use_each_sequence_once(
    runs: list[tuple[int, int | None]],
) -> None:
    lengths, costs = vision_items(1500, seed=2)
    budgets = [2048, 8]
    batches = batches_over_runs(
        lambda replicas, rank: sampler(lengths, costs, budgets, replicas, rank), runs
    )
    check_batches(batches, lengths, costs, budgets)


def test_a_resumed_epoch_continues_exactly_and_other_costs_are_refused() -> None:
    lengths, costs = vision_items(800, seed=3)
    budgets = [2048, 8]
    first = sampler(lengths, costs, budgets, 2, 1)
    whole = list(first)
    iterator = iter(first)
    done = [next(iterator) for _ in range(5)]
    state = first.state_dict()
    resumed = sampler(lengths, costs, budgets, 2, 1)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # a state survives JSON
    assert done + list(resumed) == whole
    other = costs.copy()
    other[0, 1] += 1
    for mismatched in (
        sampler(lengths, other, budgets, 2, 1),
        sampler(lengths, costs, [2048, 9], 2, 1),
        TokenBudgetBatchSampler(lengths, MAX_TOKENS, num_replicas=2, rank=1),
    ):
        with pytest.raises(InvalidValueError):
            mismatched.load_state_dict(state)
    copy = pickle.loads(pickle.dumps(first))
    assert list(copy) == whole
    assert np.array_equal(copy.extra_costs, costs)
    assert copy.max_extra_costs == (2048, 8)


def test_bad_costs_raise_named_errors() -> None:
    lengths, costs = vision_items(20, seed=4)
    budgets = [2048, 8]
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"extra_costs": costs}, InvalidValueError, "go together"),
        ({"max_extra_costs": budgets}, InvalidValueError, "go together"),
        ({"extra_costs": costs[:5], "max_extra_costs": budgets}, InvalidValueError, "5 rows"),
        ({"extra_costs": costs, "max_extra_costs": [9]}, InvalidValueError, "one budget per"),
        ({"extra_costs": costs, "max_extra_costs": 9}, InvalidTypeError, "sequence of budgets"),
        ({"extra_costs": costs, "max_extra_costs": [2048, 0]}, InvalidValueError, "max_extra"),
        ({"extra_costs": costs[:, 0], "max_extra_costs": [9]}, InvalidTypeError, "two-dim"),
        (
            {"extra_costs": np.zeros((20, 8), np.int64), "max_extra_costs": [1] * 8},
            InvalidValueError,
            "1 to 7",
        ),
        ({"extra_costs": -costs, "max_extra_costs": budgets}, InvalidValueError, "negative"),
        ({"extra_costs": costs, "max_extra_costs": [10, 8]}, OversizeError, "column"),
    ]
    for options, error, message in cases:
        with pytest.raises(error, match=message):
            TokenBudgetBatchSampler(lengths, MAX_TOKENS, num_replicas=1, rank=0, **options)
    given = {"extra_costs": costs, "max_extra_costs": budgets}
    for option, value in [
        ("mode", "padded"),
        ("algorithm", "first_fit_shuffled"),
        ("oversize", "split"),
    ]:
        with pytest.raises(InvalidValueError, match=f"cannot be combined with {option}="):
            TokenBudgetBatchSampler(
                lengths, MAX_TOKENS, num_replicas=1, rank=0, **given, **{option: value}
            )
    with pytest.raises(InvalidValueError, match="cannot be combined with a mixture"):
        TokenBudgetBatchSampler(
            {"a": lengths[:10], "b": lengths[10:]},
            MAX_TOKENS,
            num_replicas=1,
            rank=0,
            mixture=Mixture({"a": 0.5, "b": 0.5}),
            schedule=Piecewise([(0, 4096)]),
            **given,
        )
