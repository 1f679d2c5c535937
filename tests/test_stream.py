"""StreamPacker and StreamingDataset: exactly-once placement, bounded memory, sharding,
determinism and resume."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenbatch as tb
from tokenbatch.errors import InvalidTypeError, InvalidValueError, OversizeError
from tokenbatch.stream import StreamPacker


class OneShot:
    """An iterable that is not indexable (read from its start, like a file or a network
    stream); counts how many times it was opened."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.opened = 0

    def __iter__(self) -> Iterator[Any]:
        self.opened += 1
        yield from self.items


def segments_of(
    lengths: list[int], max_tokens: int, **options: Any
) -> list[list[tuple[int, int, int]]]:
    packer = StreamPacker(lengths, max_tokens, length_fn=int, output="segments", **options)
    return list(packer)


def assert_exact_cover(bins: list[list[tuple[int, int, int]]], lengths: list[int]) -> None:
    """Every token of every item appears in exactly one segment."""
    pieces: dict[int, list[tuple[int, int]]] = {}
    for bin_ in bins:
        for position, start, length in bin_:
            pieces.setdefault(position, []).append((start, length))
    assert set(pieces) == {p for p, n in enumerate(lengths)}
    for position, parts in pieces.items():
        cursor = 0
        for start, length in sorted(parts):
            assert start == cursor
            cursor += length
        assert cursor == lengths[position]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), max_size=300),
    max_tokens=st.integers(1, 128),
    buffer_size=st.integers(2, 40),
    max_seqs=st.none() | st.integers(1, 6),
    shuffle=st.booleans(),
)
def test_split_places_every_token_once_within_budget(
    lengths: list[int], max_tokens: int, buffer_size: int, max_seqs: int | None, shuffle: bool
) -> None:
    bins = segments_of(
        lengths,
        max_tokens,
        buffer_size=buffer_size,
        max_seqs=max_seqs,
        shuffle=shuffle,
        oversize="split",
    )
    assert_exact_cover(bins, lengths)
    for bin_ in bins:
        assert bin_, "no empty bins"
        assert sum(segment[2] for segment in bin_) <= max_tokens
        assert max_seqs is None or len(bin_) <= max_seqs
        assert [s[0] for s in bin_] == sorted(s[0] for s in bin_), "stream order inside a bin"


def test_truncate_and_drop() -> None:
    lengths = [5, 30, 7, 12, 0]
    truncated = segments_of(lengths, 10, oversize="truncate", buffer_size=4)
    placed = sorted(s for b in truncated for s in b)
    assert placed == [(0, 0, 5), (1, 0, 10), (2, 0, 7), (3, 0, 10), (4, 0, 0)]
    packer = StreamPacker(lengths, 10, oversize="drop", length_fn=int, output="segments")
    dropped = sorted(s for b in packer for s in b)
    assert dropped == [(0, 0, 5), (2, 0, 7), (4, 0, 0)]
    assert packer.dropped_seqs == 2


def test_efficiency_close_to_packing_everything_at_once() -> None:
    lengths = tb.datasets.example_lengths("lognormal", 30_000, max_length=4096, seed=1)
    everything = tb.pack(lengths, 4096)
    bins = segments_of(lengths.tolist(), 4096, buffer_size=1024)
    assert_exact_cover(bins, lengths.tolist())
    efficiency = int(lengths.sum()) / (len(bins) * 4096)
    assert efficiency > everything.efficiency - 0.002
    # A tiny buffer still packs, just less tightly.
    small = segments_of(lengths.tolist(), 4096, buffer_size=8)
    assert len(bins) < len(small)


class Tracked(dict[str, Any]):
    """An item that counts how many of its kind are alive."""

    alive = 0

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        Tracked.alive += 1

    def __del__(self) -> None:
        Tracked.alive -= 1


def test_memory_is_bounded_by_the_buffer_not_the_stream() -> None:
    rng = np.random.default_rng(0)
    peak = 0

    def stream() -> Iterator[Tracked]:
        nonlocal peak
        for _ in range(5_000):
            peak = max(peak, Tracked.alive)
            yield Tracked(input_ids=[1] * int(rng.integers(1, 200)))

    class Source:
        def __iter__(self) -> Iterator[Tracked]:
            return stream()

    total = 0
    for bin_ in StreamPacker(Source(), 256, buffer_size=64):
        total += len(bin_)
        del bin_
    assert total == 5_000
    # buffer + the bins of one repack still waiting to be yielded + one bin being read
    assert peak <= 2 * 64 + 2


def test_items_are_cut_into_pieces_with_their_labels() -> None:
    items = [
        {"input_ids": list(range(n)), "labels": [-x for x in range(n)], "id": i}
        for i, n in enumerate([3, 25, 10, 4, 9])
    ]
    bins = list(StreamPacker(items, 10, buffer_size=4, oversize="split"))
    pieces: dict[int, list[tuple[list[int], list[int]]]] = {}
    for bin_ in bins:
        assert sum(len(item["input_ids"]) for item in bin_) <= 10
        for item in bin_:
            pieces.setdefault(item["id"], []).append((item["input_ids"], item["labels"]))
    # pieces may leave in any order; token i of the items above is i, so sort by it
    rebuilt = {i: [t for ids, _ in sorted(p) for t in ids] for i, p in pieces.items()}
    labels = {i: [t for _, lab in sorted(p) for t in lab] for i, p in pieces.items()}
    assert rebuilt == {item["id"]: item["input_ids"] for item in items}
    assert labels == {item["id"]: item["labels"] for item in items}
    # whole items are passed through, not copied
    whole = [item for bin_ in bins for item in bin_ if item["id"] == 0]
    assert whole[0] is items[0]


@pytest.mark.parametrize("indexable", [True, False])
def test_shards_partition_the_stream(indexable: bool) -> None:
    lengths = tb.datasets.example_lengths("chat", 2_000, max_length=1024, seed=2).tolist()
    seen: Counter[int] = Counter()
    for shard in range(3):
        source: Any = lengths if indexable else OneShot(lengths)
        packer = StreamPacker(
            source, 1024, num_shards=3, shard=shard, length_fn=int, output="segments"
        )
        positions = [s[0] for b in packer for s in b]
        assert all(p % 3 == shard for p in positions)
        seen.update(positions)
    assert seen == Counter(range(len(lengths)))


def test_deterministic_for_a_seed_and_the_same_for_both_source_kinds() -> None:
    lengths = tb.datasets.example_lengths("lognormal", 3_000, max_length=2048, seed=3).tolist()
    first = segments_of(lengths, 2048, buffer_size=128, seed=7)
    assert first == segments_of(lengths, 2048, buffer_size=128, seed=7)
    streamed = list(
        StreamPacker(
            OneShot(lengths), 2048, buffer_size=128, seed=7, length_fn=int, output="segments"
        )
    )
    assert streamed == first
    other = segments_of(lengths, 2048, buffer_size=128, seed=8)
    assert other != first
    assert sorted(map(sorted, other)) == sorted(map(sorted, first)), "a seed only reorders"


@pytest.mark.parametrize("indexable", [True, False])
@pytest.mark.parametrize("cut", [0, 1, 17, 60, 10_000])
def test_resume_continues_exactly(indexable: bool, cut: int) -> None:
    rng = np.random.default_rng(cut)
    items = [{"input_ids": list(range(int(n)))} for n in rng.integers(1, 700, 400)]
    options: dict[str, Any] = {"buffer_size": 32, "seed": 5, "num_shards": 2, "shard": 1}
    expected = list(StreamPacker(items, 512, **options))

    def source() -> Any:
        return items if indexable else OneShot(items)

    packer = StreamPacker(source(), 512, **options)
    taken = []
    iterator = iter(packer)
    for _ in range(min(cut, len(expected))):
        taken.append(next(iterator))
    assert packer.yielded_bins == len(taken)
    state = json.loads(json.dumps(packer.state_dict()))  # plain JSON
    assert state == packer.state_dict()
    assert len(state["buffer"]) <= 32
    resumed = StreamPacker(source(), 512, **options)
    resumed.load_state_dict(state)
    assert taken + list(resumed) == expected


def test_resume_reads_only_buffered_items_of_an_indexable_source() -> None:
    class Counting(list[int]):
        reads: set[int] = set()  # noqa: RUF012

        def __getitem__(self, index: Any) -> Any:
            Counting.reads.add(index)
            return super().__getitem__(index)

    lengths = Counting(tb.datasets.example_lengths("chat", 1_000, max_length=512).tolist())
    packer = StreamPacker(lengths, 512, buffer_size=16, length_fn=int)
    iterator = iter(packer)
    for _ in range(100):
        next(iterator)
    state = packer.state_dict()
    Counting.reads = set()
    resumed = StreamPacker(lengths, 512, buffer_size=16, length_fn=int)
    resumed.load_state_dict(state)
    assert len(list(resumed)) > 0
    buffered = {s[0] for s in state["buffer"]} | {s[0] for b in state["pending"] for s in b}
    assert buffered <= Counting.reads
    assert min(Counting.reads - buffered) == state["next_position"]


def test_bad_input_raises_clear_errors() -> None:
    # Oversize items are refused by the packing's own splitter, with its message.
    with pytest.raises(OversizeError, match="sequence 1 has 20 tokens, more than max_tokens=10"):
        list(StreamPacker([[1] * 3, [1] * 20], 10, oversize="error"))
    with pytest.raises(InvalidValueError, match="has no 'input_ids' field"):
        list(StreamPacker([{"text": "a"}], 10))
    with pytest.raises(InvalidTypeError, match="has no length"):
        list(StreamPacker([3, 4], 10))
    with pytest.raises(InvalidValueError, match="stream item 1 has length -4"):
        list(StreamPacker([3, -4], 10, length_fn=int))
    with pytest.raises(InvalidTypeError, match="must be iterable"):
        StreamPacker(5, 10)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="buffer_size must be at least 2"):
        StreamPacker([], 10, buffer_size=1)
    with pytest.raises(InvalidValueError, match="max_tokens must be positive"):
        StreamPacker([], 0)
    with pytest.raises(InvalidValueError, match="shard must be in"):
        StreamPacker([], 10, num_shards=2, shard=2)
    # The core parses the name, as for pack(): one message for both.
    with pytest.raises(InvalidValueError, match="unknown oversize policy 'wrap'"):
        StreamPacker([], 10, oversize="wrap")  # type: ignore[arg-type]


def test_bad_states_are_refused_clearly() -> None:
    packer = StreamPacker([[1]], 10, buffer_size=8)
    with pytest.raises(InvalidValueError, match="other options: buffer_size=8"):
        StreamPacker([[1]], 10, buffer_size=16).load_state_dict(packer.state_dict())
    with pytest.raises(InvalidValueError, match="not a StreamPacker state"):
        packer.load_state_dict({"format": "other"})
    # A state of another format version would not continue the same stream.
    old = {**packer.state_dict(), "format": "tokenbatch.StreamPacker/1"}
    with pytest.raises(InvalidValueError, match=r"format 'tokenbatch\.StreamPacker/1'.* reads"):
        packer.load_state_dict(old)
    # States no packer of these options could have saved.
    for change in (
        {"buffer": [[5, 0, 1]]},  # read before next_position 0?
        {"next_position": 6, "buffer": [[5, 0, 11]]},  # longer than a bin
        {"next_position": 6, "pending": [[[5, 0, 6], [3, 0, 6]]]},  # a bin over budget
        {"next_position": 6, "buffer": [[5, 0, 1]] * 2},  # the same segment twice
    ):
        with pytest.raises(InvalidValueError, match="malformed stream state"):
            packer.load_state_dict({**packer.state_dict(), **change})
    with pytest.raises(InvalidValueError, match="malformed StreamPacker state"):
        packer.load_state_dict({**packer.state_dict(), "buffer": [[5, 0]]})
    # A well-formed state of a longer stream than this source.
    packer.load_state_dict({**packer.state_dict(), "next_position": 6, "buffer": [[5, 0, 1]]})
    with pytest.raises(InvalidValueError, match="refers to position 5"):
        list(packer)


def test_empty_stream() -> None:
    assert list(StreamPacker([], 10)) == []
    assert list(StreamPacker(OneShot([]), 10)) == []
