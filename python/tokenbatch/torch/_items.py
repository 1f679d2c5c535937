"""How the datasets and collators of ``tokenbatch.torch`` read items: an item's tokens, a
field as a one-dimensional int64 array, and offsets from lengths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from tokenbatch.errors import InvalidTypeError, InvalidValueError


def item_tokens(item: Any, key: str, position: int) -> Any:
    """The tokens of dataset item ``position``: its ``key`` field, or the item itself."""
    if isinstance(item, Mapping):
        if key not in item:
            raise InvalidValueError(f"dataset item {position} has no {key!r} field")
        return item[key]
    return item


def as_int64(values: Any, name: str) -> npt.NDArray[np.int64]:
    """``values`` (a tensor, array or sequence of integers) as a 1-D int64 array."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1:
        raise InvalidTypeError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise InvalidTypeError(f"{name} must hold integers, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def cumulative(lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``len(lengths) + 1`` offsets: 0, then the running sums of ``lengths``."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets
