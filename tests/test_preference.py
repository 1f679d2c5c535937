"""Preference pairs in packed rows: the collator's layout and errors, per-sequence
log-probabilities from a packed row, the DPO loss, and DPO on packed rows of a tiny Llama
equal to DPO on padded pairs (one process; tests/test_dpo.py runs it on 2 ranks)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from dpo_support import BETA, padded_dpo_loss, padded_logps, pairs, sequence_items
from hypothesis import given, settings
from hypothesis import strategies as st
from run_support import tiny_llama
from torch.utils.data import DataLoader

import tokenbatch as tb
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.torch import (
    IncompletePairError,
    PackedCollator,
    PreferenceCollator,
    TokenBudgetBatchSampler,
    dpo_loss,
    pair_lengths,
    sequence_logps,
)

PAIR = {"prompt_ids": [5, 6, 7], "chosen_ids": [8, 9], "rejected_ids": [10], "pair_id": 4}


def test_a_pair_item_becomes_prompt_plus_chosen_and_prompt_plus_rejected() -> None:
    other = {"chosen_ids": [11, 12], "rejected_ids": [13, 14, 15]}  # no prompt, no id
    batch = PreferenceCollator()([PAIR, other])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 5, 6, 7, 10, 11, 12, 13, 14, 15]]
    ignored = -100
    assert batch["labels"].tolist() == [
        [ignored, ignored, ignored, 8, 9, ignored, ignored, ignored, 10,
         ignored, 12, ignored, 14, 15]
    ]  # fmt: skip
    assert batch["cu_seqlens"].tolist() == [0, 5, 9, 11, 14]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 0, 1, 2]]
    assert batch["chosen_index"].tolist() == [0, 2]
    assert batch["rejected_index"].tolist() == [1, 3]
    assert batch["pair_ids"].tolist() == [4, -1]
    assert "ref_chosen_logps" not in batch
    assert pair_lengths([PAIR, other]).tolist() == [9, 5]


def test_sequence_items_pair_up_in_either_order_with_their_reference_logps() -> None:
    first, second = sequence_items(PAIR)
    items = [
        {**second, "ref_logps": -2.0},  # rejected first
        {**first, "ref_logps": -1.0},
        {**PAIR, "ref_chosen_logps": -3.0, "ref_rejected_logps": -4.0},
    ]
    batch = PreferenceCollator()(items)
    pair_batch = PreferenceCollator()([PAIR, PAIR])
    for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
        assert torch.equal(batch[key], pair_batch[key]), key
    assert batch["pair_ids"].tolist() == [4, 4]
    assert batch["ref_chosen_logps"].tolist() == [-1.0, -3.0]
    assert batch["ref_rejected_logps"].tolist() == [-2.0, -4.0]
    assert batch["ref_chosen_logps"].dtype == torch.float64


def test_the_row_collator_options_apply() -> None:
    collator = PreferenceCollator(collator=PackedCollator(pad_each_to_multiple_of=4))
    batch = collator([PAIR])
    assert batch["cu_seqlens_padded"].tolist() == [0, 8, 12]
    assert batch["cu_seqlens"].tolist() == [0, 5, 9]
    assert pair_lengths([PAIR], pad_each_to_multiple_of=4).tolist() == [12]


@pytest.mark.parametrize("multiple", [1, 8])
def test_bins_of_pair_lengths_make_rows_within_the_budget(multiple: int) -> None:
    items = pairs(200)
    lengths = pair_lengths(items, pad_each_to_multiple_of=multiple)
    collator = PreferenceCollator(collator=PackedCollator(pad_each_to_multiple_of=multiple))
    rows = [collator([items[i] for i in bin_pairs]) for bin_pairs in tb.pack(lengths, 256)]
    assert max(row["input_ids"].shape[1] for row in rows) <= 256
    assert sum(row["input_ids"].shape[1] for row in rows) == lengths.sum()


def test_bad_pairs_are_refused() -> None:
    collate = PreferenceCollator()
    chosen, rejected = sequence_items(PAIR)
    other_chosen, _ = sequence_items({**PAIR, "pair_id": 5})
    with pytest.raises(
        IncompletePairError, match=r"items\[1\], the 'chosen' sequence of pair 4, ends"
    ):
        collate([PAIR, chosen])
    with pytest.raises(IncompletePairError, match="is followed by pair 5"):
        collate([rejected, other_chosen])
    with pytest.raises(IncompletePairError, match="is followed by a pair item"):
        collate([chosen, PAIR])
    with pytest.raises(IncompletePairError, match="both the 'chosen' sequence of pair 4"):
        collate([chosen, chosen])
    with pytest.raises(IncompletePairError, match="no 'rejected_ids' field"):
        collate([{"prompt_ids": [1], "chosen_ids": [2]}])
    assert issubclass(IncompletePairError, InvalidValueError)
    with pytest.raises(InvalidValueError, match="empty chosen_ids sequence"):
        collate([{"chosen_ids": [], "rejected_ids": [2]}])
    with pytest.raises(InvalidValueError, match="5 input_ids but 4 labels"):
        collate([{**chosen, "labels": chosen["labels"][:4]}, rejected])
    with pytest.raises(InvalidValueError, match="expected 'chosen' or 'rejected'"):
        collate([{**chosen, "role": "preferred"}, rejected])
    with pytest.raises(InvalidValueError, match="has no 'pair_id' field"):
        collate([{key: value for key, value in chosen.items() if key != "pair_id"}, rejected])
    with pytest.raises(InvalidValueError, match="pair 1 of the batch has no reference"):
        collate([{**PAIR, "ref_chosen_logps": -1.0, "ref_rejected_logps": -2.0}, PAIR])
    with pytest.raises(InvalidValueError, match="no 'ref_rejected_logps' field"):
        collate([{**PAIR, "ref_chosen_logps": -1.0}])
    with pytest.raises(InvalidTypeError, match="is not a number"):
        collate([{**PAIR, "ref_chosen_logps": "high", "ref_rejected_logps": -2.0}])
    with pytest.raises(InvalidTypeError, match="must hold integers"):
        collate([{**PAIR, "chosen_ids": [1.5]}])
    with pytest.raises(InvalidTypeError, match="items\\[0\\] is a list"):
        collate([[1, 2, 3]])


def looped_logps(logits: torch.Tensor, labels: torch.Tensor, offsets: list[int]) -> list[float]:
    """One sequence and one token at a time."""
    sums = []
    for start, end in itertools.pairwise(offsets):
        total = 0.0
        for t in range(start + 1, end):
            if labels[t] != -100:
                total += float(torch.nn.functional.log_softmax(logits[t - 1], dim=-1)[labels[t]])
        sums.append(total)
    return sums


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_sequence_logps_sum_each_sequences_token_logps(lengths: list[int], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    n = offsets[-1]
    logits = torch.randn(1, n, 11, generator=generator, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (1, n), generator=generator)
    labels[torch.rand(1, n, generator=generator) < 0.3] = -100
    labels[0, [o for o in offsets[:-1] if o < n]] = -100  # as the collator writes them
    ours = sequence_logps(logits, labels, offsets)
    expected = looped_logps(logits[0].detach(), labels[0], offsets)
    np.testing.assert_allclose(ours.detach().numpy(), expected, rtol=1e-12, atol=1e-12)
    ours.sum().backward()
    if n:
        assert logits.grad is not None
        # Only the predictions of counted tokens get a gradient.
        counted = torch.zeros(n, dtype=torch.bool)
        counted[:-1] = labels[0, 1:] != -100
        assert torch.equal(logits.grad[0].abs().sum(dim=1) > 0, counted)


def test_sequence_logps_of_half_precision_logits_are_float32() -> None:
    logits = torch.randn(1, 4, 7).to(torch.bfloat16)
    labels = torch.tensor([[-100, 1, 2, 3]])
    assert sequence_logps(logits, labels, torch.tensor([0, 4], dtype=torch.int32)).dtype == (
        torch.float32
    )


def test_sequence_logps_refuse_shapes_that_do_not_fit() -> None:
    logits, labels = torch.randn(1, 4, 7), torch.zeros(1, 4, dtype=torch.int64)
    with pytest.raises(InvalidValueError, match="from 0 to the row's 4 tokens"):
        sequence_logps(logits, labels, [0, 3])
    with pytest.raises(InvalidValueError, match="must not decrease"):
        sequence_logps(logits, labels, [0, 3, 2, 4])
    with pytest.raises(InvalidValueError, match="logits hold 3 tokens, labels 4"):
        sequence_logps(logits[:, :3], labels, [0, 4])
    with pytest.raises(InvalidTypeError, match="one row"):
        sequence_logps(torch.randn(2, 4, 7), torch.zeros(2, 4, dtype=torch.int64), [0, 4])


def test_dpo_loss_is_the_sigmoid_loss_summed_over_the_steps_pairs() -> None:
    chosen, rejected = torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -2.0])
    ref_chosen, ref_rejected = torch.tensor([-3.5, -4.0]), torch.tensor([-3.0, -3.0])
    margins = [(-3.0 + 3.5) - (-4.0 + 3.0), (-5.0 + 4.0) - (-2.0 + 3.0)]
    per_pair = [-float(torch.nn.functional.logsigmoid(torch.tensor(BETA * m))) for m in margins]
    args = (chosen, rejected, ref_chosen, ref_rejected)
    assert float(dpo_loss(*args)) == pytest.approx(sum(per_pair) / 2)
    assert float(dpo_loss(*args, num_pairs=8)) == pytest.approx(sum(per_pair) / 8)
    assert float(dpo_loss(*args, num_pairs=torch.tensor(8))) == pytest.approx(sum(per_pair) / 8)
    assert float(dpo_loss(*args, beta=0.5)) != pytest.approx(sum(per_pair) / 2)
    # Reference log-probabilities in float64 (as the collator gives them) follow the policy.
    assert dpo_loss(chosen, rejected, ref_chosen.double(), ref_rejected.double()).dtype == (
        torch.float32
    )
    with pytest.raises(InvalidValueError, match="rejected_logps has shape"):
        dpo_loss(chosen, rejected[:1], ref_chosen, ref_rejected)
    with pytest.raises(InvalidValueError, match="beta must be positive"):
        dpo_loss(*args, beta=0.0)
    with pytest.raises(InvalidValueError, match="num_pairs must be at least 1"):
        dpo_loss(*args, num_pairs=0)


def packed_dpo_loss(policy: Any, reference: Any, batch: dict[str, Any], num_pairs: int) -> Any:
    def logps(model: Any) -> torch.Tensor:
        logits = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits
        return sequence_logps(logits, batch["labels"], batch["cu_seqlens_padded"])

    ours = logps(policy)
    with torch.no_grad():
        ref = logps(reference)
    chosen, rejected = batch["chosen_index"], batch["rejected_index"]
    return dpo_loss(
        ours[chosen], ours[rejected], ref[chosen], ref[rejected], beta=BETA, num_pairs=num_pairs
    )


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("form", ["pairs", "sequences"])
@pytest.mark.parametrize("pad", [1, 8])
def test_dpo_on_packed_rows_equals_dpo_on_padded_pairs(form: str, pad: int) -> None:
    items = pairs(24)
    # Bins of whole pairs: a packing of the pairs' totals, each pair served as one item or
    # as its two sequence items next to each other.
    packing = tb.pack(pair_lengths(items), 160)
    collator = PreferenceCollator(
        collator=PackedCollator(pad_each_to_multiple_of=pad, pad_to_multiple_of=pad)
    )
    policy, reference = tiny_llama(seed=0).double(), tiny_llama(seed=1).double()
    total = None
    for bin_pairs in packing:
        pair_indices = bin_pairs.tolist()
        if form == "pairs":
            batch = collator([items[j] for j in pair_indices])
        else:
            batch = collator([s for j in pair_indices for s in sequence_items(items[j])])
        loss = packed_dpo_loss(policy, reference, batch, num_pairs=len(items))
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    packed_grads = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    expected = padded_dpo_loss(policy, reference, items)
    expected.backward()
    assert packing.n_bins > 3
    assert abs(float(total) - float(expected.detach())) < 1e-10
    for ours, theirs in zip(packed_grads, (p.grad for p in policy.parameters()), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)


def test_precomputed_reference_logps_are_those_of_the_packed_row() -> None:
    items = pairs(6)
    reference = tiny_llama(seed=1).double()
    with torch.no_grad():
        chosen, rejected = padded_logps(reference, items)
        batch = PreferenceCollator()(items)
        logits = reference(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits
        logps = sequence_logps(logits, batch["labels"], batch["cu_seqlens_padded"])
    torch.testing.assert_close(logps[batch["chosen_index"]], chosen, rtol=0, atol=1e-10)
    torch.testing.assert_close(logps[batch["rejected_index"]], rejected, rtol=0, atol=1e-10)


def test_a_sampler_over_pair_items_uses_every_pair_once_per_epoch() -> None:
    items = pairs(200)
    lengths = pair_lengths(items)
    seen = []
    for rank in range(2):
        sampler = TokenBudgetBatchSampler(lengths, 256, num_replicas=2, rank=rank, seed=3)
        loader = DataLoader(items, batch_sampler=sampler, collate_fn=PreferenceCollator())
        for batch in loader:
            assert batch["input_ids"].shape[1] <= 256
            seen += batch["pair_ids"].tolist()
    assert sorted(seen) == list(range(200))
