"""PackedCollator with per-document padding, seq_idx and a position offset: the layouts
that context parallelism and non-attention models need, checked against plain
references, Hugging Face's collator and real Hugging Face models."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.functional import scaled_dot_product_attention as sdpa
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM

import tokenbatch as tb
from tokenbatch import InvalidTypeError, InvalidValueError
from tokenbatch.torch import PackedCollator

IGNORE = -100


def test_per_document_padding_by_hand() -> None:
    collate = PackedCollator(
        pad_each_to_multiple_of=4, return_seq_idx=True, position_ids_start=2, pad_token_id=9
    )
    batch = collate([[1, 2, 3], [], {"input_ids": [4, 5]}, [6, 7, 8, 9, 10]])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 9, 4, 5, 9, 9, 6, 7, 8, 9, 10, 9, 9, 9]]
    x = IGNORE
    assert batch["labels"].tolist() == [[x, 2, 3, x, x, 5, x, x, x, 7, 8, 9, 10, x, x, x]]
    assert batch["position_ids"].tolist() == [[2, 3, 4, 5, 2, 3, 4, 5, 2, 3, 4, 5, 6, 7, 8, 9]]
    assert batch["seq_idx"].tolist() == [[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2]]
    assert batch["seq_idx"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == [0, 3, 5, 10]
    assert batch["cu_seqlens_padded"].tolist() == [0, 4, 8, 16]
    assert batch["cu_seqlens_padded"].dtype == torch.int32
    assert batch["max_seqlen"] == batch["max_length_q"] == 8
    # Hugging Face kernels get the row layout: padding belongs to the sequence before it.
    assert torch.equal(batch["cu_seq_lens_q"], batch["cu_seqlens_padded"])
    # Row padding on top: one more sequence, in both offset arrays.
    both = PackedCollator(pad_each_to_multiple_of=4, pad_to_multiple_of=8)([[1, 2, 3]])
    assert both["cu_seqlens"].tolist() == [0, 3, 7]
    assert both["cu_seqlens_padded"].tolist() == [0, 4, 8]
    assert both["labels"].tolist() == [[IGNORE, 2, 3] + [IGNORE] * 5]


def test_options_are_checked() -> None:
    with pytest.raises(InvalidValueError, match="pad_each_to_multiple_of"):
        PackedCollator(pad_each_to_multiple_of=0)
    with pytest.raises(InvalidTypeError, match="return_seq_idx must be a bool"):
        PackedCollator(return_seq_idx=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="position_ids_start"):
        PackedCollator(position_ids_start=1.5)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(1, 999), max_size=20), max_size=8),
    with_labels=st.booleans(),
    multiple=st.integers(1, 8),
    start=st.integers(0, 3),
)
def test_every_document_is_intact(
    docs: list[list[int]], with_labels: bool, multiple: int, start: int
) -> None:
    items: list[dict[str, Any]] = []
    for doc in docs:
        item: dict[str, Any] = {"input_ids": doc}
        if with_labels:
            item["labels"] = [token + 1000 for token in doc]
        items.append(item)
    batch = PackedCollator(
        pad_each_to_multiple_of=multiple,
        return_seq_idx=True,
        position_ids_start=start,
        pad_token_id=0,
    )(items)
    row = batch["input_ids"][0].tolist()
    labels = batch["labels"][0].tolist()
    positions = batch["position_ids"][0].tolist()
    seq_idx = batch["seq_idx"][0].tolist()
    kept = [doc for doc in docs if doc]
    offset, real = 0, 0
    assert batch["cu_seqlens_padded"].tolist()[0] == batch["cu_seqlens"].tolist()[0] == 0
    for d, doc in enumerate(kept):
        padded = math.ceil(len(doc) / multiple) * multiple
        span = range(offset, offset + padded)
        assert [row[i] for i in span] == doc + [0] * (padded - len(doc))
        targets = [token + 1000 for token in doc] if with_labels else doc
        assert [labels[i] for i in span] == [IGNORE] + targets[1:] + [IGNORE] * (padded - len(doc))
        assert [positions[i] for i in span] == list(range(start, start + padded))
        assert [seq_idx[i] for i in span] == [d] * padded
        offset, real = offset + padded, real + len(doc)
        assert batch["cu_seqlens_padded"][d + 1] == offset
        assert batch["cu_seqlens"][d + 1] == real
    assert len(row) == offset
    assert batch["max_seqlen"] == max(
        (math.ceil(len(d) / multiple) * multiple for d in kept), default=0
    )


@pytest.mark.parametrize("with_labels", [False, True])
def test_matches_hugging_face_flattening_when_nothing_is_padded(with_labels: bool) -> None:
    rng = np.random.default_rng(0)
    items = []
    for n in (3, 1, 7, 4):
        item = {"input_ids": rng.integers(1, 100, n).tolist()}
        if with_labels:
            item["labels"] = rng.integers(-100, 100, n).tolist()
        items.append(item)
    theirs = DataCollatorWithFlattening(
        return_flash_attn_kwargs=True, return_seq_idx=True, position_ids_start=2
    )(items)
    ours = PackedCollator(return_seq_idx=True, position_ids_start=2)(items)
    for key in ("input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), key
    assert ours["max_length_q"] == theirs["max_length_q"]
    assert ours["max_length_k"] == theirs["max_length_k"]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 70), min_size=1, max_size=40),
    max_tokens=st.integers(8, 64),
    multiple=st.integers(1, 8),
    oversize=st.sampled_from(["split", "truncate", "drop"]),
    row_multiple=st.sampled_from([1, 2, 4]),
)
def test_a_bin_that_fits_the_packing_makes_a_row_that_fits(
    lengths: list[int], max_tokens: int, multiple: int, oversize: str, row_multiple: int
) -> None:
    """The packer charges each segment its length rounded up to ``multiple``; the
    collator pads each segment to that multiple: the row is exactly the bin's cost."""
    max_tokens -= max_tokens % row_multiple  # row padding keeps within a budget it divides
    packing = tb.pack(lengths, max_tokens, pad_to_multiple_of=multiple, oversize=oversize)
    tokens = [np.arange(n) + 1 for n in lengths]
    collate = PackedCollator(pad_each_to_multiple_of=multiple, pad_to_multiple_of=row_multiple)
    for b in range(packing.n_bins):
        segments = range(packing.bin_offsets[b], packing.bin_offsets[b + 1])
        items = [
            tokens[packing.indices[s]][packing.starts[s] : packing.starts[s] + packing.lengths[s]]
            for s in segments
        ]
        width = collate(items)["input_ids"].shape[1]
        assert width <= max_tokens
        if row_multiple == 1:
            assert width == packing.bin_tokens[b]


def block_diagonal_causal_mask(cu_padded: list[int]) -> torch.Tensor:
    """True where query i may attend key j: same document, j <= i."""
    n = cu_padded[-1]
    document = torch.zeros(n, dtype=torch.long)
    for d in range(len(cu_padded) - 1):
        document[cu_padded[d] : cu_padded[d + 1]] = d
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return causal & (document[:, None] == document[None, :])


def test_attention_over_padded_documents_equals_each_document_alone() -> None:
    torch.manual_seed(0)
    docs = [[1] * n for n in (5, 1, 12, 8, 3)]
    batch = PackedCollator(pad_each_to_multiple_of=4)(docs)
    cu_padded = batch["cu_seqlens_padded"].tolist()
    cu = batch["cu_seqlens"].tolist()
    heads, dim = 2, 8
    q, k, v = (torch.randn(heads, cu_padded[-1], dim) for _ in range(3))
    masked = sdpa(q, k, v, attn_mask=block_diagonal_causal_mask(cu_padded))
    for d in range(len(docs)):
        start, n = cu_padded[d], cu[d + 1] - cu[d]
        real = slice(start, start + n)
        alone = sdpa(q[:, real], k[:, real], v[:, real], is_causal=True)
        torch.testing.assert_close(masked[:, real], alone)
        # Per-document attention over the padded span: the padding comes after the real
        # tokens, so causal attention never lets a real token see it.
        span = slice(start, cu_padded[d + 1])
        padded = sdpa(q[:, span], k[:, span], v[:, span], is_causal=True)
        torch.testing.assert_close(padded[:, :n], alone)


def test_llama_logits_and_loss_on_a_padded_row_equal_each_document_alone() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa",
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(1)
    docs = [torch.randint(1, 50, (n,), generator=generator) for n in (5, 2, 9, 4)]
    batch = PackedCollator(pad_each_to_multiple_of=4)([{"input_ids": d} for d in docs])
    with torch.no_grad():
        # Without an attention mask, the sdpa model keeps the documents apart by where
        # position_ids restart; padding continues its document's positions.
        packed = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            labels=batch["labels"],
            use_cache=False,
        )
        loss_sum, targets = 0.0, 0
        for doc, start in zip(docs, batch["cu_seqlens_padded"].tolist(), strict=False):
            alone = model(input_ids=doc[None], labels=doc[None], use_cache=False)
            torch.testing.assert_close(packed.logits[0, start : start + len(doc)], alone.logits[0])
            loss_sum += float(alone.loss) * (len(doc) - 1)
            targets += len(doc) - 1
    assert float(packed.loss) == pytest.approx(loss_sum / targets, rel=1e-5)


def test_seq_idx_keeps_documents_apart_in_a_hugging_face_convolution() -> None:
    """Inkling2's dynamic short convolution (keys and values of its attention layers) reads
    seq_idx in plain PyTorch: on a padded row it gives each document's own output."""
    from transformers.models.inkling2.modeling_inkling2 import Inkling2DynamicShortConvolution

    torch.manual_seed(0)
    conv = Inkling2DynamicShortConvolution(
        hidden_size=8, input_size=6, num_heads=2, conv_kernel_size=4, layer_idx=0, conv_idx=0
    )
    torch.nn.init.normal_(conv.static_weight)
    batch = PackedCollator(pad_each_to_multiple_of=4, return_seq_idx=True)(
        [[1] * n for n in (5, 2, 7, 1)]
    )
    n = batch["input_ids"].shape[1]
    hidden, dynamic = torch.randn(1, n, 8), torch.randn(1, n, 6)
    cu, cu_padded = batch["cu_seqlens"].tolist(), batch["cu_seqlens_padded"].tolist()
    with torch.no_grad():
        packed = conv(hidden, dynamic, seq_idx=batch["seq_idx"])
        mixed = conv(hidden, dynamic)
        for d in range(len(cu) - 1):
            real = slice(cu_padded[d], cu_padded[d] + cu[d + 1] - cu[d])
            alone = conv(hidden[:, real], dynamic[:, real])
            torch.testing.assert_close(packed[:, real], alone)
            if d > 0:  # without seq_idx, a document's first tokens see the previous one
                assert not torch.allclose(mixed[:, real], alone)


def test_mamba_hybrid_model_reads_seq_idx_but_needs_its_cuda_kernels() -> None:
    """GraniteMoeHybrid (Mamba-2 and attention layers) passes seq_idx to its Mamba layers;
    their PyTorch fallback cannot honour it and refuses, where the causal_conv1d and
    mamba_ssm CUDA kernels take it. Without seq_idx the packed documents mix."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    torch.manual_seed(0)
    config = GraniteMoeHybridConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, layer_types=["mamba", "attention"],
        mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8,
        mamba_chunk_size=8, num_local_experts=0, shared_intermediate_size=32,
    )  # fmt: skip
    model = GraniteMoeHybridForCausalLM(config).eval()
    docs = [torch.randint(1, 64, (n,)) for n in (6, 9, 4)]
    batch = PackedCollator(pad_each_to_multiple_of=4, return_seq_idx=True)(
        [{"input_ids": d} for d in docs]
    )
    inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    with torch.no_grad():
        with pytest.raises(ValueError, match="can't keep packed sequences apart without"):
            model(**inputs, seq_idx=batch["seq_idx"], use_cache=False)
        mixed = model(**inputs, use_cache=False).logits[0]
        start = batch["cu_seqlens_padded"].tolist()[1]
        alone = model(input_ids=docs[1][None], use_cache=False).logits[0]
    assert not torch.allclose(mixed[start : start + len(docs[1])], alone, atol=1e-4)
