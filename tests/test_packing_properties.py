"""Invariants of packing, stated as hypothesis properties, and exact agreement with the
pure-Python reference implementations."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenbatch as tb
from tokenbatch.datasets import example_lengths
from tokenbatch.reference import (
    SplitMix64,
    mix_seed,
    reference_batch_padded,
    reference_pack,
)

ALGORITHMS = ["bfd", "ffd", "next_fit", "first_fit_shuffled"]
SPLITTING = ["truncate", "split", "drop"]

lengths_strategy = st.lists(
    st.one_of(st.integers(0, 40), st.integers(0, 300)), min_size=0, max_size=200
)


@st.composite
def pack_arguments(draw: st.DrawFn) -> dict[str, object]:
    max_tokens = draw(st.integers(1, 120))
    return {
        "lengths": draw(lengths_strategy),
        "max_tokens": max_tokens,
        "max_seqs": draw(st.none() | st.integers(1, 6)),
        "pad_to_multiple_of": draw(st.integers(1, min(4, max_tokens))),
        "oversize": draw(st.sampled_from(SPLITTING)),
        "algorithm": draw(st.sampled_from(ALGORITHMS)),
        "seed": draw(st.integers(0, 2**64 - 1)),
    }


def check_invariants(lengths: list[int], packing: tb.Packing, arguments: dict[str, object]) -> None:
    """Every token placed exactly once, no bin over budget or over max_seqs."""
    max_tokens = int(arguments["max_tokens"])  # type: ignore[call-overload]
    multiple = int(arguments["pad_to_multiple_of"])  # type: ignore[call-overload]
    max_seqs = arguments["max_seqs"]
    capacity = max_tokens // multiple * multiple
    sizes = np.diff(packing.bin_offsets)
    assert (sizes > 0).all(), "empty bin"
    if max_seqs is not None:
        assert (sizes <= max_seqs).all()
    costs = -(-packing.lengths // multiple) * multiple
    per_bin = np.add.reduceat(costs, packing.bin_offsets[:-1]) if packing.n_bins else costs[:0]
    assert np.array_equal(per_bin, packing.bin_tokens)
    assert (packing.bin_tokens <= max_tokens).all()
    pieces: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for index, start, length in zip(packing.indices, packing.starts, packing.lengths, strict=True):
        pieces[int(index)].append((int(start), int(length)))
    policy = arguments["oversize"]
    for index, length in enumerate(lengths):
        got = sorted(pieces.pop(index, []))
        if length <= capacity:
            assert got == [(0, length)]
        elif policy == "drop":
            assert got == []
        elif policy == "truncate":
            assert got == [(0, capacity)]
        else:
            assert [start for start, _ in got] == list(range(0, length, capacity))
            assert sum(piece for _, piece in got) == length
    assert not pieces, "segment of a sequence that does not exist"


@settings(max_examples=300, deadline=None)
@given(pack_arguments())
def test_pack_places_every_token_exactly_once(arguments: dict[str, object]) -> None:
    lengths: list[int] = arguments["lengths"]  # type: ignore[assignment]
    packing = tb.pack(**arguments)  # type: ignore[arg-type]
    check_invariants(lengths, packing, arguments)
    again = tb.pack(**arguments)  # type: ignore[arg-type]
    for name in ("bin_offsets", "indices", "starts", "lengths", "bin_tokens"):
        assert np.array_equal(getattr(packing, name), getattr(again, name))


@settings(max_examples=300, deadline=None)
@given(pack_arguments())
def test_pack_equals_the_reference(arguments: dict[str, object]) -> None:
    packing = tb.pack(**arguments)  # type: ignore[arg-type]
    expected = reference_pack(**arguments)  # type: ignore[arg-type]
    assert packing.bin_offsets.tolist() == expected.bin_offsets
    assert packing.indices.tolist() == expected.indices
    assert packing.starts.tolist() == expected.starts
    assert packing.lengths.tolist() == expected.lengths
    assert packing.bin_tokens.tolist() == expected.bin_tokens
    stats = packing.stats()
    for key, value in expected.counts.items():
        assert stats[key] == value, key


@settings(max_examples=200, deadline=None)
@given(pack_arguments())
def test_batch_padded_equals_the_reference_and_holds_invariants(
    arguments: dict[str, object],
) -> None:
    arguments = {k: v for k, v in arguments.items() if k not in ("algorithm", "seed")}
    padded = tb.batch_padded(**arguments)  # type: ignore[arg-type]
    expected = reference_batch_padded(**arguments)  # type: ignore[arg-type]
    assert padded.bin_offsets.tolist() == expected.bin_offsets
    assert padded.indices.tolist() == expected.indices
    assert padded.bin_tokens.tolist() == expected.bin_tokens
    assert (padded.bin_tokens <= arguments["max_tokens"]).all()  # type: ignore[operator]
    sizes = np.diff(padded.bin_offsets)
    multiple = int(arguments["pad_to_multiple_of"])  # type: ignore[call-overload]
    for bin_index, size in enumerate(sizes):
        lo = padded.bin_offsets[bin_index]
        longest = -(-int(padded.lengths[lo : lo + size].max()) // multiple) * multiple
        assert padded.bin_tokens[bin_index] == size * longest


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=2, max_size=300), st.sampled_from(["bfd", "ffd"]))
def test_any_fit_never_leaves_two_mergeable_bins(lengths: list[int], algorithm: str) -> None:
    # A bin is opened only when the segment fits no earlier bin, and bins only grow.
    packing = tb.pack(lengths, 100, algorithm=algorithm)  # type: ignore[arg-type]
    tokens = np.sort(packing.bin_tokens)
    if len(tokens) >= 2:
        assert tokens[0] + tokens[1] > 100


def test_bfd_matches_reference_on_a_realistic_sample() -> None:
    lengths = example_lengths("chat", 3000, max_length=4096, seed=2).tolist()
    packing = tb.pack(lengths, 4096)
    expected = reference_pack(lengths, 4096)
    assert packing.indices.tolist() == expected.indices
    assert packing.bin_offsets.tolist() == expected.bin_offsets


def test_splitmix_reference_stream() -> None:
    rng = SplitMix64(0)
    assert rng.next_u64() == 0xE220A8397B1DCDAF
    assert rng.next_u64() == 0x6E789E6AA1B965F4
    assert mix_seed([1, 2]) != mix_seed([2, 1])
