"""tokenbatch.context_parallel: the load-balanced split of a packed row over CP ranks,
checked against a plain reference written from the layout's definition."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenbatch import InvalidTypeError, InvalidValueError
from tokenbatch.context_parallel import ContextParallelShard, rank_major_order, shard


def reference_indices(cu_padded: list[int], cp_size: int, cp_rank: int) -> list[int]:
    """Each padded document cut into 2 * cp_size chunks; rank r takes r and 2cp-1-r."""
    indices: list[int] = []
    for start, end in itertools.pairwise(cu_padded):
        chunk = (end - start) // (2 * cp_size)
        for k in (cp_rank, 2 * cp_size - 1 - cp_rank):
            indices.extend(range(start + k * chunk, start + (k + 1) * chunk))
    return indices


def reference_local_real(real: list[int], padded: list[int], cp_size: int, rank: int) -> list[int]:
    """Cumulative real tokens per document on a rank, counted token by token."""
    cu = [0]
    mine = set(reference_indices(padded, cp_size, rank))
    for doc in range(len(padded) - 1):
        n_real = real[doc + 1] - real[doc]
        cu.append(cu[-1] + sum(1 for i in range(padded[doc], padded[doc] + n_real) if i in mine))
    return cu


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    cp_size = draw(st.integers(1, 5))
    real, padded = [0], [0]
    for length in draw(st.lists(st.integers(0, 50), max_size=10)):
        rounded = -(-length // (2 * cp_size)) * 2 * cp_size
        real.append(real[-1] + length)
        padded.append(padded[-1] + rounded + 2 * cp_size * draw(st.integers(0, 1)))
    return real, padded, cp_size


@settings(max_examples=100, deadline=None)
@given(layouts())
def test_shard_matches_the_reference(layout: tuple[list[int], list[int], int]) -> None:
    real, padded, cp_size = layout
    row = np.arange(padded[-1]) * 3 + 1
    gathered = []  # what an all-gather of every rank's tokens returns
    for rank in range(cp_size):
        part = shard(np.array(padded, dtype=np.int32), cp_size, rank, cu_seqlens=real)
        assert part.indices.tolist() == reference_indices(padded, cp_size, rank)
        assert part.cu_seqlens_padded.tolist() == [p // cp_size for p in padded]
        assert part.cu_seqlens.tolist() == reference_local_real(real, padded, cp_size, rank)
        gathered.extend(row[part.indices].tolist())
    order = rank_major_order(padded, cp_size)
    restored = np.full(len(row), -1)
    restored[order] = gathered
    assert restored.tolist() == row.tolist()


def test_two_ranks_by_hand() -> None:
    # Documents of 7 and 3 real tokens, padded to 8 and 4; cp_size 2 makes chunks of 2 and 1.
    first = shard([0, 8, 12], cp_size=2, cp_rank=0, cu_seqlens=[0, 7, 10])
    assert isinstance(first, ContextParallelShard)
    assert first.indices.tolist() == [0, 1, 6, 7, 8, 11]
    assert first.cu_seqlens.tolist() == [0, 3, 4]  # token 7 and token 11 are padding
    assert first.cu_seqlens_padded.tolist() == [0, 4, 6]
    assert repr(first) == "ContextParallelShard(tokens=6, documents=2)"
    with pytest.raises(ValueError, match="read-only"):
        first.indices[0] = 5
    assert shard([0, 8, 12], 1, 0).indices.tolist() == list(range(12))


def test_bad_layouts_name_the_problem() -> None:
    with pytest.raises(InvalidValueError, match=r"document 1 has 6 tokens .* multiple of 4"):
        shard([0, 4, 10], cp_size=2, cp_rank=0)
    with pytest.raises(InvalidValueError, match="cp_rank must be in"):
        shard([0, 4], cp_size=2, cp_rank=2)
    with pytest.raises(InvalidValueError, match="cp_size must be at least 1"):
        shard([0, 4], cp_size=0, cp_rank=0)
    with pytest.raises(InvalidValueError, match="5 real tokens"):
        shard([0, 4], cp_size=2, cp_rank=0, cu_seqlens=[0, 5])
    with pytest.raises(InvalidValueError, match="decreases"):
        rank_major_order([0, 4, 0], 1)
    with pytest.raises(InvalidTypeError, match="must hold integers"):
        shard([0.0, 4.0], cp_size=1, cp_rank=0)
