"""tokenbatch.hf: global packing of Hugging Face datasets and Arrow tables."""

from __future__ import annotations

import inspect
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenbatch as tb
from tokenbatch import hf
from tokenbatch.errors import InvalidTypeError, InvalidValueError, OversizeError
from tokenbatch.hf import pack_dataset, pack_table

EXAMPLES = {
    "input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]],
    "attention_mask": [[1, 1, 1, 0, 0], [1, 0], [1, 1, 0], [1]],
}


def test_matches_trl_documented_output() -> None:
    dataset = datasets.Dataset.from_dict(EXAMPLES)
    packed = pack_dataset(dataset, 4)
    assert isinstance(packed, datasets.Dataset)
    # TRL's pack_dataset(strategy="bfd") documents exactly these rows.
    assert packed[:] == {
        "input_ids": [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7]],
        "attention_mask": [[1, 1, 1, 0], [1, 1, 0, 1], [1, 0]],
        "seq_lengths": [[4], [3, 1], [2]],
    }
    split = pack_dataset(dataset, 4, oversize="split", position_ids=True)
    assert split[:] == {
        "input_ids": [[1, 2, 3, 4], [5, 8, 9, 10], [6, 7, 11]],
        "attention_mask": [[1, 1, 1, 0], [0, 1, 1, 0], [1, 0, 1]],
        "seq_lengths": [[4], [1, 3], [2, 1]],
        "position_ids": [[0, 1, 2, 3], [0, 0, 1, 2], [0, 1, 0]],
    }
    assert packed.features["input_ids"] == dataset.features["input_ids"]


def encoded(lengths: list[int]) -> pa.Table:
    """Token ``j`` of row ``i`` is ``i * 10_000 + j``; labels are its negation."""
    ids = [[i * 10_000 + j for j in range(n)] for i, n in enumerate(lengths)]
    return pa.table(
        {
            "input_ids": pa.array(ids, type=pa.list_(pa.int64())),
            "labels": pa.array([[-t for t in row] for row in ids], type=pa.list_(pa.int64())),
        }
    )


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=80),
    max_tokens=st.integers(1, 50),
    oversize=st.sampled_from(["split", "truncate", "drop"]),
    chunks=st.integers(1, 3),
    group_tokens=st.sampled_from([1, 7, 64, 1 << 24]),
)
def test_every_token_once_with_consistent_metadata(
    lengths: list[int], max_tokens: int, oversize: str, chunks: int, group_tokens: int
) -> None:
    table = encoded(lengths)
    if chunks > 1:  # several record batches, one of them a slice
        cut = len(lengths) // chunks
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    default = hf._CHUNK_TOKENS
    hf._CHUNK_TOKENS = group_tokens  # rows are assembled in groups of about this many tokens
    try:
        packed, packing = pack_table(
            table,
            max_tokens,
            oversize=oversize,  # type: ignore[arg-type]
            position_ids=True,
        )
    finally:
        hf._CHUNK_TOKENS = default
    rows = packed.to_pydict()
    placed: dict[int, list[int]] = {}
    for ids, labels, seq_lengths, positions in zip(
        rows["input_ids"], rows["labels"], rows["seq_lengths"], rows["position_ids"], strict=True
    ):
        assert 0 < len(ids) <= max_tokens
        assert labels == [-t for t in ids]
        assert sum(seq_lengths) == len(ids)
        assert min(seq_lengths) > 0
        start = 0
        for n in seq_lengths:
            piece = ids[start : start + n]
            assert positions[start : start + n] == list(range(n))
            row = piece[0] // 10_000
            assert piece == list(range(piece[0], piece[0] + n)), "a piece is contiguous"
            placed.setdefault(row, []).extend(t % 10_000 for t in piece)
            start += n
    for row, n in enumerate(lengths):
        expected = {
            "split": n,
            "truncate": min(n, max_tokens),
            "drop": n if n <= max_tokens else 0,
        }[oversize]
        assert sorted(placed.get(row, [])) == list(range(expected))
    assert packing.n_seqs == len(lengths)


def test_every_value_type_is_copied_exactly() -> None:
    # Fixed-width values are copied segment by segment in Rust; booleans, strings, nested
    # lists and lists with null values go through Arrow take. Both must give each row the
    # concatenation of its segments, value for value and type for type.
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 40, 300)
    tokens = [rng.integers(-100, 100, n).tolist() for n in lengths]
    typed = {
        "i8": pa.int8(),
        "i16": pa.int16(),
        "u32": pa.uint32(),
        "i64": pa.int64(),
        "f16": pa.float16(),
        "f32": pa.float32(),
        "f64": pa.float64(),
    }
    columns: dict[str, Any] = {
        name: pa.array(
            [
                [np.float16(abs(t)) if kind == pa.float16() else abs(t) for t in row]
                for row in tokens
            ],
            type=pa.list_(kind),
        )
        for name, kind in typed.items()
    }
    columns["flag"] = pa.array([[t > 0 for t in row] for row in tokens], pa.list_(pa.bool_()))
    columns["text"] = pa.array([[str(t) for t in row] for row in tokens], pa.list_(pa.string()))
    columns["nested"] = pa.array([[[t, t] for t in row] for row in tokens])
    columns["holes"] = pa.array(
        [[None if t % 7 == 0 else t for t in row] for row in tokens], pa.list_(pa.int32())
    )
    table = pa.table(columns)
    packed, packing = pack_table(table, 97, oversize="split")
    assert packed.schema.field("f16").type == pa.list_(pa.float16())
    source = table.to_pydict()
    out = packed.to_pydict()
    segments = [
        [(int(r), int(s), int(n)) for r, s, n in zip(*packing.segments(b), strict=True) if n]
        for b in range(packing.n_bins)
    ]
    segments = [bin_ for bin_ in segments if bin_]
    for name in columns:
        expected = [
            [value for row, start, n in bin_ for value in source[name][row][start : start + n]]
            for bin_ in segments
        ]
        assert out[name] == expected, name


def test_global_packing_is_one_pack_over_all_rows() -> None:
    lengths = tb.datasets.example_lengths("chat", 3_000, max_length=1024, seed=4)
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(
                np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
                pa.array(np.zeros(int(lengths.sum()), dtype=np.int32)),
            )
        }
    )
    packed, packing = pack_table(table, 1024)
    whole = tb.pack(lengths, 1024)
    assert packed.num_rows == whole.n_bins == packing.n_bins
    # Packing in map batches of 1,000 rows (as TRL does) needs more rows.
    per_batch = sum(tb.pack(lengths[i : i + 1000], 1024).n_bins for i in range(0, 3000, 1000))
    assert packed.num_rows < per_batch
    assert pa.compute.sum(pa.compute.list_value_length(packed["input_ids"])).as_py() == int(
        lengths.sum()
    )


def test_dataset_views_formats_and_large_lists() -> None:
    dataset = datasets.Dataset.from_dict(EXAMPLES).with_format("numpy")
    selected = dataset.select([3, 1])  # an indices mapping over the table
    packed = pack_dataset(selected, 4)
    assert packed.format["type"] == "numpy"
    # rows 3 and 1 of the table, in the selection's order
    assert [row.tolist() for row in packed["input_ids"]] == [[11, 6, 7]]
    large = pa.table({"input_ids": pa.array([[1, 2], [3]], type=pa.large_list(pa.int32()))})
    result = pack_dataset(large, 8)
    assert isinstance(result, pa.Table)
    assert result.schema.field("input_ids").type == pa.large_list(pa.int32())
    assert result.to_pydict() == {"input_ids": [[1, 2, 3]], "seq_lengths": [[2, 1]]}
    fixed = pa.table({"x": pa.array([[1, 2], [3, 4]], type=pa.list_(pa.int8(), 2))})
    assert pack_dataset(fixed, 4).to_pydict() == {"x": [[1, 2, 3, 4]], "seq_lengths": [[2, 2]]}


def test_columns_selects_and_drops_the_rest() -> None:
    dataset = datasets.Dataset.from_dict({**EXAMPLES, "id": [0, 1, 2, 3], "text": list("abcd")})
    packed = pack_dataset(dataset, 8, columns=["input_ids"])
    assert packed.column_names == ["input_ids", "seq_lengths"]
    assert sorted(t for row in packed["input_ids"] for t in row) == list(range(1, 12))


def test_empty_sequences_are_left_out() -> None:
    table = pa.table({"input_ids": [[], [1, 2], [], [3]]})
    packed, packing = pack_table(table, 4)
    assert packed.to_pydict() == {"input_ids": [[1, 2, 3]], "seq_lengths": [[2, 1]]}
    assert packing.n_seqs == 4
    only_empty = pa.table({"input_ids": pa.array([[], []], type=pa.list_(pa.int64()))})
    assert pack_table(only_empty, 4)[0].num_rows == 0


@pytest.mark.parametrize(
    ("data", "options", "error", "message"),
    [
        (
            {"input_ids": [[1], [2]], "id": [0, 1]},
            {},
            InvalidTypeError,
            r"pass columns=\['input_ids'\]",
        ),
        ({"text": ["a", "b"]}, {}, InvalidTypeError, "no column holds token lists"),
        (
            {"input_ids": [[1, 2], [3]], "labels": [[1, 2], [3, 4]]},
            {},
            InvalidValueError,
            "row 1: column 'input_ids' has 1 values but 'labels' has 2",
        ),
        ({"input_ids": [[1], [2]]}, {"columns": ["labels"]}, InvalidValueError, "unknown columns"),
        (
            {"input_ids": [[1], [2]], "id": [0, 1]},
            {"columns": ["id"]},
            InvalidTypeError,
            "column 'id' is int64, not a list",
        ),
        ({"input_ids": [[1], None]}, {}, InvalidValueError, "null rows \\(first: row 1\\)"),
        (
            {"input_ids": [[1]], "seq_lengths": [[1]]},
            {},
            InvalidValueError,
            "already has a 'seq_lengths'",
        ),
        ({"input_ids": [[1] * 9]}, {"oversize": "error"}, OversizeError, "sequence 0 has 9 tokens"),
        ({"input_ids": [[1]]}, {"columns": "input_ids"}, InvalidTypeError, "not a string"),
    ],
)
def test_bad_input(
    data: dict[str, Any], options: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        pack_dataset(datasets.Dataset.from_dict(data), 8, **options)


def test_bad_containers() -> None:
    features = datasets.Features({"input_ids": datasets.List(datasets.Value("int32"))})
    empty = datasets.Dataset.from_dict({"input_ids": []}, features=features)
    with pytest.raises(InvalidValueError, match="empty"):
        pack_dataset(empty, 8)
    with pytest.raises(InvalidTypeError, match="StreamPacker"):
        pack_dataset(datasets.Dataset.from_dict(EXAMPLES).to_iterable_dataset(), 8)
    with pytest.raises(InvalidTypeError, match="got dict"):
        pack_dataset(EXAMPLES, 8)
    with pytest.raises(InvalidValueError, match="max_tokens must be at least 1"):
        pack_dataset(datasets.Dataset.from_dict(EXAMPLES), 0)


def trl_passes_sequence_boundaries() -> bool:
    import trl
    from packaging.version import Version

    return Version(trl.__version__) >= Version("1.16")


def test_trl_padding_free_collator_reads_the_packed_rows() -> None:
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    rows = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]]
    packed = pack_dataset(datasets.Dataset.from_dict({"input_ids": rows}), 4)
    # return_position_ids is an option of TRL 1.x (TRL 0.x always returns the positions)
    takes = inspect.signature(DataCollatorForLanguageModeling).parameters
    options = {"return_position_ids": True} if "return_position_ids" in takes else {}
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, **options)
    batch = collator([packed[0], packed[1]])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 8, 9, 10, 11]]
    # sequence boundaries come from seq_lengths: attention never crosses them (TRL hands
    # them to the model as cu_seq_lens from 1.16 on; before, only flash attention finds
    # them, from the positions)
    if trl_passes_sequence_boundaries():
        assert batch["cu_seq_lens_q"].tolist() == [0, 4, 7, 8]
    else:
        assert "cu_seq_lens_q" not in batch
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0]]
    assert batch["labels"].tolist() == [[-100, 2, 3, 4, -100, 9, 10, -100]]


def test_groups_column_keeps_each_group_in_one_row_in_order() -> None:
    # Preference pairs: rows 2k and 2k+1 share pair id 100 - k (ids neither sorted nor
    # contiguous). Token j of row i is i * 10_000 + j, so a packed row tells its rows.
    lengths = [30, 5, 28, 4, 26, 6, 3, 24, 9, 9]
    table = encoded(lengths).append_column("pair", pa.array([100 - i // 2 for i in range(10)]))

    def pair_rows(packed: pa.Table) -> list[list[int]]:
        rows = packed.column("input_ids").to_pylist()
        return [list(dict.fromkeys(token // 10_000 for token in row)) for row in rows]

    ungrouped = pair_rows(pack_table(encoded(lengths), 40, oversize="error")[0])
    assert any(sum((2 * k in row) != (2 * k + 1 in row) for row in ungrouped) for k in range(5))
    packed, _ = pack_table(table, 40, groups="pair", oversize="error")
    assert "pair" not in packed.column_names
    rows = pair_rows(packed)
    assert sorted(i for row in rows for i in row) == list(range(10))
    for row in rows:
        for k in range(5):
            if 2 * k in row:
                assert row[row.index(2 * k) + 1] == 2 * k + 1, f"pair {k} apart in {row}"
    tokens = packed.column("input_ids").combine_chunks().values.to_numpy()
    assert len(tokens) == sum(lengths)
    dataset = pack_dataset(datasets.Dataset(table), 40, groups="pair", oversize="drop")
    assert pair_rows(dataset.data.table) == rows


def test_bad_groups_columns_are_named() -> None:
    table = encoded([3, 4]).append_column("pair", pa.array([1.0, 2.0]))
    with pytest.raises(InvalidValueError, match="must name a column"):
        pack_table(table, 40, groups="nope", oversize="error")
    with pytest.raises(InvalidTypeError, match="must hold integers"):
        pack_table(table, 40, groups="pair", oversize="error")
    nulls = encoded([3, 4]).append_column("pair", pa.array([1, None]))
    with pytest.raises(InvalidValueError, match="null"):
        pack_table(nulls, 40, groups="pair", oversize="error")
    ints = encoded([3, 4]).append_column("pair", pa.array([1, 1]))
    with pytest.raises(InvalidValueError, match="truncate"):
        pack_table(ints, 40, groups="pair")
