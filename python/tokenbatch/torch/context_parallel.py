"""Context-parallel batches: each rank of a CP group takes its load-balanced part of a
packed row (see :mod:`tokenbatch.context_parallel` for the split itself)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from tokenbatch._convert import as_int
from tokenbatch.context_parallel import rank_major_order, shard
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.torch.collate import PackedCollator

__all__ = ["ContextParallelCollator", "shard_batch", "unshard"]

#: Per-token tensors of shape ``[1, total_tokens]`` that a shard cuts.
TOKEN_KEYS = ("input_ids", "labels", "shift_labels", "position_ids", "seq_idx")
#: Keys that describe the whole row for kernels without context parallelism.
_ROW_LAYOUT_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def shard_batch(
    batch: Mapping[str, Any], cp_size: int, cp_rank: int, *, ignore_index: int = -100
) -> dict[str, Any]:
    """The part of a packed batch (from :class:`PackedCollator`) that CP rank ``cp_rank``
    of ``cp_size`` processes.

    Every sequence in the row must be padded to a multiple of ``2 * cp_size``
    (``PackedCollator(pad_each_to_multiple_of=2 * cp_size)``); rank ``r`` takes chunks
    ``r`` and ``2 * cp_size - 1 - r`` of each. Returns a new dict:

    * ``input_ids``, ``labels``, ``position_ids``, ``seq_idx`` (when present): this rank's
      tokens, shape ``[1, total_tokens // cp_size]``;
    * ``shift_labels``: the target of every token (the next token's label in the whole
      row, ``ignore_index`` at the ends of sequences), cut the same way. Labels must be
      shifted *before* sharding, because a shard's neighbouring tokens are not neighbours
      in the row: give the loss ``shift_labels`` (Hugging Face models accept it and then
      do not shift ``labels``; Megatron-style losses take pre-shifted labels);
    * ``cu_seqlens``, ``cu_seqlens_padded``, ``max_seqlen``: unchanged, the whole row's, as
      Transformer Engine's attention takes them with a CP group (it divides by ``cp_size``
      itself); ``cu_seqlens_on_cp_rank`` and ``cu_seqlens_padded_on_cp_rank`` (int32):
      the real and padded token counts of each sequence on this rank, cumulated.

    The Hugging Face row keys (``cu_seq_lens_q`` ...) are left out: they describe the
    whole row, and a kernel without context parallelism would attend across chunks.
    Other keys are copied unchanged.
    """
    if "cu_seqlens_padded" not in batch:
        raise InvalidValueError(
            "the batch has no 'cu_seqlens_padded'; collate it with PackedCollator"
        )
    size = as_int(cp_size, "cp_size", minimum=1)
    part = shard(batch["cu_seqlens_padded"], size, cp_rank, cu_seqlens=batch.get("cu_seqlens"))
    out = {key: value for key, value in batch.items() if key not in _ROW_LAYOUT_KEYS}
    if "labels" in batch and "shift_labels" not in batch:
        out["shift_labels"] = _shift(batch["labels"], as_int(ignore_index, "ignore_index"))
    n_tokens = int(part.cu_seqlens_padded[-1]) * size
    indices = torch.tensor(part.indices)  # a copy: the core's array is read-only
    for key in TOKEN_KEYS:
        if key in out:
            tokens = _row(out[key], key, n_tokens)
            out[key] = tokens.index_select(1, indices.to(tokens.device))
    out["cu_seqlens_on_cp_rank"] = torch.from_numpy(part.cu_seqlens.astype(np.int32))
    out["cu_seqlens_padded_on_cp_rank"] = torch.from_numpy(part.cu_seqlens_padded.astype(np.int32))
    return out


def _row(value: Any, key: str, n_tokens: int) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.ndim != 2 or value.shape[0] != 1:
        raise InvalidTypeError(f"batch[{key!r}] must be a tensor of shape [1, tokens]")
    if value.shape[1] != n_tokens:
        raise InvalidValueError(
            f"batch[{key!r}] has {value.shape[1]} tokens but cu_seqlens_padded ends at {n_tokens}"
        )
    return value


def _shift(labels: Any, ignore_index: int) -> torch.Tensor:
    if not isinstance(labels, torch.Tensor) or labels.ndim != 2:
        raise InvalidTypeError("batch['labels'] must be a tensor of shape [1, tokens]")
    # The collator set the label of every sequence's first token (and of all padding) to
    # ignore_index, so no target crosses from one sequence into the next.
    shifted = torch.full_like(labels, ignore_index)
    shifted[:, :-1] = labels[:, 1:]
    return shifted


def unshard(
    shards: Sequence[torch.Tensor], cu_seqlens_padded: Any, *, dim: int = 1
) -> torch.Tensor:
    """Put the shards of all CP ranks (in rank order, as ``all_gather`` returns them) back
    into the padded row, along ``dim``; the inverse of :func:`shard_batch`'s cut.

    Differentiable (an ``index_select``), so it also gathers keys and values for attention.
    """
    if not shards:
        raise InvalidValueError("unshard needs the shards of at least one rank")
    order = rank_major_order(cu_seqlens_padded, len(shards))
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    gathered = torch.cat(list(shards), dim)
    if gathered.shape[dim] != len(order):
        raise InvalidValueError(
            f"the shards hold {gathered.shape[dim]} tokens along dim {dim}, "
            f"but cu_seqlens_padded ends at {len(order)}"
        )
    return gathered.index_select(dim, torch.from_numpy(inverse).to(gathered.device))


class ContextParallelCollator:
    """Collate a batch into one packed row and keep the part CP rank ``cp_rank`` processes.

    Every rank of a context-parallel group loads the same batch (same data-parallel rank
    for the sampler) and keeps its own shard, so nothing is communicated. ``collator``
    builds the row; by default ``PackedCollator(pad_each_to_multiple_of=2 * cp_size)``.
    Its ``pad_each_to_multiple_of`` must be a multiple of ``2 * cp_size``, and its
    ``pad_to_multiple_of`` 1 or a multiple of ``2 * cp_size``. Pack with
    ``pad_to_multiple_of=`` the same multiple, so every bin's row fits the budget.
    Returns what :func:`shard_batch` returns.
    """

    def __init__(
        self, cp_size: int, cp_rank: int, *, collator: PackedCollator | None = None
    ) -> None:
        self.cp_size = as_int(cp_size, "cp_size", minimum=1)
        self.cp_rank = as_int(cp_rank, "cp_rank", minimum=0)
        if self.cp_rank >= self.cp_size:
            raise InvalidValueError(
                f"cp_rank must be in [0, cp_size - 1] = [0, {self.cp_size - 1}], got {self.cp_rank}"
            )
        chunks = 2 * self.cp_size
        if collator is None:
            collator = PackedCollator(pad_each_to_multiple_of=chunks)
        if not isinstance(collator, PackedCollator):
            raise InvalidTypeError(
                f"collator must be a PackedCollator, got {type(collator).__name__}"
            )
        if collator.pad_each_to_multiple_of % chunks:
            raise InvalidValueError(
                f"collator.pad_each_to_multiple_of={collator.pad_each_to_multiple_of} is not a "
                f"multiple of 2 * cp_size = {chunks}"
            )
        if collator.pad_to_multiple_of != 1 and collator.pad_to_multiple_of % chunks:
            raise InvalidValueError(
                f"collator.pad_to_multiple_of={collator.pad_to_multiple_of} must be 1 or a "
                f"multiple of 2 * cp_size = {chunks}"
            )
        self.collator = collator

    def __call__(self, items: Sequence[Any]) -> dict[str, Any]:
        """Collate ``items`` and return this rank's shard."""
        ignore_index = self.collator.ignore_index
        batch = self.collator(items)
        return shard_batch(batch, self.cp_size, self.cp_rank, ignore_index=ignore_index)
