"""Behaviour of tokenbatch.pack / batch_padded / Packing on hand-checked inputs."""

from __future__ import annotations

import numpy as np
import pytest

import tokenbatch as tb
from tokenbatch.datasets import example_lengths


def test_best_fit_decreasing_fills_bins_exactly() -> None:
    packing = tb.pack([6, 4, 5, 5, 3, 7], max_tokens=10)
    assert packing.n_bins == len(packing) == 3
    assert packing.bin_tokens.tolist() == [10, 10, 10]
    # 7 opens bin 0 and 3 completes it; inside a bin, segments are in input order.
    assert packing[0].tolist() == [4, 5]
    assert sorted(map(sorted, (b.tolist() for b in packing))) == [[0, 1], [2, 3], [4, 5]]


def test_arrays_are_int64_readonly_and_consistent() -> None:
    packing = tb.pack(np.array([3, 9, 2, 7, 1], dtype=np.int32), 10)
    for name in ("bin_offsets", "indices", "starts", "lengths", "bin_tokens"):
        array = getattr(packing, name)
        assert array.dtype == np.int64, name
        assert not array.flags.writeable, name
    assert packing.bin_offsets[0] == 0
    assert packing.bin_offsets[-1] == len(packing.indices)
    with pytest.raises(ValueError, match="read-only"):
        packing.indices[0] = 1


def test_getitem_iteration_and_segments() -> None:
    packing = tb.pack([5, 5, 5], 10, algorithm="next_fit")
    assert [b.tolist() for b in packing] == [[0, 1], [2]]
    assert packing[-1].tolist() == [2]
    indices, starts, lengths = packing.segments(1)
    assert (indices.tolist(), starts.tolist(), lengths.tolist()) == ([2], [0], [5])
    with pytest.raises(IndexError, match="out of range"):
        packing[2]


def test_next_fit_keeps_input_order() -> None:
    packing = tb.pack([3, 3, 3, 9, 1], 10, algorithm="next_fit")
    assert packing.indices.tolist() == [0, 1, 2, 3, 4]
    assert packing.bin_offsets.tolist() == [0, 3, 5]


def test_first_fit_shuffled_depends_on_seed_only() -> None:
    lengths = example_lengths("chat", 2000, max_length=2048, seed=1)
    a = tb.pack(lengths, 2048, algorithm="first_fit_shuffled", seed=5)
    b = tb.pack(lengths, 2048, algorithm="first_fit_shuffled", seed=5)
    c = tb.pack(lengths, 2048, algorithm="first_fit_shuffled", seed=6)
    assert np.array_equal(a.indices, b.indices)
    assert np.array_equal(a.bin_offsets, b.bin_offsets)
    assert not np.array_equal(a.indices, c.indices)


def test_max_seqs_limits_every_bin() -> None:
    packing = tb.pack([1] * 10, 100, max_seqs=3)
    assert np.diff(packing.bin_offsets).max() == 3
    assert packing.n_bins == packing.lower_bound == 4


def test_pad_to_multiple_of_rounds_costs() -> None:
    packing = tb.pack([5, 3, 8], 16, pad_to_multiple_of=8)
    assert (packing.bin_tokens % 8 == 0).all()
    assert packing.bin_tokens.max() <= 16
    stats = packing.stats()
    assert stats["total_tokens"] == 16
    assert stats["padding_tokens"] == 24 - 16


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("truncate", {"truncated_seqs": 1, "truncated_tokens": 15, "total_tokens": 24}),
        ("split", {"split_seqs": 1, "split_pieces": 3, "total_tokens": 39}),
        ("drop", {"dropped_seqs": 1, "dropped_tokens": 25, "total_tokens": 14}),
    ],
)
def test_oversize_policies_are_counted(policy: str, expected: dict[str, int]) -> None:
    packing = tb.pack([25, 4, 10], 10, oversize=policy)  # type: ignore[arg-type]
    stats = packing.stats()
    for key, value in expected.items():
        assert stats[key] == value, key
    assert packing.bin_tokens.max() <= 10


def test_split_pieces_cover_the_sequence_in_order() -> None:
    packing = tb.pack([23], 10, oversize="split")
    order = np.argsort(packing.starts)
    assert packing.starts[order].tolist() == [0, 10, 20]
    assert packing.lengths[order].tolist() == [10, 10, 3]


def test_oversize_error_names_index_and_length() -> None:
    with pytest.raises(tb.OversizeError, match=r"sequence 1 has 12 tokens.*max_tokens=10"):
        tb.pack([3, 12], 10)


def test_zero_length_sequences_are_placed_once() -> None:
    packing = tb.pack([0, 0, 10, 0], 10, max_seqs=2)
    assert sorted(packing.indices.tolist()) == [0, 1, 2, 3]
    assert np.diff(packing.bin_offsets).max() <= 2


def test_empty_input_gives_empty_packing() -> None:
    for empty in ([], np.array([], dtype=np.int16)):
        packing = tb.pack(empty, 10)
        assert packing.n_bins == 0
        assert packing.bin_offsets.tolist() == [0]
        assert packing.efficiency == 1.0
        assert packing.stats()["n_seqs"] == 0


def test_int32_contiguous_input_is_not_copied() -> None:
    from tokenbatch._convert import as_lengths

    lengths = np.arange(1, 100, dtype=np.int32)
    assert as_lengths(lengths) is lengths
    strided = np.arange(200, dtype=np.int64)[::2]
    converted = as_lengths(strided)
    assert converted.flags.c_contiguous
    assert np.array_equal(converted, strided)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint32, np.uint64, np.int64])
def test_any_integer_dtype_gives_the_same_packing(dtype: type) -> None:
    lengths = [7, 3, 9, 1, 4, 6]
    expected = tb.pack(lengths, 10)
    packing = tb.pack(np.array(lengths, dtype=dtype), 10)
    assert np.array_equal(packing.indices, expected.indices)
    assert np.array_equal(packing.bin_offsets, expected.bin_offsets)


def test_stats_are_consistent() -> None:
    lengths = example_lengths("lognormal", 5000, max_length=4096, seed=3)
    packing = tb.pack(lengths, 4096)
    stats = packing.stats()
    assert stats["n_seqs"] == stats["n_segments"] == 5000
    assert stats["total_tokens"] == stats["input_tokens"] == int(lengths.sum())
    assert stats["n_bins"] >= stats["lower_bound"] == -(-int(lengths.sum()) // 4096)
    assert stats["unused_tokens"] == stats["n_bins"] * 4096 - stats["total_tokens"]
    assert stats["efficiency"] == pytest.approx(stats["total_tokens"] / (stats["n_bins"] * 4096))
    assert "efficiency=" in repr(packing)


def test_batch_padded_costs_count_times_longest() -> None:
    packing = tb.batch_padded([5, 3, 2, 2, 9, 1], 10)
    assert packing.kind == "padded"
    assert [b.tolist() for b in packing] == [[4], [0, 1], [2, 3, 5]]
    assert packing.bin_tokens.tolist() == [9, 10, 6]
    assert packing.stats()["padding_tokens"] == 25 - 22


def test_batch_padded_groups_similar_lengths() -> None:
    lengths = example_lengths("chat", 20_000, max_length=4096, seed=0)
    padded = tb.batch_padded(lengths, 16_384, max_seqs=64)
    per_bin_lengths = np.split(padded.lengths, padded.bin_offsets[1:-1])
    spread = [int(b.max() - b.min()) for b in per_bin_lengths if len(b) > 1]
    assert np.median(spread) < 0.1 * np.median(lengths)
    assert padded.stats()["padding_tokens"] < 0.05 * padded.total_tokens


@pytest.mark.parametrize("name", ["lognormal", "chat", "documents"])
def test_bfd_is_within_a_tenth_of_a_percent_of_the_lower_bound(name: str) -> None:
    lengths = example_lengths(name, 200_000, max_length=8192, seed=0)
    packing = tb.pack(lengths, 8192)
    assert packing.n_bins <= packing.lower_bound * 1.001, (packing.n_bins, packing.lower_bound)
