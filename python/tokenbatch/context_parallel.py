"""Context parallelism over packed rows: which tokens each rank of a CP group processes.

A packed row holds documents one after another, each padded to a multiple of
``2 * cp_size`` (``tokenbatch.torch.PackedCollator(pad_each_to_multiple_of=2 * cp_size)``
builds such rows). Causal attention costs more for later tokens, so the load-balanced
split cuts every padded document into ``2 * cp_size`` equal chunks and gives rank ``r``
chunks ``r`` and ``2 * cp_size - 1 - r``: every rank gets the same attention work. This is
the THD layout of Transformer Engine's context parallelism (its
``thd_get_partitioned_indices``), computed here in the Rust core, with numpy only::

    from tokenbatch.context_parallel import shard

    part = shard(cu_seqlens_padded, cp_size=2, cp_rank=0, cu_seqlens=cu_seqlens)
    input_ids[part.indices]  # this rank's tokens

``tokenbatch.torch.ContextParallelCollator`` applies it to whole batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_int, as_lengths
from tokenbatch._core import ContextParallelShard

__all__ = ["ContextParallelShard", "rank_major_order", "shard"]


def _offsets(values: Any, name: str) -> npt.NDArray[np.int64]:
    if hasattr(values, "detach"):  # a torch tensor, possibly on a GPU
        values = values.detach().cpu().numpy()
    return np.ascontiguousarray(as_lengths(values, name), dtype=np.int64)


def shard(
    cu_seqlens_padded: Any,
    cp_size: int,
    cp_rank: int,
    *,
    cu_seqlens: Any = None,
) -> ContextParallelShard:
    """The part of a packed row that rank ``cp_rank`` of a CP group of ``cp_size`` processes.

    ``cu_seqlens_padded`` holds the offsets of the documents in the row, ``[0, p0, p0 + p1,
    ...]``, where each padded length ``p`` is a multiple of ``2 * cp_size``;
    ``cu_seqlens`` the cumulative real lengths (real tokens come first in each padded
    document; default: no padding). Lists, numpy arrays and tensors of integers are read.

    Returns a :class:`ContextParallelShard`: ``indices`` (the row positions this rank
    takes, ``len(row) // cp_size`` of them), ``cu_seqlens`` and ``cu_seqlens_padded`` of
    the rank's own tokens (what Transformer Engine computes inside its attention as
    ``get_cu_seqlens_on_cp_rank`` and ``cu_seqlens_padded // cp_size``). A layout that
    cannot be split (a padded length not a multiple of ``2 * cp_size``, more real than
    padded tokens, offsets that decrease) raises ``InvalidValueError``.
    """
    padded = _offsets(cu_seqlens_padded, "cu_seqlens_padded")
    real = padded if cu_seqlens is None else _offsets(cu_seqlens, "cu_seqlens")
    size = as_int(cp_size, "cp_size", minimum=1)
    return _core.cp_shard(real, padded, size, as_int(cp_rank, "cp_rank"))


def rank_major_order(cu_seqlens_padded: Any, cp_size: int) -> npt.NDArray[np.int64]:
    """Row positions of the tokens of all ranks, their shards concatenated in rank order.

    After an all-gather of per-rank shards (rank 0's tokens, then rank 1's, ...), ``row[order]
    = gathered`` puts every token back at its place in the padded row; ``row[order]`` is
    also the gathered layout of a full row.
    """
    padded = _offsets(cu_seqlens_padded, "cu_seqlens_padded")
    return _core.cp_rank_major_order(padded, as_int(cp_size, "cp_size", minimum=1))
