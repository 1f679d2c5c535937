"""Collators: one padding-free row per batch (varlen attention), or padded rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from tokenbatch._convert import as_bool, as_choice, as_int
from tokenbatch.errors import InvalidValueError, TokenBatchOverflowError
from tokenbatch.torch._items import as_int64, cumulative, item_tokens

__all__ = ["PackedCollator", "PaddedCollator"]

_INT32_MAX = np.iinfo(np.int32).max


def _read_items(
    items: Sequence[Any], input_key: str, labels_key: str
) -> tuple[list[npt.NDArray[np.int64]], list[npt.NDArray[np.int64] | None]]:
    ids: list[npt.NDArray[np.int64]] = []
    labels: list[npt.NDArray[np.int64] | None] = []
    for position, item in enumerate(items):
        tokens = as_int64(
            item_tokens(item, input_key, position), f"items[{position}][{input_key!r}]"
        )
        ids.append(tokens)
        if isinstance(item, Mapping) and item.get(labels_key) is not None:
            item_labels = as_int64(item[labels_key], f"items[{position}][{labels_key!r}]")
            if len(item_labels) != len(tokens):
                raise InvalidValueError(
                    f"items[{position}] has {len(tokens)} {input_key} but "
                    f"{len(item_labels)} {labels_key}"
                )
            labels.append(item_labels)
        else:
            labels.append(None)
    return ids, labels


class PackedCollator:
    """Concatenate a batch into one row, the format of varlen attention.

    From items holding ``input_ids`` (and optionally ``labels``, unshifted, as Hugging
    Face models take them) it returns:

    * ``input_ids``, ``labels``, ``position_ids``: int64 tensors of shape
      ``[1, total_tokens]``; positions restart at ``position_ids_start`` for every
      sequence, and the label of every sequence's first token is ``ignore_index``, so no
      sequence is trained to predict the start of the next one;
    * ``cu_seqlens``: int32 cumulative real lengths ``[0, l0, l0 + l1, ...]``;
      ``cu_seqlens_padded``: int32 offsets of the sequences in the row (equal to
      ``cu_seqlens`` unless ``pad_each_to_multiple_of > 1``); ``max_seqlen``: the longest
      sequence with its padding (an int);
    * ``cu_seq_lens_q`` / ``cu_seq_lens_k`` / ``max_length_q`` / ``max_length_k``: the
      row layout (``cu_seqlens_padded``, ``max_seqlen``) under the names Hugging Face
      models accept for padding-free training;
    * ``seq_idx`` (with ``return_seq_idx=True``): int32 ``[1, total_tokens]``, the index
      of each token's sequence in the row, as Mamba-style layers take it.

    ``pad_each_to_multiple_of=k`` pads every sequence with ``pad_token_id`` to a multiple
    of ``k`` tokens, as context parallelism needs (``k = 2 * cp_size``; see
    :class:`ContextParallelCollator`): the padding follows the sequence's real tokens,
    takes its ``seq_idx``, continues its positions and has ``ignore_index`` labels.
    Causal attention over ``cu_seqlens_padded`` then gives every real token the output it
    has alone. A bin that ``tokenbatch.pack(..., pad_to_multiple_of=k)`` fits in
    ``max_tokens`` makes a row of at most ``max_tokens`` tokens.

    Empty sequences are skipped. With ``pad_to_multiple_of > 1`` the whole row is padded
    with ``pad_token_id`` to a multiple of it, as one more sequence whose labels are all
    ``ignore_index``. ``return_seq_idx`` and ``position_ids_start`` are the names of Hugging
    Face's ``DataCollatorWithFlattening``, which gives the same tensors when nothing is
    padded.

    Items are mappings holding ``input_key`` (lists, numpy arrays or tensors), or the
    token sequences themselves.
    """

    def __init__(
        self,
        *,
        input_key: str = "input_ids",
        labels_key: str = "labels",
        ignore_index: int = -100,
        pad_token_id: int = 0,
        pad_to_multiple_of: int = 1,
        pad_each_to_multiple_of: int = 1,
        return_seq_idx: bool = False,
        position_ids_start: int = 0,
    ) -> None:
        self.input_key = input_key
        self.labels_key = labels_key
        self.ignore_index = as_int(ignore_index, "ignore_index")
        self.pad_token_id = as_int(pad_token_id, "pad_token_id")
        self.pad_to_multiple_of = as_int(pad_to_multiple_of, "pad_to_multiple_of", minimum=1)
        self.pad_each_to_multiple_of = as_int(
            pad_each_to_multiple_of, "pad_each_to_multiple_of", minimum=1
        )
        self.return_seq_idx = as_bool(return_seq_idx, "return_seq_idx")
        self.position_ids_start = as_int(position_ids_start, "position_ids_start")

    def __call__(self, items: Sequence[Any]) -> dict[str, Any]:
        """Collate ``items`` (one batch of the sampler) into tensors."""
        ids, labels = _read_items(items, self.input_key, self.labels_key)
        keep = [i for i, tokens in enumerate(ids) if len(tokens)]
        ids = [ids[i] for i in keep]
        labels_list: list[npt.NDArray[np.int64]] = []
        for tokens, i in zip(ids, keep, strict=True):
            item_labels = labels[i]
            labels_list.append(tokens if item_labels is None else item_labels)
        n_docs = len(ids)
        multiple = self.pad_each_to_multiple_of
        lens = np.fromiter((len(tokens) for tokens in ids), dtype=np.int64, count=n_docs)
        padded = -(-lens // multiple) * multiple
        row_padding = -int(padded.sum()) % self.pad_to_multiple_of
        if row_padding:
            lens = np.append(lens, row_padding)
            padded = np.append(padded, row_padding)
        cu = cumulative(lens)
        cu_padded = cumulative(padded)
        n_tokens = int(cu_padded[-1])
        if n_tokens > _INT32_MAX:
            raise TokenBatchOverflowError(
                f"the row has {n_tokens} tokens; cu_seqlens are int32, at most {_INT32_MAX}"
            )
        # Each real token moves right by the padding of the sequences before its own.
        shift = np.repeat(cu_padded[:n_docs] - cu[:n_docs], lens[:n_docs])
        dest = np.arange(len(shift), dtype=np.int64) + shift
        input_ids = np.full(n_tokens, self.pad_token_id, dtype=np.int64)
        label_row = np.full(n_tokens, self.ignore_index, dtype=np.int64)
        if ids:
            input_ids[dest] = np.concatenate(ids)
            label_row[dest] = np.concatenate(labels_list)
        label_row[cu_padded[:-1]] = self.ignore_index
        starts = np.repeat(cu_padded[:-1], padded)
        position_ids = np.arange(n_tokens, dtype=np.int64) - starts + self.position_ids_start
        cu_seqlens = torch.from_numpy(cu.astype(np.int32))
        cu_seqlens_padded = torch.from_numpy(cu_padded.astype(np.int32))
        max_seqlen = int(padded.max()) if len(padded) else 0
        batch: dict[str, Any] = {
            "input_ids": torch.from_numpy(input_ids).view(1, n_tokens),
            "labels": torch.from_numpy(label_row).view(1, n_tokens),
            "position_ids": torch.from_numpy(position_ids).view(1, n_tokens),
            "cu_seqlens": cu_seqlens,
            "cu_seqlens_padded": cu_seqlens_padded,
            "max_seqlen": max_seqlen,
            "cu_seq_lens_q": cu_seqlens_padded,
            "cu_seq_lens_k": cu_seqlens_padded,
            "max_length_q": max_seqlen,
            "max_length_k": max_seqlen,
        }
        if self.return_seq_idx:
            seq_idx = np.repeat(np.arange(len(padded), dtype=np.int32), padded)
            batch["seq_idx"] = torch.from_numpy(seq_idx).view(1, n_tokens)
        return batch


class PaddedCollator:
    """Pad a batch to its longest sequence: ``input_ids``, ``attention_mask`` (1 for real
    tokens) and ``labels`` (``ignore_index`` on padding), int64 tensors of shape
    ``[batch, longest]`` (rounded up to ``pad_to_multiple_of``).

    Labels are unshifted (the model shifts them); items may carry their own ``labels``.
    ``padding_side="left"`` puts the padding first.
    """

    def __init__(
        self,
        *,
        input_key: str = "input_ids",
        labels_key: str = "labels",
        pad_token_id: int = 0,
        ignore_index: int = -100,
        pad_to_multiple_of: int = 1,
        padding_side: Literal["right", "left"] = "right",
    ) -> None:
        self.input_key = input_key
        self.labels_key = labels_key
        self.pad_token_id = as_int(pad_token_id, "pad_token_id")
        self.ignore_index = as_int(ignore_index, "ignore_index")
        self.pad_to_multiple_of = as_int(pad_to_multiple_of, "pad_to_multiple_of", minimum=1)
        self.padding_side = as_choice(padding_side, "padding_side", ("right", "left"))

    def __call__(self, items: Sequence[Any]) -> dict[str, torch.Tensor]:
        """Collate ``items`` into padded tensors."""
        ids, labels = _read_items(items, self.input_key, self.labels_key)
        longest = max((len(tokens) for tokens in ids), default=0)
        width = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = np.full((len(ids), width), self.pad_token_id, dtype=np.int64)
        label_rows = np.full((len(ids), width), self.ignore_index, dtype=np.int64)
        mask = np.zeros((len(ids), width), dtype=np.int64)
        for row, (tokens, item_labels) in enumerate(zip(ids, labels, strict=True)):
            n = len(tokens)
            span = slice(0, n) if self.padding_side == "right" else slice(width - n, width)
            input_ids[row, span] = tokens
            label_rows[row, span] = tokens if item_labels is None else item_labels
            mask[row, span] = 1
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(mask),
            "labels": torch.from_numpy(label_rows),
        }
