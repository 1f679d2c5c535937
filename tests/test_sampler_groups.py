"""TokenBudgetBatchSampler with atomic groups: every group served whole, once, to one rank
in one batch, on any world size, after resumes and resizes."""

from __future__ import annotations

import itertools
import pickle
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from resized_runs import batches_over_runs

import tokenbatch as tb
from tokenbatch.errors import InvalidValueError
from tokenbatch.mixture import Mixture
from tokenbatch.schedule import Piecewise
from tokenbatch.torch import TokenBudgetBatchSampler


def pair_ids(n: int, sizes: list[int]) -> np.ndarray:
    """Group ids for ``n`` sequences in groups of the given sizes, ids scrambled (neither
    sorted nor contiguous)."""
    ids = np.repeat(np.arange(len(sizes)), sizes)[:n]
    return (ids * 7919 + 13) % 1_000_003 - 500_000


def check_groups(batches: list[list[int]], ids: np.ndarray) -> None:
    """Each group's members in one batch, consecutive, in input order; every sequence once."""
    used = Counter(i for batch in batches for i in batch)
    assert used == Counter(range(len(ids)))
    for batch in batches:
        for a, b in itertools.pairwise(batch):
            if ids[a] == ids[b]:
                assert b == a + 1, "a group's members keep their input order"
        members = Counter(int(ids[i]) for i in batch)
        for group, count in members.items():
            assert count == int((ids == group).sum()), f"group {group} cut across batches"


def every_rank(lengths: Any, ids: np.ndarray, replicas: int, **options: Any) -> list[Any]:
    return [
        list(
            TokenBudgetBatchSampler(
                lengths, 256, num_replicas=replicas, rank=rank, groups=ids, **options
            )
        )
        for rank in range(replicas)
    ]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=150),
    sizes=st.lists(st.integers(1, 4), min_size=150, max_size=150),
    replicas=st.integers(1, 6),
    mode=st.sampled_from(["packed", "padded"]),
    seed=st.integers(0, 2**32),
)
def test_groups_are_whole_once_and_steps_equal_on_every_rank(
    lengths: list[int], sizes: list[int], replicas: int, mode: str, seed: int
) -> None:
    ids = pair_ids(len(lengths), sizes)
    try:
        ranks = every_rank(lengths, ids, replicas, mode=mode, seed=seed)
    except InvalidValueError as error:
        refused = str(error)
    else:
        refused = ""
    if refused:
        # Fewer groups than ranks need batches: refused at construction, never uneven.
        assert "only between atomic groups" in refused
        return
    assert len({len(batches) for batches in ranks}) == 1
    check_groups([batch for batches in ranks for batch in batches], ids)


@pytest.mark.parametrize("runs", [[(4, 3), (3, None)], [(3, 5), (2, 2), (5, None)]])
def test_resume_and_resize_keep_groups_whole_and_use_each_once(
    runs: list[tuple[int, int | None]],
) -> None:
    lengths = tb.datasets.example_lengths("chat", 1200, max_length=500, seed=4)
    ids = pair_ids(len(lengths), [2] * 600)  # preference pairs
    batches = batches_over_runs(
        lambda replicas, rank: TokenBudgetBatchSampler(
            lengths, 1024, num_replicas=replicas, rank=rank, groups=ids
        ),
        runs,
    )
    check_groups(batches, ids)


def test_a_bin_is_cut_only_between_groups_to_feed_every_rank() -> None:
    # One bin of two pairs: two ranks get one pair each; four ranks cannot be fed.
    lengths, ids = [10, 10, 10, 10], [5, 5, 9, 9]
    ranks = every_rank(lengths, np.array(ids), 2)
    assert [batches for batches in ranks] in ([[[0, 1]], [[2, 3]]], [[[2, 3]], [[0, 1]]])
    with pytest.raises(InvalidValueError, match="only between atomic groups"):
        TokenBudgetBatchSampler(lengths, 256, num_replicas=4, rank=0, groups=ids)


def test_state_of_other_groups_is_refused_and_the_sampler_pickles() -> None:
    lengths = [30] * 40
    ids = pair_ids(40, [2] * 20)
    sampler = TokenBudgetBatchSampler(lengths, 256, num_replicas=2, rank=0, groups=ids)
    state = sampler.state_dict()
    other = TokenBudgetBatchSampler(lengths, 256, num_replicas=2, rank=0, groups=ids[::-1].copy())
    with pytest.raises(InvalidValueError):
        other.load_state_dict(state)
    ungrouped = TokenBudgetBatchSampler(lengths, 256, num_replicas=2, rank=0)
    with pytest.raises(InvalidValueError):
        ungrouped.load_state_dict(state)
    copy = pickle.loads(pickle.dumps(sampler))
    assert list(copy) == list(sampler)
    assert np.array_equal(copy.groups, ids)


def test_bad_groups_raise_named_errors() -> None:
    lengths = [10, 10, 10]
    with pytest.raises(InvalidValueError, match="groups has 2 ids for 3 sequences"):
        TokenBudgetBatchSampler(lengths, 256, num_replicas=1, rank=0, groups=[1, 1])
    with pytest.raises(InvalidValueError, match="split"):
        TokenBudgetBatchSampler(
            lengths, 256, num_replicas=1, rank=0, groups=[1, 1, 2], oversize="split"
        )
    with pytest.raises(InvalidValueError, match="consecutive"):
        TokenBudgetBatchSampler(lengths, 256, num_replicas=1, rank=0, groups=[1, 2, 1])
    with pytest.raises(InvalidValueError, match="mixture"):
        TokenBudgetBatchSampler(
            {"a": lengths},
            256,
            num_replicas=1,
            rank=0,
            groups=[1, 1, 2],
            mixture=Mixture({"a": 1.0}),
            schedule=Piecewise([(0, 512)]),
        )
