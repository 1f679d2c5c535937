"""Context-parallel split of a packed row: which tokens each CP rank takes.

Full run (numbers in benches/RESULTS.md):
    TOKENBATCH_BENCH_FULL=1 pytest benches/bench_context_parallel.py --benchmark-enable
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from conftest import sizes

import tokenbatch as tb
from tokenbatch.context_parallel import shard
from tokenbatch.datasets import example_lengths

CP_SIZE = 8
ROW_TOKENS = sizes([131_072, 1_048_576], [16_384])


def padded_offsets(row_tokens: int, distribution: str) -> npt.NDArray[np.int64]:
    """``cu_seqlens_padded`` of a typical bin (the median number of documents) of a
    packing padded for CP, documents of at most 8,192 tokens."""
    lengths = example_lengths(distribution, 200_000, max_length=8192, seed=0)
    multiple = 2 * CP_SIZE
    packing = tb.pack(lengths, row_tokens, pad_to_multiple_of=multiple)
    counts = np.diff(packing.bin_offsets)
    typical = int(np.flatnonzero(counts == np.sort(counts)[(len(counts) - 1) // 2])[0])
    segments = packing.lengths[packing.bin_offsets[typical] : packing.bin_offsets[typical + 1]]
    padded = -(-segments // multiple) * multiple
    return np.concatenate([[0], np.cumsum(padded)])


def python_loop(cu_padded: npt.NDArray[np.int64], cp_size: int, cp_rank: int) -> torch.Tensor:
    """What CP code does by hand today: two ``arange`` per document, then a ``cat``."""
    chunks = 2 * cp_size
    pieces = []
    for start, end in zip(cu_padded[:-1].tolist(), cu_padded[1:].tolist(), strict=True):
        chunk = (end - start) // chunks
        for k in (cp_rank, chunks - 1 - cp_rank):
            pieces.append(torch.arange(start + k * chunk, start + (k + 1) * chunk))
    return torch.cat(pieces)


def numpy_vectorized(
    cu_padded: npt.NDArray[np.int64], cp_size: int, cp_rank: int
) -> npt.NDArray[np.int64]:
    """A careful numpy version: both chunks of every document from one ``repeat``."""
    chunk = np.diff(cu_padded) // (2 * cp_size)
    firsts = np.stack(
        [cu_padded[:-1] + cp_rank * chunk, cu_padded[:-1] + (2 * cp_size - 1 - cp_rank) * chunk],
        axis=1,
    ).ravel()
    counts = np.repeat(chunk, 2)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(firsts, counts) + offsets


IMPLEMENTATIONS = {
    "tokenbatch (Rust)": lambda cu, rank: shard(cu, CP_SIZE, rank).indices,
    "numpy vectorized": lambda cu, rank: numpy_vectorized(cu, CP_SIZE, rank),
    "python loop (torch.arange per document)": lambda cu, rank: python_loop(cu, CP_SIZE, rank),
}


@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("distribution", ["lognormal", "chat"])
@pytest.mark.parametrize("row_tokens", ROW_TOKENS)
def test_cp_shard_indices(
    benchmark: Any, implementation: str, distribution: str, row_tokens: int
) -> None:
    cu_padded = padded_offsets(row_tokens, distribution)
    split = IMPLEMENTATIONS[implementation]
    benchmark.group = f"cp shard {distribution} row={row_tokens:,}"
    indices = benchmark(split, cu_padded, CP_SIZE - 1)
    benchmark.extra_info.update(
        row_tokens=int(cu_padded[-1]), documents=len(cu_padded) - 1, cp_size=CP_SIZE
    )
    expected = shard(cu_padded, CP_SIZE, CP_SIZE - 1).indices
    np.testing.assert_array_equal(np.asarray(indices), expected)
