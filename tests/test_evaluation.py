"""Evaluation passes: the sampler gives every document to exactly one rank with equal
steps, the collator marks the padding batches, and the per-document losses of packed rows
reduce to exactly what each document gives alone."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from tokenbatch import InvalidTypeError, InvalidValueError, OversizeError, pack
from tokenbatch.torch import (
    DocumentLosses,
    EvaluationBatchSampler,
    EvaluationCollator,
    EvaluationDataset,
    PackedCollator,
    document_losses,
    model_inputs,
)
from tokenbatch.torch.evaluation import EMPTY_SLOT, EVALUATION_KEYS


def rank_passes(lengths: Any, max_tokens: int, num_replicas: int, **options: Any) -> list[Any]:
    """Batches of every rank, each rank's sampler built independently (as on real ranks)."""
    samplers = [
        EvaluationBatchSampler(lengths, max_tokens, num_replicas=num_replicas, rank=r, **options)
        for r in range(num_replicas)
    ]
    for sampler in samplers[1:]:
        np.testing.assert_array_equal(sampler.steps, samplers[0].steps)
    return [list(sampler) for sampler in samplers]


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=150),
    max_tokens=st.integers(40, 100),
    num_replicas=st.integers(1, 7),
    algorithm=st.sampled_from(["bfd", "ffd", "next_fit"]),
    balance=st.sampled_from(["attention", "tokens", None]),
    max_seqs=st.sampled_from([None, 1, 3]),
)
def test_every_document_exactly_once_with_equal_steps(
    lengths: list[int],
    max_tokens: int,
    num_replicas: int,
    algorithm: str,
    balance: Any,
    max_seqs: int | None,
) -> None:
    passes = rank_passes(
        lengths, max_tokens, num_replicas, algorithm=algorithm, balance=balance, max_seqs=max_seqs
    )
    assert len({len(batches) for batches in passes}) == 1, "ranks ran different step counts"
    seen = Counter(i for batches in passes for batch in batches for i in batch)
    assert sorted(seen) == list(range(len(lengths)))
    assert set(seen.values()) == {1}
    # Empty batches only in the last step, on the highest ranks, and only as many as the
    # bins leave over.
    n_steps = len(passes[0])
    n_bins = len(pack(lengths, max_tokens, algorithm=algorithm, max_seqs=max_seqs))  # type: ignore[arg-type]
    assert n_steps == -(-n_bins // num_replicas)
    empty = [(s, r) for r, batches in enumerate(passes) for s, b in enumerate(batches) if not b]
    filled = n_bins - (n_steps - 1) * num_replicas  # bins of the last step
    assert sorted(empty) == [(n_steps - 1, r) for r in range(filled, num_replicas)]
    for rank, batches in enumerate(passes):
        sampler = EvaluationBatchSampler(
            lengths, max_tokens, num_replicas=num_replicas, rank=rank, algorithm=algorithm,
            balance=balance, max_seqs=max_seqs,
        )  # fmt: skip
        assert sampler.rank_documents().tolist() == [i for batch in batches for i in batch]
        assert all(sum(lengths[i] for i in batch) <= max_tokens for batch in batches)


def test_costliest_bins_run_first_and_ranks_of_a_step_cost_about_the_same() -> None:
    lengths = [30, 5, 28, 6, 2, 31, 3, 29]
    sampler = EvaluationBatchSampler(lengths, 32, num_replicas=2, rank=0, balance="attention")
    costs = [
        -1 if b == EMPTY_SLOT else sum(lengths[i] ** 2 for i in sampler.packing[b])
        for b in sampler.steps.reshape(-1)
    ]
    dealt = [c for c in costs if c >= 0]
    assert dealt == sorted(dealt, reverse=True)


def test_fewer_bins_than_ranks_give_padding_batches_only() -> None:
    passes = rank_passes([7], 16, 3)
    assert passes == [[[0]], [[]], [[]]]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"lengths": []}, InvalidValueError, "at least one document"),
        ({"lengths": [3, 40]}, OversizeError, "40"),
        ({"rank": 2}, InvalidValueError, "rank"),
        ({"algorithm": "first_fit_shuffled"}, InvalidValueError, "algorithm"),
        ({"balance": "bytes"}, InvalidValueError, "balance"),
        ({"balance": "flops"}, InvalidValueError, "hidden_size"),
        ({"max_tokens": 0}, InvalidValueError, "max_tokens"),
        ({"pad_to_multiple_of": 0}, InvalidValueError, "pad_to_multiple_of"),
        ({"dataset": [1, 2, 3]}, InvalidValueError, "dataset has 3"),
        ({"lengths": [1.5, 2]}, InvalidTypeError, "lengths"),
    ],
)
def test_bad_sampler_options_are_refused(options: dict[str, Any], error: type, match: str) -> None:
    arguments: dict[str, Any] = {"lengths": [3, 4], "max_tokens": 16, "num_replicas": 2, "rank": 0}
    arguments.update(options)
    with pytest.raises(error, match=match):
        EvaluationBatchSampler(arguments.pop("lengths"), arguments.pop("max_tokens"), **arguments)


def test_rank_documents_refuses_an_unknown_rank() -> None:
    sampler = EvaluationBatchSampler([3, 4], 16, num_replicas=2, rank=0)
    with pytest.raises(InvalidValueError, match="num_replicas=2"):
        sampler.rank_documents(2)


# -- the collator --------------------------------------------------------------------


def test_padding_batch_is_one_token_without_labels() -> None:
    row = EvaluationCollator(PackedCollator(pad_token_id=7))([])
    assert row["padding_batch"] is True
    assert row["input_ids"].tolist() == [[7]]
    assert (row["labels"] == -100).all()
    assert row["document_ids"].tolist() == row["empty_document_ids"].tolist() == []
    assert model_inputs(row).keys() == row.keys() - set(EVALUATION_KEYS)
    assert "padding_batch" not in model_inputs(row)
    _, counts = document_losses(
        torch.zeros(1, 1, 11), row["labels"], cu_seqlens=row["cu_seqlens_padded"]
    )
    assert counts.tolist() == [0]


def test_document_ids_follow_the_row_and_skip_empty_documents() -> None:
    docs = [[1, 2, 3], [], [4, 5]]
    loader = DataLoader(
        EvaluationDataset(docs), batch_sampler=[[2, 1, 0]], collate_fn=EvaluationCollator()
    )
    (row,) = list(loader)
    assert row["padding_batch"] is False
    assert row["document_ids"].tolist() == [2, 0]
    assert row["empty_document_ids"].tolist() == [1]
    assert row["input_ids"].tolist() == [[4, 5, 1, 2, 3]]


def test_collator_refuses_items_without_their_index() -> None:
    with pytest.raises(InvalidTypeError, match="EvaluationDataset"):
        EvaluationCollator()([{"input_ids": [1, 2]}])
    with pytest.raises(InvalidTypeError, match="PackedCollator"):
        EvaluationCollator(object())  # type: ignore[arg-type]


# -- the losses ----------------------------------------------------------------------


def alone_losses(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[float, int]:
    """Summed next-token loss of one document, as a model evaluated alone gives it."""
    loss = torch.nn.functional.cross_entropy(logits[:-1], tokens[1:], reduction="sum")
    return float(loss), len(tokens) - 1


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=8),
    pad_each=st.sampled_from([1, 4]),
    pad_row=st.sampled_from([1, 8]),
    seed=st.integers(0, 2**32 - 1),
)
def test_document_losses_are_each_documents_own(
    lengths: list[int], pad_each: int, pad_row: int, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, 11, (n,), generator=generator) for n in lengths]
    collator = PackedCollator(pad_each_to_multiple_of=pad_each, pad_to_multiple_of=pad_row)
    pairs = [(i, {"input_ids": d}) for i, d in enumerate(docs)]
    row = EvaluationCollator(collator)(pairs)
    logits = torch.randn(1, row["input_ids"].shape[1], 11, generator=generator, dtype=torch.float64)
    sums, counts = document_losses(logits, row["labels"], cu_seqlens=row["cu_seqlens_padded"])
    offsets = row["cu_seqlens_padded"].tolist()
    ids = row["document_ids"].tolist()
    assert ids == [i for i, n in enumerate(lengths) if n]
    for k, doc in enumerate(ids):
        start = offsets[k]
        n = lengths[doc]
        expected, tokens = alone_losses(logits[0, start : start + n], docs[doc])
        assert counts[k] == tokens
        assert sums[k].item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert counts[len(ids) :].sum() == 0
    if pad_each == 1:
        by_positions = document_losses(logits, row["labels"], position_ids=row["position_ids"])
        # Positions cannot tell a padding sequence that continues the last document's
        # numbers apart: compare the documents.
        torch.testing.assert_close(by_positions[0][: len(ids)], sums[: len(ids)])


def test_first_label_of_every_sequence_is_never_a_target() -> None:
    logits = torch.randn(1, 5, 4, dtype=torch.float64)
    labels = torch.tensor([[1, 2, 3, 0, 1]])  # no ignore_index at the second sequence's start
    _, counts = document_losses(logits, labels, cu_seqlens=[0, 3, 5])
    assert counts.tolist() == [2, 1]


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"cu_seqlens": [0, 4]}, InvalidValueError, "cu_seqlens must rise from 0"),
        ({"cu_seqlens": [0, 3, 2, 5]}, InvalidValueError, "cu_seqlens must rise"),
        ({}, InvalidValueError, "exactly one of"),
        ({"cu_seqlens": [0, 5], "position_ids": [[0, 1, 2, 3, 4]]}, InvalidValueError, "one of"),
        ({"position_ids": [[0, 1, 2]]}, InvalidValueError, "position_ids has 3"),
        ({"labels": torch.zeros(1, 4, dtype=torch.int64)}, InvalidValueError, "labels have 4"),
        ({"logits": torch.zeros(2, 5, 3)}, InvalidValueError, "one row"),
        ({"logits": [[0.0]]}, InvalidTypeError, "torch.Tensor"),
    ],
)
def test_bad_loss_inputs_are_refused(arguments: dict[str, Any], error: type, match: str) -> None:
    logits = arguments.pop("logits", torch.zeros(1, 5, 3))
    labels = arguments.pop("labels", torch.zeros(1, 5, dtype=torch.int64))
    with pytest.raises(error, match=match):
        document_losses(logits, labels, **arguments)


def test_reduction_gives_the_token_mean_and_each_documents_mean() -> None:
    losses = DocumentLosses(3)
    losses.add([2, 0], [6.0, 1.5, 0.0], [3, 1, 0])
    losses.add([1], [0.0], [0])
    result = losses.reduce()
    assert result.loss == pytest.approx(7.5 / 4)
    assert result.tokens == 4
    np.testing.assert_array_equal(result.document_tokens, [1, 0, 3])
    np.testing.assert_allclose(result.document_losses, [1.5, np.nan, 2.0])
    assert result.metrics("val") == {"val_loss": pytest.approx(7.5 / 4), "val_tokens": 4.0}


@pytest.mark.parametrize(
    ("adds", "match"),
    [
        ([([0, 0], [1.0, 1.0], [1, 1])], "document 0 was evaluated twice"),
        ([([1], [1.0], [1]), ([1], [1.0], [1])], "document 1 was evaluated twice"),
        ([([0], [1.0, 2.0], [1, 1])], "label tokens after its last document"),
        ([([0, 1], [1.0], [1])], "every document needs"),
        ([([3], [1.0], [1])], r"in \[0, 3\)"),
    ],
)
def test_bad_additions_are_refused(adds: list[Any], match: str) -> None:
    losses = DocumentLosses(3)
    *before, last = adds
    for add in before:
        losses.add(*add)
    with pytest.raises(InvalidValueError, match=match):
        losses.add(*last)


def test_a_pass_missing_a_document_is_refused() -> None:
    losses = DocumentLosses(3)
    losses.add([0, 2], [1.0, 1.0], [1, 1])
    with pytest.raises(InvalidValueError, match=r"1 missing \(first \[1\]\)"):
        losses.reduce()
