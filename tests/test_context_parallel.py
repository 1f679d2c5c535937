"""tokenbatch.context_parallel: the load-balanced split of a packed row over CP ranks,
checked against a plain reference written from the layout's definition."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F  # noqa: N812
from torch.nn.functional import scaled_dot_product_attention as sdpa
from transformers import LlamaConfig, LlamaForCausalLM

from tokenbatch import InvalidTypeError, InvalidValueError
from tokenbatch.context_parallel import ContextParallelShard, rank_major_order, shard
from tokenbatch.torch import ContextParallelCollator, PackedCollator, shard_batch, unshard

IGNORE = -100


def reference_indices(cu_padded: list[int], cp_size: int, cp_rank: int) -> list[int]:
    """Each padded document cut into 2 * cp_size chunks; rank r takes r and 2cp-1-r."""
    indices: list[int] = []
    for start, end in itertools.pairwise(cu_padded):
        chunk = (end - start) // (2 * cp_size)
        for k in (cp_rank, 2 * cp_size - 1 - cp_rank):
            indices.extend(range(start + k * chunk, start + (k + 1) * chunk))
    return indices


def reference_local_real(real: list[int], padded: list[int], cp_size: int, rank: int) -> list[int]:
    """Cumulative real tokens per document on a rank, counted token by token."""
    cu = [0]
    mine = set(reference_indices(padded, cp_size, rank))
    for doc in range(len(padded) - 1):
        n_real = real[doc + 1] - real[doc]
        cu.append(cu[-1] + sum(1 for i in range(padded[doc], padded[doc] + n_real) if i in mine))
    return cu


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    cp_size = draw(st.integers(1, 5))
    real, padded = [0], [0]
    for length in draw(st.lists(st.integers(0, 50), max_size=10)):
        rounded = -(-length // (2 * cp_size)) * 2 * cp_size
        real.append(real[-1] + length)
        padded.append(padded[-1] + rounded + 2 * cp_size * draw(st.integers(0, 1)))
    return real, padded, cp_size


@settings(max_examples=100, deadline=None)
@given(layouts())
def test_shard_matches_the_reference(layout: tuple[list[int], list[int], int]) -> None:
    real, padded, cp_size = layout
    row = np.arange(padded[-1]) * 3 + 1
    gathered = []  # what an all-gather of every rank's tokens returns
    for rank in range(cp_size):
        part = shard(np.array(padded, dtype=np.int32), cp_size, rank, cu_seqlens=real)
        assert part.indices.tolist() == reference_indices(padded, cp_size, rank)
        assert part.cu_seqlens_padded.tolist() == [p // cp_size for p in padded]
        assert part.cu_seqlens.tolist() == reference_local_real(real, padded, cp_size, rank)
        gathered.extend(row[part.indices].tolist())
    order = rank_major_order(padded, cp_size)
    restored = np.full(len(row), -1)
    restored[order] = gathered
    assert restored.tolist() == row.tolist()


def test_two_ranks_by_hand() -> None:
    # Documents of 7 and 3 real tokens, padded to 8 and 4; cp_size 2 makes chunks of 2 and 1.
    first = shard([0, 8, 12], cp_size=2, cp_rank=0, cu_seqlens=[0, 7, 10])
    assert isinstance(first, ContextParallelShard)
    assert first.indices.tolist() == [0, 1, 6, 7, 8, 11]
    assert first.cu_seqlens.tolist() == [0, 3, 4]  # token 7 and token 11 are padding
    assert first.cu_seqlens_padded.tolist() == [0, 4, 6]
    assert repr(first) == "ContextParallelShard(tokens=6, documents=2)"
    with pytest.raises(ValueError, match="read-only"):
        first.indices[0] = 5
    assert shard([0, 8, 12], 1, 0).indices.tolist() == list(range(12))


def test_bad_layouts_name_the_problem() -> None:
    with pytest.raises(InvalidValueError, match=r"document 1 has 6 tokens .* multiple of 4"):
        shard([0, 4, 10], cp_size=2, cp_rank=0)
    with pytest.raises(InvalidValueError, match="cp_rank must be in"):
        shard([0, 4], cp_size=2, cp_rank=2)
    with pytest.raises(InvalidValueError, match="cp_size must be at least 1"):
        shard([0, 4], cp_size=0, cp_rank=0)
    with pytest.raises(InvalidValueError, match="5 real tokens"):
        shard([0, 4], cp_size=2, cp_rank=0, cu_seqlens=[0, 5])
    with pytest.raises(InvalidValueError, match="decreases"):
        rank_major_order([0, 4, 0], 1)
    with pytest.raises(InvalidTypeError, match="must hold integers"):
        shard([0.0, 4.0], cp_size=1, cp_rank=0)


# --- torch: sharding whole batches ---------------------------------------------------


def chunk_order_concat(shards: list[list[int]], cu_padded: list[int], cp_size: int) -> list[int]:
    """Concatenate the chunks of all ranks in chunk order: chunk k of a document lives on
    rank min(k, 2cp-1-k), in the first half of its part of that rank's shard for k < cp."""
    row: list[int] = []
    for doc in range(len(cu_padded) - 1):
        chunk = (cu_padded[doc + 1] - cu_padded[doc]) // (2 * cp_size)
        local_start = cu_padded[doc] // cp_size
        for k in range(2 * cp_size):
            rank, half = (k, 0) if k < cp_size else (2 * cp_size - 1 - k, 1)
            first = local_start + half * chunk
            row.extend(shards[rank][first : first + chunk])
    return row


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(1, 999), max_size=25), max_size=6),
    cp_size=st.integers(1, 4),
    with_labels=st.booleans(),
)
def test_shards_rebuild_the_row_and_keep_documents_apart(
    docs: list[list[int]], cp_size: int, with_labels: bool
) -> None:
    items = [
        {"input_ids": doc, **({"labels": [t + 1000 for t in doc]} if with_labels else {})}
        for doc in docs
    ]
    collator = PackedCollator(pad_each_to_multiple_of=2 * cp_size, return_seq_idx=True)
    full = collator(items)
    cu_padded = full["cu_seqlens_padded"].tolist()
    cu = full["cu_seqlens"].tolist()
    labels = full["labels"][0].tolist()
    shift_labels = [*labels[1:], IGNORE][: len(labels)]  # every token's target, in the row
    parts = [
        ContextParallelCollator(cp_size, rank, collator=collator)(items) for rank in range(cp_size)
    ]
    for key, whole in [
        ("input_ids", full["input_ids"][0].tolist()),
        ("labels", labels),
        ("shift_labels", shift_labels),
        ("position_ids", full["position_ids"][0].tolist()),
        ("seq_idx", full["seq_idx"][0].tolist()),
    ]:
        shards = [part[key][0].tolist() for part in parts]
        assert chunk_order_concat(shards, cu_padded, cp_size) == whole, key
        assert unshard([part[key] for part in parts], cu_padded)[0].tolist() == whole, key
    real_on_ranks = np.zeros(len(cu) - 1, dtype=np.int64)
    for rank, part in enumerate(parts):
        index = reference_indices(cu_padded, cp_size, rank)
        assert part["input_ids"].shape == (1, cu_padded[-1] // cp_size)
        for local, at in enumerate(index):
            doc = int(np.searchsorted(cu_padded, at, side="right")) - 1
            assert part["seq_idx"][0, local] == doc
            assert part["position_ids"][0, local] == at - cu_padded[doc]
            # No target crosses a document boundary: a token's target is the next token
            # of its own document, or nothing.
            target = int(part["shift_labels"][0, local])
            if target != IGNORE:
                assert at + 1 < cu_padded[doc] + cu[doc + 1] - cu[doc]
                expected = full["input_ids"][0, at + 1] + (1000 if with_labels else 0)
                assert target == expected
        assert part["cu_seqlens"].tolist() == cu  # the whole row's, as TE takes them
        assert part["cu_seqlens_padded"].tolist() == cu_padded
        on_rank = part["cu_seqlens_on_cp_rank"]
        assert on_rank.dtype == part["cu_seqlens_padded_on_cp_rank"].dtype == torch.int32
        assert part["cu_seqlens_padded_on_cp_rank"].tolist() == [p // cp_size for p in cu_padded]
        assert on_rank.tolist() == reference_local_real(cu, cu_padded, cp_size, rank)
        real_on_ranks += np.diff(on_rank.numpy())
        assert "cu_seq_lens_q" not in part
    assert real_on_ranks.tolist() == np.diff(cu).tolist()


def rank_index(cu_padded: list[int], cp_size: int, cp_rank: int) -> torch.Tensor:
    # A copy: torch warns about the core's read-only arrays.
    return torch.tensor(shard(cu_padded, cp_size, cp_rank).indices)


def causal_document_mask(query_at: torch.Tensor, cu_padded: list[int]) -> torch.Tensor:
    """True where a query at row position query_at[i] may attend the key at row position j."""
    document = torch.zeros(cu_padded[-1], dtype=torch.long)
    for d in range(len(cu_padded) - 1):
        document[cu_padded[d] : cu_padded[d + 1]] = d
    keys = torch.arange(cu_padded[-1])
    same = document[query_at][:, None] == document[None, :]
    return same & (keys[None, :] <= query_at[:, None])


@pytest.mark.parametrize("cp_size", [2, 3])
def test_attention_on_rank_chunks_with_gathered_keys_equals_the_unsharded_row(
    cp_size: int,
) -> None:
    torch.manual_seed(0)
    docs = [[1] * n for n in (13, 2, 30, 7)]
    collator = PackedCollator(pad_each_to_multiple_of=2 * cp_size)
    full = collator(docs)
    cu_padded = full["cu_seqlens_padded"].tolist()
    n = cu_padded[-1]
    heads, dim = 2, 8
    q, k, v = (torch.randn(heads, n, dim) for _ in range(3))
    reference = sdpa(q, k, v, attn_mask=causal_document_mask(torch.arange(n), cu_padded))
    outputs = []
    for rank in range(cp_size):
        index = rank_index(cu_padded, cp_size, rank)
        # Every rank holds only its chunks of q, k and v; keys and values come from all.
        k_all = unshard(
            [k[:, rank_index(cu_padded, cp_size, r)] for r in range(cp_size)], cu_padded
        )
        v_all = unshard(
            [v[:, rank_index(cu_padded, cp_size, r)] for r in range(cp_size)], cu_padded
        )
        mask = causal_document_mask(index, cu_padded)
        outputs.append(sdpa(q[:, index], k_all, v_all, attn_mask=mask))
    torch.testing.assert_close(unshard(outputs, cu_padded), reference)


def test_shift_labels_give_the_full_row_loss_from_the_shards() -> None:
    """A Hugging Face model's loss from shift_labels equals its loss from labels, and the
    loss summed over every rank's tokens equals the loss of the whole row."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, attn_implementation="sdpa",
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    docs = [{"input_ids": torch.randint(1, 40, (n,)).tolist()} for n in (9, 3, 14)]
    cp_size = 2
    whole = ContextParallelCollator(1, 0, collator=PackedCollator(pad_each_to_multiple_of=4))(docs)
    with torch.no_grad():
        inputs = {"input_ids": whole["input_ids"], "position_ids": whole["position_ids"]}
        by_labels = model(**inputs, labels=whole["labels"], use_cache=False)
        by_shift = model(
            **inputs, labels=whole["labels"], shift_labels=whole["shift_labels"], use_cache=False
        )
    torch.testing.assert_close(by_shift.loss, by_labels.loss)
    loss_sum, targets = torch.tensor(0.0), 0
    for rank in range(cp_size):
        part = ContextParallelCollator(cp_size, rank)(docs)
        index = rank_index(part["cu_seqlens_padded"].tolist(), cp_size, rank)
        logits = by_labels.logits[0, index]  # what CP attention computes on this rank
        loss_sum += F.cross_entropy(logits, part["shift_labels"][0], reduction="sum")
        targets += int((part["shift_labels"] != IGNORE).sum())
    torch.testing.assert_close(loss_sum / targets, by_labels.loss)


def test_bad_batches_and_options() -> None:
    with pytest.raises(InvalidValueError, match="no 'cu_seqlens_padded'"):
        shard_batch({"input_ids": torch.zeros(1, 4, dtype=torch.long)}, 2, 0)
    batch = PackedCollator(pad_each_to_multiple_of=4)([[1, 2, 3]])
    with pytest.raises(InvalidValueError, match="not a multiple of 2 \\* cp_size = 8"):
        shard_batch(batch, 4, 0)
    with pytest.raises(InvalidTypeError, match=r"shape \[1, tokens\]"):
        shard_batch({**batch, "input_ids": batch["input_ids"][0]}, 2, 0)
    with pytest.raises(InvalidValueError, match="has 3 tokens but cu_seqlens_padded ends at 4"):
        shard_batch({**batch, "position_ids": batch["position_ids"][:, :3]}, 2, 0)
    with pytest.raises(InvalidValueError, match="pad_each_to_multiple_of=2 is not a multiple"):
        ContextParallelCollator(2, 0, collator=PackedCollator(pad_each_to_multiple_of=2))
    with pytest.raises(InvalidValueError, match="pad_to_multiple_of=6 must be 1 or a multiple"):
        ContextParallelCollator(
            2, 0, collator=PackedCollator(pad_each_to_multiple_of=4, pad_to_multiple_of=6)
        )
    with pytest.raises(InvalidValueError, match="cp_rank must be in"):
        ContextParallelCollator(2, 2)
    with pytest.raises(InvalidTypeError, match="must be a PackedCollator"):
        ContextParallelCollator(2, 0, collator=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="hold 3 tokens along dim 1"):
        unshard([torch.zeros(1, 3)], [0, 4])
    with pytest.raises(InvalidValueError, match="at least one rank"):
        unshard([], [0, 4])
