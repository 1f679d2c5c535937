"""Vision-language documents in padding-free rows, with 3-axis (MRoPE) positions.

:class:`VisionLanguageCollator` packs documents with images (as Qwen2-VL's processor
makes them: placeholder tokens in ``input_ids``, the images' patches in
``pixel_values``, one ``(t, h, w)`` grid per image in ``image_grid_thw``) into one row:
the images of the row in document order, and positions that restart per document.
:func:`mrope_position_ids` computes the MRoPE positions of such a row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from tokenbatch._convert import as_choice, as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.torch._items import as_int64, cumulative
from tokenbatch.torch._row import row_collator
from tokenbatch.torch.collate import PackedCollator

__all__ = ["VisionLanguageCollator", "mrope_position_ids"]

Positions = Literal["text+mrope", "mrope", "text"]
_POSITIONS = ("text+mrope", "mrope", "text")
_I64 = npt.NDArray[np.int64]


def _grids(values: Any, name: str) -> _I64:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    grid = np.asarray(values)
    if grid.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    if grid.ndim != 2 or grid.shape[1] != 3 or grid.dtype.kind not in "iu":
        raise InvalidTypeError(f"{name} must be integers of shape [images, 3], got {grid.shape}")
    grid = grid.astype(np.int64, copy=False)
    if (grid < 1).any():
        raise InvalidValueError(f"{name} holds a grid size below 1: {grid.tolist()}")
    return grid


def _image_tokens(grid: _I64, spatial_merge_size: int, name: str) -> _I64:
    """Placeholder tokens of each image: its patches over the spatial merge."""
    merge = spatial_merge_size
    bad = np.flatnonzero((grid[:, 1] % merge != 0) | (grid[:, 2] % merge != 0))
    if len(bad):
        raise InvalidValueError(
            f"{name}[{int(bad[0])}] = {grid[bad[0]].tolist()}: height and width must be "
            f"multiples of spatial_merge_size={merge}"
        )
    tokens: _I64 = grid.prod(axis=1) // (merge * merge)
    return tokens


def mrope_position_ids(
    input_ids: Any,
    image_grid_thw: Any,
    cu_seqlens: Any,
    *,
    image_token_id: int,
    spatial_merge_size: int = 2,
) -> torch.Tensor:
    """The 3-axis rotary positions (temporal, height, width) of a packed row, as
    Qwen2-VL's ``get_rope_index`` computes them for each document alone.

    Within a document, text tokens take the same position on all three axes, one more
    per token; an image's placeholder tokens, ``t * h * w / spatial_merge_size**2`` in
    a row, take the positions of their place in the image's merged ``(t, h, w)`` grid,
    offset by the position the image starts at; the text after the image continues at
    that start plus ``max(h, w) / spatial_merge_size`` (as transformers 5 computes it;
    4.x continued after ``max(t, h / merge, w / merge)``, the same for the one temporal
    patch of every image Qwen's processors make). Every document (a range of
    ``cu_seqlens``) starts at 0. The images of ``image_grid_thw`` belong to the
    placeholder tokens in row order. Vectorized over the row (no loop per document or
    image).

    Args:
        input_ids: the row's tokens, ``[1, T]`` or ``[T]``.
        image_grid_thw: ``[images, 3]``, the grid of every image in the row, in order.
        cu_seqlens: the documents' offsets in the row (``batch["cu_seqlens_padded"]``).

    Returns:
        int64, ``[3, 1, T]``.

    Raises:
        InvalidValueError: placeholder tokens that do not match the grids in number, an
            image whose tokens are not consecutive or cross a document boundary, grid
            sizes that do not divide by the merge.
    """
    ids = as_int64(
        input_ids.reshape(-1) if isinstance(input_ids, torch.Tensor) else np.ravel(input_ids),
        "input_ids",
    )
    merge = as_int(spatial_merge_size, "spatial_merge_size", minimum=1)
    grid = _grids(image_grid_thw, "image_grid_thw")
    offsets = as_int64(cu_seqlens, "cu_seqlens")
    n_tokens = len(ids)
    if (
        len(offsets) == 0
        or offsets[0] != 0
        or offsets[-1] != n_tokens
        or (np.diff(offsets) < 0).any()
    ):
        raise InvalidValueError(
            f"cu_seqlens must rise from 0 to the row's {n_tokens} tokens, got {offsets.tolist()}"
        )
    per_image = _image_tokens(grid, merge, "image_grid_thw")
    placeholders = np.flatnonzero(ids == image_token_id)
    if len(placeholders) != int(per_image.sum()):
        raise InvalidValueError(
            f"the row has {len(placeholders)} image tokens (id {image_token_id}), but its "
            f"{len(grid)} image grids make {int(per_image.sum())}"
        )
    document = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    starts = cumulative(per_image)[:-1]
    ends = starts + per_image - 1
    first, last = placeholders[starts], placeholders[ends]
    broken = np.flatnonzero(last - first != per_image - 1)
    if len(broken):
        raise InvalidValueError(
            f"the {int(per_image[broken[0]])} tokens of image {int(broken[0])} are not "
            "consecutive in the row"
        )
    crossing = np.flatnonzero(document[first] != document[last])
    if len(crossing):
        raise InvalidValueError(
            f"image {int(crossing[0])} starts in document {int(document[first[crossing[0]]])} "
            f"and ends in document {int(document[last[crossing[0]]])}"
        )
    height, width = grid[:, 1] // merge, grid[:, 2] // merge
    # Each token moves the position on by one, except an image: by max(h, w) after it.
    advance = np.ones(n_tokens, dtype=np.int64)
    advance[placeholders] = 0
    advance[last] = np.maximum(height, width)
    before = cumulative(advance)
    base = before[:-1] - before[offsets[:-1]][document]
    positions = np.repeat(base[None, :], 3, axis=0)
    local = np.arange(len(placeholders), dtype=np.int64) - np.repeat(starts, per_image)
    image_height, image_width = np.repeat(height, per_image), np.repeat(width, per_image)
    positions[0, placeholders] += local // (image_height * image_width)
    positions[1, placeholders] += (local // image_width) % image_height
    positions[2, placeholders] += local % image_width
    return torch.from_numpy(positions).view(3, 1, n_tokens)


class VisionLanguageCollator:
    """Collate vision-language documents into one padding-free row.

    Items hold ``input_ids`` (the image placeholder tokens already expanded, one per
    merged patch, as Qwen2-VL's processor writes them), optionally ``labels``, and, for
    documents with images, ``pixel_values`` (``[patches, patch_dim]``, the flattened
    patches of the document's images in order) and ``image_grid_thw`` (``[images, 3]``).
    Returns what ``collator`` (by default a :class:`~tokenbatch.torch.PackedCollator`)
    returns for the documents' tokens, with ``ignore_index`` labels on every
    placeholder token (an image is input, not a target), and:

    * ``pixel_values``: the patches of all the row's images, in document order (absent
      when the row has no image), in their dtype; ``image_grid_thw``: int64
      ``[images, 3]``, in the same order. Qwen2-VL's vision encoder attends within each
      image, so images of different documents do not see each other;
    * ``position_ids``, by ``positions``:

      - ``"text+mrope"`` (default): int64 ``[4, 1, T]``, the 1-D positions of
        :class:`PackedCollator` (restarting per document) followed by the three MRoPE
        axes of :func:`mrope_position_ids`. The form Hugging Face's Qwen2-VL family
        (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) reads a packed row in: without an attention
        mask and with ``use_cache=False``, it keeps the documents apart where the first
        row restarts. Given only the three MRoPE axes, those models attend across
        documents;
      - ``"mrope"``: ``[3, 1, T]``, the MRoPE axes alone, as ``get_rope_index`` returns
        them, for code that keeps documents apart by ``cu_seqlens``;
      - ``"text"``: ``[1, T]``, the 1-D positions, for models with 1-D rotary positions.

    Videos are not handled. Build it from a model's config with :meth:`from_config`.

    Raises:
        InvalidValueError: a document whose placeholder tokens do not match its grids, or
            whose ``pixel_values`` rows do not match them (``t * h * w`` patches per
            image), an image split by other tokens, ``pad_token_id == image_token_id``.
    """

    def __init__(
        self,
        *,
        image_token_id: int,
        spatial_merge_size: int = 2,
        positions: Positions = "text+mrope",
        collator: PackedCollator | None = None,
    ) -> None:
        collator = row_collator(collator)
        self.image_token_id = as_int(image_token_id, "image_token_id")
        if collator.pad_token_id == self.image_token_id:
            raise InvalidValueError(
                f"the collator pads with token {collator.pad_token_id}, the image token; pad "
                "with another one"
            )
        self.spatial_merge_size = as_int(spatial_merge_size, "spatial_merge_size", minimum=1)
        self.positions = as_choice(positions, "positions", _POSITIONS)
        self.collator = collator

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> VisionLanguageCollator:
        """A collator for a Hugging Face Qwen2-VL-family config (its ``image_token_id``
        and ``vision_config.spatial_merge_size``); ``kwargs`` are the other arguments."""
        return cls(
            image_token_id=config.image_token_id,
            spatial_merge_size=config.vision_config.spatial_merge_size,
            **kwargs,
        )

    def __call__(self, items: Sequence[Any]) -> dict[str, Any]:
        """Collate ``items`` (one batch of the sampler) into one row."""
        collator = self.collator
        documents: list[dict[str, Any]] = []
        pixels: list[torch.Tensor] = []
        grids: list[_I64] = []
        for position, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise InvalidTypeError(
                    f"items[{position}] is a {type(item).__name__}, not a mapping"
                )
            document, item_pixels, grid = self._read(item, position)
            documents.append(document)
            if len(grid):
                pixels.append(item_pixels)
                grids.append(grid)
        batch = collator(documents)
        grid = np.concatenate(grids) if grids else np.zeros((0, 3), dtype=np.int64)
        if grids:
            batch["pixel_values"] = torch.cat(pixels)
            batch["image_grid_thw"] = torch.from_numpy(grid)
        text = batch["position_ids"]
        if self.positions == "text":
            return batch
        mrope = mrope_position_ids(
            batch["input_ids"],
            grid,
            batch["cu_seqlens_padded"],
            image_token_id=self.image_token_id,
            spatial_merge_size=self.spatial_merge_size,
        )
        batch["position_ids"] = (
            mrope if self.positions == "mrope" else torch.cat([text[None], mrope])
        )
        return batch

    def _read(
        self, item: Mapping[str, Any], position: int
    ) -> tuple[dict[str, Any], torch.Tensor, _I64]:
        collator = self.collator
        if collator.input_key not in item:
            raise InvalidValueError(f"items[{position}] has no {collator.input_key!r} field")
        tokens = as_int64(item[collator.input_key], f"items[{position}][{collator.input_key!r}]")
        labels = item.get(collator.labels_key)
        labels = (
            tokens.copy()
            if labels is None
            else as_int64(labels, f"items[{position}][{collator.labels_key!r}]").copy()
        )
        if len(labels) != len(tokens):
            raise InvalidValueError(
                f"items[{position}] has {len(tokens)} {collator.input_key} but {len(labels)} labels"
            )
        placeholder = tokens == self.image_token_id
        labels[placeholder] = collator.ignore_index
        grid = _grids(item.get("image_grid_thw", ()), f"items[{position}]['image_grid_thw']")
        per_image = _image_tokens(
            grid, self.spatial_merge_size, f"items[{position}]['image_grid_thw']"
        )
        if int(placeholder.sum()) != int(per_image.sum()):
            raise InvalidValueError(
                f"items[{position}] has {int(placeholder.sum())} image tokens (id "
                f"{self.image_token_id}), but its {len(grid)} image grids make "
                f"{int(per_image.sum())}"
            )
        pixels = torch.empty(0)
        if len(grid):
            if item.get("pixel_values") is None:
                raise InvalidValueError(f"items[{position}] has image grids but no pixel_values")
            pixels = torch.as_tensor(item["pixel_values"])
            patches = int(grid.prod(axis=1).sum())
            if pixels.ndim != 2 or pixels.shape[0] != patches:
                raise InvalidValueError(
                    f"items[{position}]['pixel_values'] has shape {tuple(pixels.shape)}; its "
                    f"{len(grid)} image grids need {patches} patches, [patches, patch_dim]"
                )
        document = {collator.input_key: tokens, collator.labels_key: labels}
        return document, pixels, grid
