"""Vision-language rows: MRoPE positions as transformers' own get_rope_index computes them,
the collator's layout and errors, and tiny Qwen2-VL-family models whose logits on a packed
row equal each document run alone."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.torch import PackedCollator, VisionLanguageCollator, mrope_position_ids

IMAGE, START, END = 60, 62, 63
MERGE = 2
PATCH_DIM = 3 * 2 * 2 * 2  # channels x temporal patch x patch x patch

_TEXT = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
    bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip
_TOKENS = dict(image_token_id=IMAGE, video_token_id=61, vision_start_token_id=START,
               vision_end_token_id=END)  # fmt: skip
_VISION = dict(depth=1, num_heads=2, patch_size=2, temporal_patch_size=2,
               spatial_merge_size=MERGE, in_channels=3)  # fmt: skip


def qwen2_vl() -> Any:
    vision = dict(_VISION, embed_dim=16, hidden_size=32, mlp_ratio=2)
    config = Qwen2VLConfig(text_config=_TEXT, vision_config=vision, **_TOKENS)
    return Qwen2VLForConditionalGeneration(config)


def qwen2_5_vl() -> Any:
    vision = dict(_VISION, hidden_size=16, out_hidden_size=32, intermediate_size=32,
                  fullatt_block_indexes=[0], window_size=4)  # fmt: skip
    config = Qwen2_5_VLConfig(text_config=_TEXT, vision_config=vision, **_TOKENS)
    return Qwen2_5_VLForConditionalGeneration(config)


def qwen3_vl() -> Any:
    rope = {"rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True}
    text = dict(_TEXT, rope_scaling=rope, head_dim=8)
    vision = dict(_VISION, hidden_size=16, out_hidden_size=32, intermediate_size=32,
                  deepstack_visual_indexes=[0], num_position_embeddings=16)  # fmt: skip
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **_TOKENS)
    return Qwen3VLForConditionalGeneration(config)


MODELS = {"qwen2_vl": qwen2_vl, "qwen2_5_vl": qwen2_5_vl, "qwen3_vl": qwen3_vl}
_qwen2_vl = functools.cache(qwen2_vl)  # for get_rope_index, which reads only the config


@pytest.fixture(scope="module", params=list(MODELS))
def model(request: pytest.FixtureRequest) -> Any:
    torch.manual_seed(0)
    return MODELS[request.param]().eval()


def document(parts: list[Any], seed: int = 0) -> dict[str, Any]:
    """A document from ``parts``: an int is that many text tokens, a tuple an image of
    that ``(t, h, w)`` grid, wrapped in vision start and end tokens as Qwen's processors
    write it."""
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    pixels, grids = [], []
    for part in parts:
        if isinstance(part, int):
            ids += rng.integers(3, 59, part).tolist()
            continue
        t, h, w = part
        ids += [START] + [IMAGE] * (t * h * w // MERGE**2) + [END]
        pixels.append(torch.from_numpy(rng.standard_normal((t * h * w, PATCH_DIM))).float())
        grids.append(part)
    item: dict[str, Any] = {"input_ids": ids}
    if grids:
        item["pixel_values"] = torch.cat(pixels)
        item["image_grid_thw"] = torch.tensor(grids)
    return item


def token_types(model: Any, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the model needs besides the grids to compute MRoPE positions itself:
    transformers 5 asks for the tokens' modalities, 4.x found the images by their token."""
    if "mm_token_type_ids" in inspect.signature(model.model.get_rope_index).parameters:
        return {"mm_token_type_ids": (ids == IMAGE).int()}
    return {}


def rope_index(model: Any, item: dict[str, Any]) -> torch.Tensor:
    """transformers' own MRoPE positions of one document, ``[3, 1, T]``."""
    ids = torch.tensor([item["input_ids"]])
    if "image_grid_thw" not in item:
        return torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1)
    positions, _ = model.model.get_rope_index(
        input_ids=ids, image_grid_thw=item["image_grid_thw"], **token_types(model, ids)
    )
    return positions


def alone(model: Any, item: dict[str, Any]) -> torch.Tensor:
    """The logits of one document run by itself, as the model prepares it."""
    ids = torch.tensor([item["input_ids"]])
    images = {}
    if "image_grid_thw" in item:
        images = {
            "pixel_values": item["pixel_values"],
            "image_grid_thw": item["image_grid_thw"],
            **token_types(model, ids),
        }
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False, **images).logits[0]


# Images of several temporal patches continue the text after them where transformers 5
# does (4.x differed there; Qwen's processors make every image one temporal patch).
TEMPORAL = 2 if int(transformers.__version__.split(".")[0]) >= 5 else 1
grids = st.tuples(st.integers(1, TEMPORAL), st.sampled_from([2, 4, 6]), st.sampled_from([2, 4, 6]))
documents = st.lists(st.one_of(st.integers(0, 6), grids), min_size=1, max_size=6)

DOCS = [[3, (1, 4, 6), 4], [7], [2, (1, 2, 2), 2, (2, 6, 4), 3], [(1, 2, 2), 1, (1, 4, 4)]]


@pytest.mark.usefixtures("one_torch_thread")
@settings(max_examples=60, deadline=None)
@given(parts=documents, seed=st.integers(0, 2**16))
def test_positions_of_one_document_are_transformers_own(
    model: Any, parts: list[Any], seed: int
) -> None:
    item = document(parts, seed)
    n = len(item["input_ids"])
    grid = item.get("image_grid_thw", torch.zeros((0, 3), dtype=torch.int64))
    ours = mrope_position_ids(item["input_ids"], grid, [0, n], image_token_id=IMAGE)
    assert torch.equal(ours, rope_index(model, item))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(documents, st.integers(0, 2**16)), min_size=1, max_size=5),
    pad=st.sampled_from([1, 4]),
)
def test_positions_restart_per_document(rows: list[Any], pad: int) -> None:
    model = _qwen2_vl()
    items = [document(parts, seed) for parts, seed in rows]
    collator = VisionLanguageCollator(
        image_token_id=IMAGE,
        positions="mrope",
        collator=PackedCollator(pad_each_to_multiple_of=pad, pad_to_multiple_of=pad),
    )
    batch = collator(items)
    offsets = batch["cu_seqlens_padded"].tolist()
    kept = [item for item in items if item["input_ids"]]  # empty documents are skipped
    for item, start in zip(kept, offsets, strict=False):
        n = len(item["input_ids"])
        assert torch.equal(batch["position_ids"][:, :, start : start + n], rope_index(model, item))


def test_row_layout() -> None:
    items = [document(parts, seed) for seed, parts in enumerate(DOCS)]
    batch = VisionLanguageCollator(image_token_id=IMAGE)(items)
    n_tokens = sum(len(item["input_ids"]) for item in items)
    assert batch["input_ids"].shape == (1, n_tokens)
    with_images = [item for item in items if "image_grid_thw" in item]
    torch.testing.assert_close(
        batch["pixel_values"], torch.cat([item["pixel_values"] for item in with_images])
    )
    assert batch["image_grid_thw"].tolist() == [
        grid for item in with_images for grid in item["image_grid_thw"].tolist()
    ]
    # First row: the 1-D positions of PackedCollator; then the three MRoPE axes.
    plain = PackedCollator()([{"input_ids": item["input_ids"]} for item in items])
    assert batch["position_ids"].shape == (4, 1, n_tokens)
    assert torch.equal(batch["position_ids"][0], plain["position_ids"])
    assert torch.equal(batch["cu_seqlens"], plain["cu_seqlens"])
    # Placeholders are inputs, never targets; other labels are PackedCollator's.
    placeholder = batch["input_ids"] == IMAGE
    assert (batch["labels"][placeholder] == -100).all()
    assert torch.equal(batch["labels"][~placeholder], plain["labels"][~placeholder])


def test_position_forms() -> None:
    items = [document(parts, seed) for seed, parts in enumerate(DOCS)]
    full = VisionLanguageCollator(image_token_id=IMAGE)(items)["position_ids"]
    mrope = VisionLanguageCollator(image_token_id=IMAGE, positions="mrope")(items)
    text = VisionLanguageCollator(image_token_id=IMAGE, positions="text")(items)
    assert torch.equal(mrope["position_ids"], full[1:])
    assert torch.equal(text["position_ids"], full[0])
    # Text-only documents have the same position on all three axes.
    text_only = VisionLanguageCollator(image_token_id=IMAGE)([document([5]), document([3])])
    assert "pixel_values" not in text_only
    positions = text_only["position_ids"]
    assert (positions == positions[0]).all()
    assert positions[0, 0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]


def test_items_labels_are_kept_but_placeholders_ignored() -> None:
    item = document([2, (1, 2, 2), 1])
    labels = [7] * len(item["input_ids"])
    batch = VisionLanguageCollator(image_token_id=IMAGE)([{**item, "labels": labels}])
    assert batch["labels"][0].tolist() == [-100, 7, 7, -100, 7, 7]
    assert labels == [7] * 6  # the item is left as it was


@pytest.mark.usefixtures("one_torch_thread")
def test_packed_row_logits_equal_each_document_alone(model: Any) -> None:
    items = [document(parts, seed) for seed, parts in enumerate(DOCS)]
    batch = VisionLanguageCollator.from_config(model.config)(items)
    inputs = {key: batch[key] for key in ("input_ids", "pixel_values", "image_grid_thw")}
    with torch.no_grad():
        packed = model(**inputs, position_ids=batch["position_ids"], use_cache=False).logits[0]
        # Given the three MRoPE axes alone, the model attends across documents.
        mixed = model(**inputs, position_ids=batch["position_ids"][1:], use_cache=False).logits[0]
    worst = mixed_worst = 0.0
    for item, start in zip(items, batch["cu_seqlens"].tolist(), strict=False):
        span = slice(start, start + len(item["input_ids"]))
        expected = alone(model, item)
        torch.testing.assert_close(packed[span], expected, rtol=0, atol=1e-5)
        worst = max(worst, float((packed[span] - expected).abs().max()))
        mixed_worst = max(mixed_worst, float((mixed[span] - expected).abs().max()))
    assert worst < 1e-5 < 1e-2 < mixed_worst


def test_bad_documents_are_refused() -> None:
    collator = VisionLanguageCollator(image_token_id=IMAGE)
    item = document([2, (1, 2, 4), 1])
    with pytest.raises(InvalidValueError, match=r"2 image tokens .* make 1"):
        collator([{**item, "image_grid_thw": torch.tensor([[1, 2, 2]])}])
    with pytest.raises(InvalidValueError, match="need 8 patches"):
        collator([{**item, "pixel_values": item["pixel_values"][:4]}])
    with pytest.raises(InvalidValueError, match="no pixel_values"):
        collator([{key: value for key, value in item.items() if key != "pixel_values"}])
    with pytest.raises(InvalidValueError, match="multiples of spatial_merge_size=2"):
        collator([{**item, "image_grid_thw": torch.tensor([[2, 1, 4]])}])
    with pytest.raises(InvalidValueError, match="2 input_ids but 1 labels"):
        collator([{"input_ids": [3, 4], "labels": [3]}])
    with pytest.raises(InvalidTypeError, match="shape \\[images, 3\\]"):
        collator([{**item, "image_grid_thw": torch.tensor([1, 2, 4])}])
    split = dict(item, input_ids=[3, START, IMAGE, 5, IMAGE, END])
    with pytest.raises(InvalidValueError, match="image 0 are not consecutive"):
        collator([split])
    with pytest.raises(InvalidValueError, match="pads with token 60"):
        VisionLanguageCollator(image_token_id=IMAGE, collator=PackedCollator(pad_token_id=IMAGE))
    with pytest.raises(InvalidValueError, match="positions"):
        VisionLanguageCollator(image_token_id=IMAGE, positions="2d")  # type: ignore[arg-type]


def test_an_image_across_documents_is_refused() -> None:
    ids = [3, IMAGE, IMAGE, 4]
    with pytest.raises(InvalidValueError, match="starts in document 0 and ends in document 1"):
        mrope_position_ids(ids, [[1, 2, 4]], [0, 2, 4], image_token_id=IMAGE)
    with pytest.raises(InvalidValueError, match="from 0 to the row's 4 tokens"):
        mrope_position_ids(ids, [[1, 2, 4]], [0, 3], image_token_id=IMAGE)
