"""Atomic groups and several budgets at once (``groups=``, :func:`tokenbatch.pack_costs`):
hypothesis properties and bad input."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokenbatch as tb
from tokenbatch.errors import InvalidTypeError, InvalidValueError, OversizeError


@st.composite
def grouped_lengths(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Lengths with distinct, unsorted group ids, each group a run of 1 to 4 sequences."""
    sizes = draw(st.lists(st.integers(1, 4), max_size=60))
    ids = draw(st.permutations(range(len(sizes)))) if sizes else []
    lengths, groups = [], []
    for size, gid in zip(sizes, ids, strict=True):
        lengths += draw(st.lists(st.integers(0, 60), min_size=size, max_size=size))
        groups += [gid * 13 - 40] * size
    return lengths, groups


def members_by_group(groups: list[int]) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for i, gid in enumerate(groups):
        found.setdefault(gid, []).append(i)
    return found


def check_groups(packing: tb.Packing, groups: list[int], kept: set[int]) -> None:
    """Every kept group in one bin, consecutively and in input order, once; nothing else."""
    placed = [int(i) for i in packing.indices]
    assert sorted(placed) == sorted(i for g in kept for i in members_by_group(groups)[g])
    where = {i: slot for slot, i in enumerate(placed)}
    offsets = packing.bin_offsets
    for gid in kept:
        members = members_by_group(groups)[gid]
        slots = [where[i] for i in members]
        assert slots == list(range(slots[0], slots[0] + len(members)))
        bin_index = int(np.searchsorted(offsets, slots[0], side="right")) - 1
        assert slots[-1] < offsets[bin_index + 1]


@given(
    grouped_lengths(),
    st.integers(1, 150),
    st.none() | st.integers(1, 8),
    st.sampled_from(["bfd", "ffd", "next_fit", "first_fit_shuffled"]),
)
def test_groups_whole_in_order_once_within_budget(
    data: tuple[list[int], list[int]], max_tokens: int, max_seqs: int | None, algorithm: str
) -> None:
    lengths, groups = data
    packing = tb.pack(
        lengths, max_tokens, groups=groups, max_seqs=max_seqs, oversize="drop", algorithm=algorithm
    )
    limit = max_seqs or len(lengths) + 1
    kept = {
        g
        for g, members in members_by_group(groups).items()
        if sum(lengths[i] for i in members) <= max_tokens and len(members) <= limit
    }
    check_groups(packing, groups, kept)
    assert (packing.bin_tokens <= max_tokens).all()
    assert all(len(b) <= limit for b in packing)
    dropped = len(lengths) - packing.n_segments
    assert packing.stats()["dropped_seqs"] == dropped

    padded = tb.batch_padded(lengths, max_tokens, groups=groups, max_seqs=max_seqs, oversize="drop")
    padded_kept = {
        g
        for g, members in members_by_group(groups).items()
        if len(members) * max(lengths[i] for i in members) <= max_tokens and len(members) <= limit
    }
    check_groups(padded, groups, padded_kept)
    for batch, cost in zip(padded, padded.bin_tokens, strict=True):
        assert cost == len(batch) * max(lengths[i] for i in batch) <= max_tokens


@given(
    st.lists(st.lists(st.integers(0, 40), min_size=3, max_size=3), max_size=120),
    st.lists(st.integers(1, 100), min_size=3, max_size=3),
    st.integers(1, 3),
    st.booleans(),
    st.none() | st.integers(1, 6),
    st.integers(1, 4),
)
def test_every_column_of_every_bin_within_its_budget(
    rows: list[list[int]],
    budgets: list[int],
    columns: int,
    grouped: bool,
    max_seqs: int | None,
    multiple: int,
) -> None:
    costs = np.array(rows, dtype=np.int64).reshape(len(rows), 3)[:, :columns]
    max_costs = budgets[:columns]
    max_costs[0] = max(max_costs[0], multiple)
    # Pairs (ids descending, so not sorted the way the input runs) or singletons.
    groups = [-(i // 2) for i in range(len(rows))] if grouped else list(range(len(rows)))
    packing = tb.pack_costs(
        costs,
        max_costs,
        groups=groups if grouped else None,
        max_seqs=max_seqs,
        pad_to_multiple_of=multiple,
        oversize="drop",
    )
    padded0 = -(-costs[:, 0] // multiple) * multiple
    charged = np.column_stack([padded0, costs[:, 1:]])
    limit = max_seqs or len(rows) + 1
    kept = {
        g
        for g, members in members_by_group(groups).items()
        if (charged[members].sum(axis=0) <= max_costs).all() and len(members) <= limit
    }
    check_groups(packing, groups, kept)
    for b in range(packing.n_bins):
        members = packing[b]
        assert len(members) <= limit
        assert (charged[members].sum(axis=0) <= max_costs).all()
        assert packing.bin_tokens[b] == charged[members, 0].sum()
    np.testing.assert_array_equal(packing.lengths, costs[packing.indices, 0])
    bound = (
        max(
            -(-int(charged[sorted(packing.indices), c].sum()) // max_costs[c])
            for c in range(columns)
        )
        if packing.n_segments
        else 0
    )
    assert packing.lower_bound >= bound
    assert packing.n_bins >= packing.lower_bound


def test_pairs_stay_together_where_ungrouped_packing_splits_them() -> None:
    lengths = [6, 5, 6, 5, 4, 4]
    loose = tb.pack(lengths, 11)
    assert any(set(b) not in ({0, 1}, {2, 3}, {4, 5}) for b in loose)
    paired = tb.pack(lengths, 11, groups=[0, 0, 1, 1, 2, 2])
    assert [list(b) for b in paired] == [[0, 1], [2, 3], [4, 5]]


BAD_INPUT: list[tuple[str, Any, type[Exception], str]] = [
    (
        "mismatched groups",
        lambda: tb.pack([1, 2, 3], 8, groups=[0, 0]),
        InvalidValueError,
        "groups has 2 ids for 3",
    ),
    (
        "group split",
        lambda: tb.pack([1, 2, 3], 8, groups=[4, 5, 4]),
        InvalidValueError,
        "group 4 is split across the input: sequences 0 and 2",
    ),
    (
        "group over budget",
        lambda: tb.pack([5, 5, 1], 8, groups=[7, 7, 8]),
        OversizeError,
        "group 7 (sequences 0 to 1, 2 sequences) costs 10 tokens, more than max_tokens=8",
    ),
    (
        "group over max_seqs",
        lambda: tb.pack([1, 1, 1], 8, groups=[7, 7, 7], max_seqs=2),
        OversizeError,
        "holds 3 sequences, more than max_seqs=2",
    ),
    (
        "split refused",
        lambda: tb.pack([1], 8, groups=[0], oversize="split"),
        InvalidValueError,
        "oversize='split' cannot be used with groups",
    ),
    (
        "negative length",
        lambda: tb.pack([1, -2], 8, groups=[0, 1]),
        InvalidValueError,
        "lengths[1] = -2 is negative",
    ),
    (
        "mismatched shapes",
        lambda: tb.pack_costs([[1, 2]], [5]),
        InvalidValueError,
        "costs has 2 columns but max_costs has 1 budgets",
    ),
    (
        "negative cost",
        lambda: tb.pack_costs([[1, 2], [3, -1]], [5, 5]),
        InvalidValueError,
        "costs[1, 1] = -1 is negative",
    ),
    (
        "zero budget column",
        lambda: tb.pack_costs([[1, 2]], [5, 0]),
        InvalidValueError,
        "max_costs[1] = 0",
    ),
    (
        "too many columns",
        lambda: tb.pack_costs([[1] * 9], [5] * 9),
        InvalidValueError,
        "1 to 8 columns",
    ),
    ("1-D costs", lambda: tb.pack_costs([1, 2], [5]), InvalidTypeError, "two-dimensional"),
    ("float costs", lambda: tb.pack_costs([[1.5, 2.0]], [5, 5]), InvalidTypeError, "integers"),
    (
        "cost over a budget",
        lambda: tb.pack_costs([[1, 2], [1, 9]], [5, 5]),
        OversizeError,
        "sequence 1 costs 9 in column 1, more than its budget max_costs[1]=5",
    ),
    (
        "costs group over a budget",
        lambda: tb.pack_costs([[1, 3], [1, 3]], [5, 5], groups=[2, 2]),
        OversizeError,
        "group 2 (sequences 0 to 1, 2 sequences) costs 6 in column 1",
    ),
    (
        "truncate refused",
        lambda: tb.pack_costs([[1, 3]], [5, 5], oversize="truncate"),
        InvalidValueError,
        "oversize='truncate' cannot be used with several budgets",
    ),
    (
        "costs groups mismatched",
        lambda: tb.pack_costs([[1, 3]], [5, 5], groups=[1, 2]),
        InvalidValueError,
        "groups has 2 ids for 1",
    ),
]


@pytest.mark.parametrize(
    ("case", "call", "error", "message"), BAD_INPUT, ids=[c[0] for c in BAD_INPUT]
)
def test_bad_input_raises_a_named_error(
    case: str, call: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, tb.TokenBatchError)
    assert message in str(raised.value), case


def test_dropped_groups_are_counted_whole() -> None:
    packing = tb.pack([5, 5, 1, 2], 8, groups=[7, 7, 8, 9], oversize="drop")
    assert sorted(packing.indices.tolist()) == [2, 3]
    stats = packing.stats()
    assert (stats["dropped_seqs"], stats["dropped_tokens"]) == (2, 10)
    costs = tb.pack_costs([[1, 9], [2, 1]], [5, 5], oversize="drop")
    assert costs.indices.tolist() == [1]
    assert costs.stats()["dropped_seqs"] == 1


def test_costs_pickle_and_report_the_largest_column_bound() -> None:
    costs = np.array([[10, 1]] * 10)
    packing = tb.pack_costs(costs, [1000, 2], pad_to_multiple_of=8)
    assert packing.n_bins == packing.lower_bound == 5
    assert packing.max_tokens == 1000
    assert packing.bin_tokens.tolist() == [32] * 5
    again = pickle.loads(pickle.dumps(packing))
    assert again.lower_bound == 5
    assert again.indices.tolist() == packing.indices.tolist()
