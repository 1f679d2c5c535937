"""Collators: one padding-free row per batch (varlen attention), or padded rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from tokenbatch._convert import as_choice, as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.torch.data import _tokens

__all__ = ["PackedCollator", "PaddedCollator"]


def _as_int64(values: Any, name: str) -> npt.NDArray[np.int64]:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1:
        raise InvalidTypeError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise InvalidTypeError(f"{name} must hold integers, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _read_items(
    items: Sequence[Any], input_key: str, labels_key: str
) -> tuple[list[npt.NDArray[np.int64]], list[npt.NDArray[np.int64] | None]]:
    ids: list[npt.NDArray[np.int64]] = []
    labels: list[npt.NDArray[np.int64] | None] = []
    for position, item in enumerate(items):
        tokens = _as_int64(_tokens(item, input_key, position), f"items[{position}][{input_key!r}]")
        ids.append(tokens)
        if isinstance(item, Mapping) and item.get(labels_key) is not None:
            item_labels = _as_int64(item[labels_key], f"items[{position}][{labels_key!r}]")
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
    """Concatenate a batch into one padding-free row, the format of varlen attention.

    From items holding ``input_ids`` (and optionally ``labels``, unshifted, as Hugging
    Face models take them) it returns:

    * ``input_ids``, ``labels``, ``position_ids``: int64 tensors of shape
      ``[1, total_tokens]``; positions restart at 0 for every sequence, and the label of
      every sequence's first token is ``ignore_index``, so no sequence is trained to
      predict the start of the next one;
    * ``cu_seqlens``: int32 cumulative sequence lengths ``[0, l0, l0 + l1, ...]`` for
      ``flash_attn_varlen_func``; ``max_seqlen``: the longest sequence (an int);
    * ``cu_seq_lens_q`` / ``cu_seq_lens_k`` / ``max_length_q`` / ``max_length_k``: the
      same, under the names Hugging Face models accept for padding-free training.

    Empty sequences are skipped. With ``pad_to_multiple_of > 1`` the row is padded with
    ``pad_token_id`` to a multiple of it, as one more sequence whose labels are all
    ``ignore_index``.

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
    ) -> None:
        self.input_key = input_key
        self.labels_key = labels_key
        self.ignore_index = as_int(ignore_index, "ignore_index")
        self.pad_token_id = as_int(pad_token_id, "pad_token_id")
        self.pad_to_multiple_of = as_int(pad_to_multiple_of, "pad_to_multiple_of", minimum=1)

    def __call__(self, items: Sequence[Any]) -> dict[str, Any]:
        """Collate ``items`` (one batch of the sampler) into tensors."""
        ids, labels = _read_items(items, self.input_key, self.labels_key)
        keep = [i for i, tokens in enumerate(ids) if len(tokens)]
        ids = [ids[i] for i in keep]
        labels_list: list[npt.NDArray[np.int64]] = []
        for tokens, i in zip(ids, keep, strict=True):
            item_labels = labels[i]
            labels_list.append(tokens if item_labels is None else item_labels)
        seq_lens = [len(tokens) for tokens in ids]
        total = sum(seq_lens)
        padding = -total % self.pad_to_multiple_of
        if padding:
            ids.append(np.full(padding, self.pad_token_id, dtype=np.int64))
            labels_list.append(np.full(padding, self.ignore_index, dtype=np.int64))
            seq_lens.append(padding)
        lens = np.asarray(seq_lens, dtype=np.int64)
        cu = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=cu[1:])
        n_tokens = int(cu[-1])
        input_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        label_row = np.concatenate(labels_list) if ids else np.zeros(0, dtype=np.int64)
        label_row[cu[:-1]] = self.ignore_index
        position_ids = np.arange(n_tokens, dtype=np.int64) - np.repeat(cu[:-1], lens)
        cu_seqlens = torch.from_numpy(cu.astype(np.int32))
        max_seqlen = int(lens.max()) if len(lens) else 0
        return {
            "input_ids": torch.from_numpy(input_ids).view(1, n_tokens),
            "labels": torch.from_numpy(label_row).view(1, n_tokens),
            "position_ids": torch.from_numpy(position_ids).view(1, n_tokens),
            "cu_seqlens": cu_seqlens,
            "max_seqlen": max_seqlen,
            "cu_seq_lens_q": cu_seqlens,
            "cu_seq_lens_k": cu_seqlens,
            "max_length_q": max_seqlen,
            "max_length_k": max_seqlen,
        }


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
