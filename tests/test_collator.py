"""PackedCollator and PaddedCollator: the tensors attention kernels and models expect."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from tokenbatch import InvalidTypeError, InvalidValueError
from tokenbatch.torch import PackedCollator, PaddedCollator, TokenBudgetBatchSampler


def test_packed_batch_layout() -> None:
    items = [
        {"input_ids": [11, 12, 13]},
        {"input_ids": np.array([21, 22], dtype=np.int32)},
        {"input_ids": torch.tensor([31])},
    ]
    batch = PackedCollator()(items)
    assert batch["input_ids"].tolist() == [[11, 12, 13, 21, 22, 31]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0]]
    # The first token of each document is never a target: no document predicts the next.
    assert batch["labels"].tolist() == [[-100, 12, 13, -100, 22, -100]]
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == [0, 3, 5, 6]
    assert batch["max_seqlen"] == 3
    for key in ("input_ids", "labels", "position_ids"):
        assert batch[key].dtype == torch.int64
    assert torch.equal(batch["cu_seq_lens_q"], batch["cu_seqlens"])
    assert torch.equal(batch["cu_seq_lens_k"], batch["cu_seqlens"])
    assert batch["max_length_q"] == batch["max_length_k"] == 3


def test_packed_batch_keeps_item_labels_and_leaves_items_untouched() -> None:
    ids = np.array([5, 6, 7, 8])
    labels = np.array([-100, -100, 7, 8])  # a prompt whose first tokens are not trained
    items = [{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": ids, "labels": labels}]
    batch = PackedCollator()(items)
    assert batch["labels"].tolist() == [[-100, 2, -100, -100, 7, 8]]
    assert batch["input_ids"].tolist() == [[1, 2, 5, 6, 7, 8]]
    np.testing.assert_array_equal(ids, [5, 6, 7, 8])
    np.testing.assert_array_equal(labels, [-100, -100, 7, 8])


def test_packed_batch_skips_empty_sequences_and_pads_to_a_multiple() -> None:
    items = [[1, 2, 3], [], [4, 5]]
    batch = PackedCollator(pad_to_multiple_of=4, pad_token_id=9)(items)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 9, 9, 9]]
    assert batch["labels"].tolist() == [[-100, 2, 3, -100, 5, -100, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert batch["cu_seqlens"].tolist() == [0, 3, 5, 8]
    empty = PackedCollator()([])
    assert empty["input_ids"].shape == (1, 0)
    assert empty["cu_seqlens"].tolist() == [0]
    assert empty["max_seqlen"] == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1000), max_size=30), max_size=12))
def test_packed_batch_invariants(sequences: list[list[int]]) -> None:
    batch = PackedCollator(ignore_index=-1)([{"input_ids": s} for s in sequences])
    kept = [s for s in sequences if s]
    flat = [t for s in kept for t in s]
    assert batch["input_ids"].tolist() == [flat]
    cu = batch["cu_seqlens"].tolist()
    assert cu == np.concatenate([[0], np.cumsum([len(s) for s in kept])]).tolist()
    positions = batch["position_ids"][0].tolist()
    labels = batch["labels"][0].tolist()
    for lo, hi in itertools.pairwise(cu):
        assert positions[lo:hi] == list(range(hi - lo))
        assert labels[lo] == -1
        assert labels[lo + 1 : hi] == flat[lo + 1 : hi]
    assert batch["max_seqlen"] == max((len(s) for s in kept), default=0)


def test_packed_collator_rejects_bad_items() -> None:
    collate = PackedCollator()
    with pytest.raises(InvalidValueError, match="3 input_ids but 2 labels"):
        collate([{"input_ids": [1, 2, 3], "labels": [1, 2]}])
    with pytest.raises(InvalidTypeError, match="must hold integers"):
        collate([{"input_ids": [1.0, 2.5]}])
    with pytest.raises(InvalidValueError, match="no 'input_ids' field"):
        collate([{"tokens": [1]}])
    with pytest.raises(InvalidTypeError, match="one-dimensional"):
        collate([{"input_ids": [[1, 2]]}])
    with pytest.raises(InvalidValueError, match="pad_to_multiple_of"):
        PackedCollator(pad_to_multiple_of=0)


def test_padded_batch_layout() -> None:
    items = [{"input_ids": [1, 2, 3]}, {"input_ids": [4], "labels": [-100]}, {"input_ids": []}]
    batch = PaddedCollator(pad_token_id=0)(items)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0], [0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    assert batch["labels"].tolist() == [[1, 2, 3], [-100, -100, -100], [-100, -100, -100]]
    left = PaddedCollator(padding_side="left", pad_to_multiple_of=4, pad_token_id=7)(items[:2])
    assert left["input_ids"].tolist() == [[7, 1, 2, 3], [7, 7, 7, 4]]
    assert left["attention_mask"].tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    with pytest.raises(InvalidValueError, match="padding_side"):
        PaddedCollator(padding_side="middle")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "collate"), [("packed", PackedCollator()), ("padded", PaddedCollator())]
)
def test_collators_cover_the_dataset_through_a_dataloader(mode: str, collate: Any) -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 60, size=300)
    dataset = [{"input_ids": rng.integers(1, 100, size=n)} for n in lengths.tolist()]
    sampler = TokenBudgetBatchSampler(lengths, 128, mode=mode, dataset=dataset)
    real = 0
    for batch in DataLoader(dataset, batch_sampler=sampler, collate_fn=collate):
        assert batch["input_ids"].numel() <= 128
        if mode == "packed":
            assert batch["input_ids"].shape[0] == 1
            real += batch["input_ids"].numel()
        else:
            real += int(batch["attention_mask"].sum())
    assert real == int(lengths.sum())
