"""Collating preference pairs and vision-language documents into packed rows.

Full run (numbers in benches/RESULTS.md):
    TOKENBATCH_BENCH_FULL=1 pytest benches/bench_collators.py --benchmark-enable
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
import torch
import trl
from conftest import sizes
from transformers import Qwen2VLConfig, Qwen2VLModel
from trl.trainer.dpo_trainer import DataCollatorForPreference

from tokenbatch.torch import PreferenceCollator, mrope_position_ids

ROW_TOKENS = sizes([16_384, 131_072], [8_192])
IMAGE, START, END = 60, 62, 63


def vision_documents(row_tokens: int, seed: int = 0) -> list[dict[str, Any]]:
    """Documents of one packed row: text of 50-2,000 tokens; 30% of them also carry 1-4
    images of 256-1,024 placeholder tokens (merged grids of 16-32 x 16-32)."""
    rng = np.random.default_rng(seed)
    documents, total = [], 0
    while total < row_tokens:
        ids = rng.integers(3, 59, int(np.clip(rng.lognormal(5.5, 1.0), 50, 2000))).tolist()
        grids = []
        if rng.random() < 0.3:
            for _ in range(int(rng.integers(1, 5))):
                height, width = (int(x) for x in rng.integers(16, 33, 2))
                ids += [START] + [IMAGE] * (height * width) + [END, 7]
                grids.append((1, 2 * height, 2 * width))
        documents.append({"input_ids": ids, "image_grid_thw": grids})
        total += len(ids)
    return documents


def rope_index_per_document(model: Any, documents: list[dict[str, Any]]) -> torch.Tensor:
    """What packed training does without a row-wide function: transformers' own
    ``get_rope_index`` on each document, then a ``cat``."""
    takes_types = "mm_token_type_ids" in inspect.signature(model.get_rope_index).parameters
    pieces = []
    for document in documents:
        ids = torch.tensor([document["input_ids"]])
        if not document["image_grid_thw"]:
            pieces.append(torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1))
            continue
        types = {"mm_token_type_ids": (ids == IMAGE).int()} if takes_types else {}
        grid = torch.tensor(document["image_grid_thw"])
        positions, _ = model.get_rope_index(input_ids=ids, image_grid_thw=grid, **types)
        pieces.append(positions)
    return torch.cat(pieces, dim=2)


@pytest.fixture(scope="module")
def qwen2_vl() -> Any:
    text = dict(
        vocab_size=64, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
    )  # fmt: skip
    vision = dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2, spatial_merge_size=2)
    config = Qwen2VLConfig(
        text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=61,
        vision_start_token_id=START, vision_end_token_id=END,
    )  # fmt: skip
    return Qwen2VLModel(config)


@pytest.mark.parametrize("implementation", ["tokenbatch", "transformers per document"])
@pytest.mark.parametrize("row_tokens", ROW_TOKENS)
def test_mrope_positions_of_a_row(
    benchmark: Any, qwen2_vl: Any, implementation: str, row_tokens: int
) -> None:
    documents = vision_documents(row_tokens)
    ids = [token for document in documents for token in document["input_ids"]]
    grids = [grid for document in documents for grid in document["image_grid_thw"]]
    offsets = np.cumsum([0] + [len(document["input_ids"]) for document in documents])
    benchmark.group = f"mrope positions row={row_tokens:,}"
    benchmark.extra_info.update(tokens=len(ids), documents=len(documents), images=len(grids))
    if implementation == "tokenbatch":
        row = torch.tensor(ids)  # the collated row
        positions = benchmark(
            lambda: mrope_position_ids(
                row, grids, offsets, image_token_id=IMAGE, spatial_merge_size=2
            )
        )
    else:
        positions = benchmark(rope_index_per_document, qwen2_vl, documents)
    assert torch.equal(positions, rope_index_per_document(qwen2_vl, documents))


def preference_pairs(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Pairs as TRL tokenizes them: prompts of 20-500 tokens, completions of 10-800."""
    rng = np.random.default_rng(seed)
    return [
        {
            "prompt_ids": rng.integers(3, 32_000, int(rng.integers(20, 500))).tolist(),
            "chosen_ids": rng.integers(3, 32_000, int(rng.integers(10, 800))).tolist(),
            "rejected_ids": rng.integers(3, 32_000, int(rng.integers(10, 800))).tolist(),
        }
        for _ in range(n)
    ]


def trl_items(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pairs under the keys of the installed TRL's collator (``*_input_ids`` in 0.x)."""
    if int(trl.__version__.split(".")[0]) >= 1:
        return pairs
    return [{key.replace("_ids", "_input_ids"): value for key, value in p.items()} for p in pairs]


COLLATORS = {
    "tokenbatch PreferenceCollator (packed row)": (PreferenceCollator(), lambda pairs: pairs),
    "TRL DataCollatorForPreference (padded)": (
        DataCollatorForPreference(pad_token_id=0),
        trl_items,
    ),
}


@pytest.mark.parametrize("collator", list(COLLATORS))
@pytest.mark.parametrize("n_pairs", sizes([16, 128], [16]))
def test_collate_preference_pairs(benchmark: Any, collator: str, n_pairs: int) -> None:
    pairs = preference_pairs(n_pairs)
    collate, items_for = COLLATORS[collator]
    benchmark.group = f"collate {n_pairs} preference pairs"
    batch = benchmark(collate, items_for(pairs))
    tokens = sum(
        2 * len(p["prompt_ids"]) + len(p["chosen_ids"]) + len(p["rejected_ids"]) for p in pairs
    )
    benchmark.extra_info.update(tokens=tokens)
    if collator.startswith("tokenbatch"):
        assert batch["input_ids"].shape == (1, tokens)
