"""Epoch deals (tokenbatch.distribute), without torch: exactly-once use of every token,
equal steps, budgets, golden deals that pin what every rank receives, independence from
the thread count, and the numpy views the Rust classes hand out."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenbatch as tb
from tokenbatch.distribute import DEAL_FORMAT, Dealer, EpochDeal, deal_epoch
from tokenbatch.errors import InvalidTypeError, InvalidValueError

# ------------------------------------------------------------------------------ golden


def golden_packings() -> dict[str, tb.Packing]:
    """Fixed inputs with many equal lengths, built without any random generator."""
    cyclic = [(i * 37) % 500 + 1 for i in range(3000)]
    return {
        "equal": tb.pack([100] * 400 + [300] * 150 + [1000] * 30, 1024),
        "cyclic": tb.pack(cyclic, 2048),
        "few_long": tb.pack([64] * 5 + [10], 64),
        "padded": tb.batch_padded(cyclic, 2048, pad_to_multiple_of=8),
    }


def deal_digest(deal: EpochDeal) -> str:
    """blake2b of everything a rank receives: the table and the segments it points to."""
    digest = hashlib.blake2b(digest_size=12)
    for array in (deal.steps, deal.bin_offsets, deal.indices, deal.starts, deal.lengths):
        digest.update(np.ascontiguousarray(array, dtype="<i8").tobytes())
    return digest.hexdigest()


def golden_digests() -> dict[str, str]:
    """Digest of every golden deal (or the error it raises), by case name."""
    digests = {}
    for name, packing in golden_packings().items():
        pad = 8 if name == "padded" else 1
        for ranks in (3, 7, 8):
            for split in (False, True):
                case = f"{name}/{ranks}/{'split' if split else 'whole'}"
                try:
                    deal = deal_epoch(
                        packing,
                        ranks,
                        epoch=1,
                        seed=42,
                        split_sequences=split,
                        pad_to_multiple_of=pad,
                    )
                except InvalidValueError:
                    digests[case] = "refused"
                else:
                    digests[case] = deal_digest(deal)
    return digests


#: Deal format 2. Any change here changes what ranks receive: bump DEAL_FORMAT with it.
GOLDEN = {
    "equal/3/whole": "50ae4c176e352bef997ddc52",
    "equal/3/split": "50ae4c176e352bef997ddc52",
    "equal/7/whole": "fbf1a782e4f9399f22518a80",
    "equal/7/split": "fbf1a782e4f9399f22518a80",
    "equal/8/whole": "a363bcbda0c7b341e82e9647",
    "equal/8/split": "a363bcbda0c7b341e82e9647",
    "cyclic/3/whole": "4ce6b340fef8da7ac8cbbf89",
    "cyclic/3/split": "4ce6b340fef8da7ac8cbbf89",
    "cyclic/7/whole": "97863ab96fbe1f552fba43ea",
    "cyclic/7/split": "97863ab96fbe1f552fba43ea",
    "cyclic/8/whole": "2bcccb80561da63697c46b86",
    "cyclic/8/split": "2bcccb80561da63697c46b86",
    "few_long/3/whole": "ebabc169f8916ac75d129125",
    "few_long/3/split": "ebabc169f8916ac75d129125",
    "few_long/7/whole": "refused",
    "few_long/7/split": "eedb1cf3b36ed75cda09ddf4",
    "few_long/8/whole": "refused",
    "few_long/8/split": "57280b0232354178189c57f0",
    "padded/3/whole": "4a110aa54997940fd9ffa3fb",
    "padded/3/split": "4a110aa54997940fd9ffa3fb",
    "padded/7/whole": "9946c6154764439a7aa8dcf3",
    "padded/7/split": "9946c6154764439a7aa8dcf3",
    "padded/8/whole": "81389ea112da83fcf1323824",
    "padded/8/split": "81389ea112da83fcf1323824",
}


def test_golden_deals_are_pinned() -> None:
    assert DEAL_FORMAT == 2
    assert golden_digests() == GOLDEN


def test_deals_are_the_same_with_one_thread_or_two() -> None:
    code = (
        "import importlib.util, json, sys, tokenbatch\n"
        f"spec = importlib.util.spec_from_file_location('golden', {str(Path(__file__))!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(json.dumps([tokenbatch.get_num_threads(), module.golden_digests()]))\n"
    )
    results = []
    for threads in ("1", "2"):
        env = {**os.environ, "TOKENBATCH_NUM_THREADS": threads}
        output = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout
        results.append(json.loads(output))
    assert [threads for threads, _ in results] == [1, 2]
    assert results[0][1] == results[1][1] == GOLDEN


# ------------------------------------------------------------------------ properties


def covered_tokens(pieces: list[tuple[int, int, int]]) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = defaultdict(list)
    for index, start, length in pieces:
        tokens[index].extend(range(start, start + length))
    return {index: sorted(found) for index, found in tokens.items()}


def segments_of(packing: tb.Packing) -> list[tuple[int, int, int]]:
    return list(
        zip(
            packing.indices.tolist(), packing.starts.tolist(), packing.lengths.tolist(), strict=True
        )
    )


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 90), max_size=80),
    max_tokens=st.integers(64, 200),
    ranks=st.integers(1, 9),
    padded=st.booleans(),
    pad=st.sampled_from([1, 2, 8]),
    split=st.booleans(),
    drop_last=st.booleans(),
    balance=st.sampled_from(["attention", "tokens", "flops", None]),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 3),
)
def test_every_token_once_in_equal_steps_within_budget(
    lengths: list[int],
    max_tokens: int,
    ranks: int,
    padded: bool,
    pad: int,
    split: bool,
    drop_last: bool,
    balance: Any,
    shuffle: bool,
    seed: int,
    epoch: int,
) -> None:
    if padded:
        packing = tb.batch_padded(lengths, max_tokens, pad_to_multiple_of=pad, oversize="split")
    else:
        packing = tb.pack(lengths, max_tokens, pad_to_multiple_of=pad, oversize="split")
    options: dict[str, Any] = {
        "epoch": epoch,
        "seed": seed,
        "shuffle": shuffle,
        "balance": balance,
        "drop_last": drop_last,
        "pad_to_multiple_of": pad,
        "split_sequences": split,
        "hidden_size": 128,
    }
    try:
        deal = deal_epoch(packing, ranks, **options)
    except InvalidValueError as error:
        refused = str(error)
    else:
        refused = ""
    if refused:
        # Only when no cutting can make enough non-empty bins.
        assert not drop_last
        assert "drop_last=True" in refused
        most = sum(max(n, 1) for n in packing.lengths.tolist()) if split else packing.n_segments
        assert most < -(-packing.n_bins // ranks) * ranks
        return
    assert deal.steps.shape == (deal.n_steps, ranks)
    pieces = []
    for rank in range(ranks):
        batches = list(deal.batches(rank, segments=True))
        assert len(batches) == deal.n_steps
        for batch in batches:
            assert batch, "empty batch"
            spans = [-(-length // pad) * pad for _, _, length in batch]
            cost = len(spans) * max(spans) if padded else sum(spans)
            assert cost <= max_tokens
            pieces.extend(batch)
    used = covered_tokens(pieces)
    expected = covered_tokens(segments_of(packing))
    stats = deal.stats()
    if stats["dropped_bins"] == 0:
        assert used == expected
    else:
        assert stats["dropped_bins"] < ranks
        for index, tokens in used.items():
            assert len(set(tokens)) == len(tokens)
            assert set(tokens) <= set(expected[index])
        assert stats["total_tokens"] + stats["drop_last_tokens"] == packing.total_tokens


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(20, 300),
    chain=st.lists(st.tuples(st.integers(1, 8), st.floats(0, 1)), min_size=1, max_size=3),
    first=st.integers(1, 8),
    seed=st.integers(0, 1000),
)
def test_deal_after_a_chain_of_resizes_uses_every_token_once(
    n: int, chain: list[tuple[int, float]], first: int, seed: int
) -> None:
    lengths = [(i * 53) % 700 + 1 for i in range(n)]
    packing = tb.pack(lengths, 1024, oversize="split")
    options: dict[str, Any] = {"seed": seed, "split_sequences": True}
    pieces: list[tuple[int, int, int]] = []
    runs: list[tuple[int, int]] = []
    try:
        deal = Dealer(packing, first, **options).deal(2)
        for size, fraction in chain:
            steps = int(fraction * deal.n_steps)
            for rank in range(deal.num_replicas):
                batches = deal.batches(rank, segments=True)
                pieces.extend(
                    p for _, batch in zip(range(steps), batches, strict=False) for p in batch
                )
            runs.append((deal.num_replicas, steps))
            deal = Dealer(packing, size, **options).deal_after(2, runs)
    except InvalidValueError as error:
        refused = str(error)
    else:
        refused = ""
    if refused:
        assert "cannot" in refused  # too few sequences left for the new world size
        return
    for rank in range(deal.num_replicas):
        pieces.extend(p for batch in deal.batches(rank, segments=True) for p in batch)
    assert covered_tokens(pieces) == covered_tokens(segments_of(packing))


# ------------------------------------------------------------------- the Rust classes


def test_arrays_are_read_only_views_of_the_owner() -> None:
    packing = tb.pack([5, 9, 3, 7, 1, 8], 10)
    deal = deal_epoch(packing, 2, split_sequences=True)
    # The deal's arrays belong to the Rust object it wraps.
    for owner, name in [(packing, "indices"), (packing, "bin_tokens"), (deal._deal, "steps")]:
        array = getattr(owner, name)
        assert array.base is owner, name
        assert not array.flags.writeable, name
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    # No split, so the deal's segments are the packing's own memory.
    assert np.shares_memory(deal.indices, packing.indices)
    assert np.shares_memory(deal.rank_bins(1), deal.steps)
    np.testing.assert_array_equal(deal.rank_bins(1), deal.steps[:, 1])


def test_packing_pickles_and_refuses_corrupt_arrays() -> None:
    packing = tb.pack([70, 300, 512, 900, 100, 1000, 24, 400], 1024, oversize="split")
    again = pickle.loads(pickle.dumps(packing))
    assert repr(again) == repr(packing)
    assert again.stats() == packing.stats()
    for name in ("bin_offsets", "indices", "starts", "lengths", "bin_tokens"):
        np.testing.assert_array_equal(getattr(again, name), getattr(packing, name))
    rebuild, parts = packing.__reduce__()
    broken = (parts[0][::-1].copy(), *parts[1:])
    with pytest.raises(InvalidValueError, match="bin_offsets"):
        rebuild(*broken)


def test_deal_stats_and_costs_of_padded_documents() -> None:
    # pad_to_multiple_of=4: every document occupies, and attends over, its padded length.
    packing = tb.pack([5, 3, 8, 2], 16, pad_to_multiple_of=4)
    deal = deal_epoch(packing, 1, pad_to_multiple_of=4, shuffle=False)
    assert deal.step_costs("tokens").sum() == 8 + 4 + 8 + 4
    assert deal.step_costs("attention").sum() == 64 + 16 + 64 + 16
    assert deal.real_tokens().sum() == 18
    stats = deal.stats()
    assert stats["padding_tokens"] == 6
    assert stats["total_tokens"] == 18


def test_dealer_attributes_and_argument_errors() -> None:
    packing = tb.pack([5, 9, 3, 7, 1, 8], 10)
    dealer = Dealer(packing, 2, seed=3, balance=None, hidden_size=64)
    assert dealer.packing is packing
    assert (dealer.num_replicas, dealer.seed, dealer.balance) == (2, 3, None)
    assert dealer.shuffle
    assert not dealer.drop_last
    assert dealer.hidden_size == 64
    assert dealer.epoch_tokens == packing.total_tokens
    deal = dealer.deal(0)
    assert repr(deal) == f"EpochDeal(epoch=0, num_replicas=2, n_steps={deal.n_steps})"
    with pytest.raises(InvalidTypeError, match=r"packing must be a tokenbatch\.Packing"):
        Dealer([1, 2], 2)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="num_replicas must be at least 1"):
        Dealer(packing, 0)
    assert Dealer(packing, 2.0).num_replicas == 2  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match=r"num_replicas must be an integer, got 2\.5"):
        Dealer(packing, 2.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="num_replicas must be an integer"):
        Dealer(packing, "2")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="num_replicas must be an integer"):
        Dealer(packing, True)
    with pytest.raises(InvalidValueError, match="seed must be in"):
        Dealer(packing, 2, seed=-1)
    with pytest.raises(InvalidTypeError, match="shuffle must be a bool"):
        Dealer(packing, 2, shuffle=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="balance must be"):
        Dealer(packing, 2, balance="fast")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="hidden_size"):
        Dealer(packing, 2, balance="flops")
    with pytest.raises(InvalidValueError, match="rank must be smaller than num_replicas=2"):
        deal.rank_bins(2)
    with pytest.raises(InvalidValueError, match="rank must be at least 0"):
        deal.batches(-1)
    with pytest.raises(InvalidValueError, match="beyond"):
        deal.rest(deal.n_steps + 1)
    with pytest.raises(InvalidValueError, match="kind must be"):
        deal.step_costs("time")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="epoch must be at least 0"):
        dealer.deal(-1)
    with pytest.raises(InvalidValueError, match="does not match the deal"):
        dealer.deal_after(0, [(2, 10**6)])
