"""Map-style dataset helpers: token counts of a dataset, and serving split segments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Dataset

from tokenbatch.distribute import Segment
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.torch._items import item_tokens

__all__ = ["SegmentDataset", "sequence_lengths"]


def sequence_lengths(dataset: Any, key: str = "input_ids") -> npt.NDArray[np.int64]:
    """Token count of every item of a map-style dataset (reads every item once).

    Items are mappings holding ``key`` or token sequences themselves. Datasets that store
    lengths (a column, an index file) should pass those to the sampler instead.
    """
    return np.fromiter(
        (len(item_tokens(dataset[i], key, i)) for i in range(len(dataset))),
        dtype=np.int64,
        count=len(dataset),
    )


class SegmentDataset(Dataset[Any]):
    """Serve the ``(index, start, length)`` segments of a sampler with
    ``oversize="split"`` or ``"truncate"`` from a map-style dataset.

    ``dataset[index]`` must return a mapping whose token fields (``keys``) are sliceable
    (lists, numpy arrays, tensors), or a token sequence itself. A segment returns the
    item with those fields cut to ``[start:start + length]``; other fields are kept as
    they are. Plain integer indices return the item unchanged, so the wrapper also works
    for samplers that do not split.

    A piece of a split sequence is a document of its own for the collator: its positions
    restart at 0, and its first token is not predicted from the previous piece.

    Raises:
        InvalidValueError: an item is shorter than its segment (the lengths given to the
            sampler do not match the dataset).
    """

    def __init__(self, dataset: Any, keys: Sequence[str] = ("input_ids", "labels")) -> None:
        if isinstance(keys, str):
            raise InvalidTypeError("keys must be a sequence of field names, not a string")
        self.dataset = dataset
        self.keys = tuple(keys)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int | Segment) -> Any:
        if not isinstance(index, tuple):
            return self.dataset[index]
        position, start, length = index
        item = self.dataset[position]
        stop = start + length
        if isinstance(item, Mapping):
            sliced = dict(item)
            for key in self.keys:
                if key in item:
                    sliced[key] = _cut(item[key], start, stop, key, position)
            return sliced
        return _cut(item, start, stop, "item", position)


def _cut(values: Any, start: int, stop: int, key: str, position: int) -> Any:
    if len(values) < stop:
        raise InvalidValueError(
            f"dataset item {position} has {len(values)} {key} tokens, but the sampler planned "
            f"tokens {start}:{stop}; the lengths given to the sampler do not match the dataset"
        )
    return values[start:stop]
