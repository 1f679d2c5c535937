"""Packing of Hugging Face datasets and Arrow tables.

:func:`pack_dataset` packs a ``datasets.Dataset`` (or a ``pyarrow.Table``) of token lists
into rows of at most ``max_tokens`` tokens, in one packing over the whole dataset, and
adds the ``seq_lengths`` column (and optionally ``position_ids``) that padding-free
training with Hugging Face and TRL trainers reads. The packing runs in the Rust core, and
so does the assembly of the rows: each packed sequence is copied out of the token buffer
in one piece, in parallel (Arrow ``take`` for value types that are not fixed-width), with
no Python loop over rows.

Needs the ``hf`` extra (``pip install 'tokenbatch[hf]'``): ``pyarrow`` and, for
``datasets.Dataset`` inputs, ``datasets``.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._arrow import (
    CHUNK_TOKENS,
    INT32_MAX,
    is_large,
    packed_columns,
    packed_schema,
)
from tokenbatch._convert import as_int
from tokenbatch._core import get_num_threads
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.packing import Algorithm, Packing, pack

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["pack_dataset", "pack_table"]

DatasetLike = TypeVar("DatasetLike")
_I64 = npt.NDArray[np.int64]


def pack_dataset(
    dataset: DatasetLike,
    max_tokens: int,
    *,
    algorithm: Algorithm = "bfd",
    oversize: Literal["truncate", "split", "error", "drop"] = "truncate",
    columns: Sequence[str] | None = None,
    max_seqs: int | None = None,
    position_ids: bool = False,
    seed: int = 0,
    progress: Callable[[int, int], object] | None = None,
    groups: str | None = None,
) -> DatasetLike:
    """Pack a dataset of token lists into rows of at most ``max_tokens`` tokens.

    The whole dataset is packed at once (not per ``map`` batch), so rows are as full as
    best-fit decreasing can make them. Each output row concatenates the packed sequences
    of every packed column (``input_ids``, ``labels``, ``attention_mask``...), and gets
    ``seq_lengths`` (the length of each sequence in the row, as TRL's ``pack_dataset``
    writes it) and, with ``position_ids=True``, positions restarting at 0 for each
    sequence. Rows are in the packing's order; inside a row, sequences keep the
    dataset's order.

    Args:
        dataset: a ``datasets.Dataset`` or a ``pyarrow.Table``; the result has the same
            type.
        max_tokens: token budget of one packed row.
        algorithm: packing algorithm of :func:`tokenbatch.pack`.
        oversize: sequences longer than ``max_tokens``: ``"truncate"`` (keep the first
            ``max_tokens`` tokens; TRL's ``"bfd"``), ``"split"`` (pieces, no token lost;
            TRL's ``"bfd_split"``), ``"drop"`` or ``"error"``.
        columns: the list columns to pack; the other columns are left out of the result.
            ``None``: every column, and all of them must be lists.
        max_seqs: at most this many sequences in one row.
        position_ids: also add a ``position_ids`` column.
        seed: seed of ``algorithm="first_fit_shuffled"``.
        progress: called as ``progress(tokens_done, tokens_total)`` while the rows are
            assembled (after each group of about 16M tokens), e.g. to drive a progress
            bar; the last call has ``tokens_done == tokens_total``.
        groups: the name of an integer column of atomic-group ids (a preference pair, the
            turns of one conversation): the rows sharing an id are packed whole into one
            packed row, consecutively and in dataset order (see :func:`tokenbatch.pack`;
            the rows of a group must be consecutive). The column itself is not packed.
            ``oversize`` must then be ``"error"`` or ``"drop"`` (a group is never cut).

    Empty sequences hold no tokens and are left out, as TRL does.

    Raises:
        InvalidTypeError: not a Dataset or Table, non-list columns (name them with
            ``columns=``), or a column that is not a list of values.
        InvalidValueError: an empty dataset, unknown columns, rows whose packed columns
            have different lengths, null rows, or output columns that already exist.
        OversizeError: a sequence longer than ``max_tokens`` with ``oversize="error"``.
    """
    import pyarrow as pa

    if isinstance(dataset, pa.Table):
        table, _ = pack_table(
            dataset,
            max_tokens,
            algorithm=algorithm,
            oversize=oversize,
            columns=columns,
            max_seqs=max_seqs,
            position_ids=position_ids,
            seed=seed,
            progress=progress,
            groups=groups,
        )
        return table  # type: ignore[no-any-return]
    datasets = _import_datasets(dataset)
    from tokenbatch.integrations._compat import datasets as datasets_compat

    if isinstance(dataset, datasets.IterableDataset):
        raise InvalidTypeError(
            "pack_dataset needs a map-style datasets.Dataset; pack an IterableDataset "
            "with tokenbatch.StreamPacker"
        )
    if not isinstance(dataset, datasets.Dataset):
        raise InvalidTypeError(
            f"dataset must be a datasets.Dataset or a pyarrow.Table, got {type(dataset).__name__}"
        )
    # The Arrow view applies any indices mapping (after select/shuffle/filter).
    source = dataset.with_format("arrow")[:]
    table, _ = pack_table(
        source,
        max_tokens,
        algorithm=algorithm,
        oversize=oversize,
        columns=columns,
        max_seqs=max_seqs,
        position_ids=position_ids,
        seed=seed,
        progress=progress,
        groups=groups,
    )
    # A fingerprint from the input's and the options, as datasets' own transforms do;
    # without one, datasets would hash every token of the result.
    digest = hashlib.blake2b(digest_size=8)
    options = (max_tokens, algorithm, oversize, columns, max_seqs, position_ids, seed, groups)
    digest.update(f"{datasets_compat.fingerprint(dataset)}/tokenbatch.pack/{options!r}".encode())
    packed = datasets.Dataset(table, fingerprint=digest.hexdigest())
    if dataset.format["type"] is not None:
        packed = packed.with_format(dataset.format["type"])
    return packed  # type: ignore[no-any-return]


def pack_table(
    table: pa.Table,
    max_tokens: int,
    *,
    algorithm: Algorithm = "bfd",
    oversize: Literal["truncate", "split", "error", "drop"] = "truncate",
    columns: Sequence[str] | None = None,
    max_seqs: int | None = None,
    position_ids: bool = False,
    seed: int = 0,
    progress: Callable[[int, int], object] | None = None,
    groups: str | None = None,
) -> tuple[pa.Table, Packing]:
    """Pack a ``pyarrow.Table``: :func:`pack_dataset` for tables, also returning the
    :class:`~tokenbatch.Packing` (whose ``indices`` are row numbers of ``table``).

    Rows with empty sequences are given to the packer with length 0 and left out of the
    result, so ``packing.n_seqs == table.num_rows`` while the result holds only non-empty
    sequences.
    """
    import pyarrow as pa

    if not isinstance(table, pa.Table):
        raise InvalidTypeError(f"table must be a pyarrow.Table, got {type(table).__name__}")
    budget = as_int(max_tokens, "max_tokens", minimum=1)
    if not isinstance(position_ids, bool):
        raise InvalidTypeError(f"position_ids must be a bool, got {position_ids!r}")
    if table.num_rows == 0:
        raise InvalidValueError("the dataset is empty: there is nothing to pack")
    group_ids = None if groups is None else _group_column(table, groups)
    names = packed_columns(table.schema if groups is None else table.drop([groups]).schema, columns)
    for output in ("seq_lengths", "position_ids") if position_ids else ("seq_lengths",):
        if output in table.column_names:
            raise InvalidValueError(
                f"the table already has a {output!r} column (is it packed already?); "
                "drop or rename it first"
            )
    arrays = [_list_array(table, name) for name in names]
    lengths = _row_lengths(arrays, names)
    packing = pack(
        lengths,
        budget,
        algorithm=algorithm,
        max_seqs=max_seqs,
        oversize=oversize,
        seed=seed,
        groups=group_ids,
    )
    seg_rows, seg_starts, seg_lengths, bin_offsets = _non_empty_segments(packing)
    # Where each segment's tokens start in the output, and the first token of each row.
    out_starts = np.zeros(len(seg_lengths) + 1, dtype=np.int64)
    np.cumsum(seg_lengths, out=out_starts[1:])
    row_offsets = out_starts[bin_offsets]
    # Columns with the same row offsets (input_ids, labels, attention_mask) share their
    # gather indices.
    all_offsets = [array.offsets.to_numpy(zero_copy_only=False) for array in arrays]
    owner = [
        next(j for j in range(i + 1) if j == i or np.array_equal(all_offsets[j], offsets))
        for i, offsets in enumerate(all_offsets)
    ]
    sources = {j: all_offsets[j].astype(np.int64)[seg_rows] + seg_starts for j in set(owner)}
    large = [is_large(array.type, budget, _CHUNK_TOKENS) for array in arrays]
    # Fixed-width values are copied segment by segment in Rust; the others (nulls inside
    # lists, booleans, strings, nested lists) go through Arrow `take` with a token index.
    words = [_as_words(array.values) for array in arrays]
    local = threading.local()  # each thread's reused gather buffers
    buffer_size = min(int(out_starts[-1]), _CHUNK_TOKENS + budget)

    def assemble(run: tuple[int, int]) -> tuple[list[Any], Any]:
        first_bin, end_bin = run
        s0, s1 = int(bin_offsets[first_bin]), int(bin_offsets[end_bin])
        t0, t1 = int(row_offsets[first_bin]), int(row_offsets[end_bin])
        count = t1 - t0
        lengths_here = seg_lengths[s0:s1]
        starts_here = out_starts[s0:s1] - t0
        list_offsets = row_offsets[first_bin : end_bin + 1] - t0
        buffers: dict[int, Any] = local.__dict__.setdefault("buffers", {})
        gathers: dict[int, Any] = {}

        def take(i: int) -> Any:
            j = owner[i]
            if j not in gathers:
                if j not in buffers:
                    wide = int(all_offsets[j][-1]) > INT32_MAX
                    buffers[j] = np.empty(buffer_size, dtype=np.int64 if wide else np.int32)
                gathers[j] = _gather_index(
                    sources[j][s0:s1], lengths_here, starts_here, buffers[j][:count]
                )
            return arrays[i].values.take(gathers[j])

        def values(i: int) -> Any:
            source = words[i]
            if source is None:
                return take(i)
            copied = _core.gather_segments(source, sources[owner[i]][s0:s1], lengths_here)
            value_type = arrays[i].type.value_type
            return pa.array(copied.view(value_type.to_pandas_dtype()), type=value_type)

        columns = [
            _list_from(list_offsets, values(i), array.type, large[i])
            for i, array in enumerate(arrays)
        ]
        positions_chunk = None
        if position_ids:
            # 1 per token, and at each segment's first token the step back to 0.
            positions = np.ones(count, dtype=np.int64)
            positions[starts_here[1:]] = 1 - lengths_here[:-1]
            positions[:1] = 0
            np.cumsum(positions, out=positions)
            positions_chunk = _list_from(list_offsets, pa.array(positions), pa.int64(), False)
        return columns, positions_chunk

    # Rows are assembled in runs of about _CHUNK_TOKENS tokens, so that the gather index
    # is a small reused buffer rather than an array as long as the whole token stream,
    # and runs are assembled in parallel (Arrow and numpy release the GIL).
    runs = _bin_runs(row_offsets, _CHUNK_TOKENS)
    threads = min(len(runs), get_num_threads())
    total_tokens = int(row_offsets[-1])
    assembled = []
    with ThreadPoolExecutor(threads) if threads > 1 else nullcontext() as executor:
        results = executor.map(assemble, runs) if executor else map(assemble, runs)
        for (_, end_bin), result in zip(runs, results, strict=True):
            assembled.append(result)
            if progress is not None:
                progress(int(row_offsets[end_bin]), total_tokens)
    if progress is not None and not runs:
        progress(0, 0)
    chunks = [[columns[i] for columns, _ in assembled] for i in range(len(arrays))]
    position_chunks = [chunk for _, chunk in assembled]
    del assembled
    schema = packed_schema(table.schema, names, budget, position_ids, _CHUNK_TOKENS)
    out_columns = [
        pa.chunked_array(column, type=field.type)
        for column, field in zip(chunks, schema, strict=False)
    ]
    lengths_type = schema.field("seq_lengths").type.value_type
    seq_lengths = pa.array(seg_lengths.astype(lengths_type.to_pandas_dtype()))
    out_columns.append(
        pa.chunked_array([_list_from(bin_offsets, seq_lengths, lengths_type, large=False)])
    )
    if position_ids:
        out_columns.append(pa.chunked_array(position_chunks, type=pa.list_(pa.int64())))
    return pa.Table.from_arrays(out_columns, schema=schema), packing


_CHUNK_TOKENS = CHUNK_TOKENS


def _group_column(table: pa.Table, name: str) -> _I64:
    """The group ids of column ``name``: integers, one per row, none missing."""
    import pyarrow as pa

    if not isinstance(name, str) or name not in table.column_names:
        raise InvalidValueError(
            f"groups must name a column of the dataset, got {name!r} "
            f"(columns: {table.column_names})"
        )
    column = table.column(name)
    if not pa.types.is_integer(column.type):
        raise InvalidTypeError(f"the groups column {name!r} must hold integers, got {column.type}")
    if column.null_count:
        raise InvalidValueError(f"the groups column {name!r} has {column.null_count} null ids")
    return np.asarray(column.to_numpy(), dtype=np.int64)


def _bin_runs(row_offsets: _I64, tokens: int) -> list[tuple[int, int]]:
    """Consecutive ranges of bins holding about ``tokens`` tokens each."""
    n_bins = len(row_offsets) - 1
    total = int(row_offsets[-1])
    targets = np.arange(tokens, total, tokens, dtype=np.int64)
    cuts = np.unique(np.concatenate([[0], np.searchsorted(row_offsets, targets), [n_bins]]))
    return [(int(a), int(b)) for a, b in itertools.pairwise(cuts.tolist()) if b > a]


def _gather_index(source_starts: _I64, lengths: _I64, out_starts: _I64, out: Any) -> Any:
    """Arrow indices of a group's packed tokens in the source values, written into
    ``out``: a running sum of steps, 1 inside a segment and a jump at each segment's first
    token (one pass, no temporary as long as the tokens)."""
    import pyarrow as pa

    if len(out) == 0:
        return pa.array(out)
    jumps = np.empty(len(source_starts), dtype=np.int64)
    jumps[0] = source_starts[0]
    jumps[1:] = source_starts[1:] - (source_starts[:-1] + lengths[:-1] - 1)
    out[:] = 1
    out[out_starts] = jumps
    np.cumsum(out, out=out)
    return pa.array(out)


def _as_words(values: pa.Array) -> npt.NDArray[np.unsignedinteger[Any]] | None:
    """Fixed-width values without nulls as the unsigned integers of their width (a view,
    no copy), for the Rust segment copy; ``None`` for values Arrow must gather."""
    import pyarrow as pa

    kind = values.type
    if values.null_count or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return None
    array = values.to_numpy(zero_copy_only=True)
    if not array.flags.aligned:
        return None
    words: npt.NDArray[np.unsignedinteger[Any]] = array.view(f"u{array.itemsize}")
    return words


def _import_datasets(dataset: object) -> Any:
    try:
        import datasets
    except ImportError:  # pragma: no cover - the hf extra installs it
        raise InvalidTypeError(
            f"dataset must be a pyarrow.Table or a datasets.Dataset, got "
            f"{type(dataset).__name__} (and the datasets package is not installed)"
        ) from None
    return datasets


def _list_array(table: pa.Table, name: str) -> Any:
    """The column as one ``ListArray``/``LargeListArray`` without nulls."""
    import pyarrow as pa

    column = table.column(name)
    if column.null_count:
        nulls = np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))
        raise InvalidValueError(
            f"column {name!r} has {column.null_count} null rows (first: row {int(nulls[0])}); "
            "fill or filter them before packing"
        )
    kind = column.type
    if pa.types.is_fixed_size_list(kind):
        column = column.cast(pa.list_(kind.value_field))
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def _row_lengths(arrays: list[Any], names: list[str]) -> _I64:
    lengths: _I64 | None = None
    for array, name in zip(arrays, names, strict=True):
        offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        column_lengths = np.diff(offsets)
        if lengths is None:
            lengths = column_lengths
            continue
        differ = np.flatnonzero(column_lengths != lengths)
        if len(differ):
            row = int(differ[0])
            raise InvalidValueError(
                f"row {row}: column {names[0]!r} has {int(lengths[row])} values but "
                f"{name!r} has {int(column_lengths[row])} ({len(differ)} rows differ); "
                "packed columns must have equal lengths in every row"
            )
    if lengths is None:  # pragma: no cover - columns is never empty here
        raise InvalidValueError("no columns to pack")
    return lengths


def _non_empty_segments(packing: Packing) -> tuple[_I64, _I64, _I64, _I64]:
    """Segments and CSR bin offsets without the empty segments and the bins they leave
    empty."""
    rows, starts, lengths = packing.indices, packing.starts, packing.lengths
    offsets = packing.bin_offsets
    keep = lengths > 0
    if keep.all():
        return rows, starts, lengths, offsets
    kept_before = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(keep, out=kept_before[1:])
    new_offsets = np.unique(kept_before[offsets])  # bins left empty collapse
    return rows[keep], starts[keep], lengths[keep], new_offsets


def _list_from(offsets: _I64, values: Any, list_type: Any, large: bool) -> Any:
    """A list array over ``values`` (``list_type``: the input's list type, or the value
    type), with 64-bit offsets when ``large``."""
    import pyarrow as pa

    value = list_type.value_field if hasattr(list_type, "value_field") else list_type
    if large:
        return pa.LargeListArray.from_arrays(pa.array(offsets), values, type=pa.large_list(value))
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), values, type=pa.list_(value)
    )
