"""Packing corpora too large for one machine on Ray Data (the ``ray`` extra).

:func:`pack` packs every block (or group of ``rows_per_pack`` rows) of a
``ray.data.Dataset`` with the Rust core inside ``map_batches``, writes the packed rows
as Parquet shards of balanced size, and then a ``manifest.json`` of counts. The same
code runs on a laptop (``ray.init()``) and on a multi-node cluster
(``ray.init(address="auto")``); only the output path must be reachable by every node
(a shared file system or object storage).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from tokenbatch import hf
from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError, TokenBatchError
from tokenbatch.hf import _list_type, _packed_columns, pack_table
from tokenbatch.packing import Algorithm

__all__ = ["PackingFailedError", "pack"]

MANIFEST_FORMAT = "tokenbatch.ray.pack/1"


class PackingFailedError(TokenBatchError, RuntimeError):
    """A Ray task failed while packing or writing; nothing was left in the output."""


def pack(
    dataset: Any,
    max_tokens: int,
    output: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
    algorithm: Algorithm = "bfd",
    oversize: Literal["truncate", "split", "error", "drop"] = "truncate",
    max_seqs: int | None = None,
    position_ids: bool = False,
    rows_per_pack: int | None = None,
    num_shards: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Pack a ``ray.data.Dataset`` of token lists and write Parquet shards and a manifest.

    Each Ray task packs one batch of input rows globally (best-fit decreasing over the
    whole batch, with the options of :func:`tokenbatch.hf.pack_dataset`): a whole block by
    default, or ``rows_per_pack`` rows (Ray bundles small blocks into one batch, so a
    larger value packs tighter at the cost of task memory). The packed rows are
    redistributed into ``num_shards`` shards of nearly equal row counts (each row holds
    up to ``max_tokens`` tokens, so the shards also hold nearly equal tokens).

    Files are written to a temporary folder inside ``output`` and moved into place only
    when every task has succeeded; ``manifest.json`` is written last. A folder without a
    manifest is incomplete.

    Args:
        dataset: a ``ray.data.Dataset`` whose packed columns are lists.
        max_tokens: token budget of one packed row.
        output: folder for ``part-00000.parquet``... and ``manifest.json``; must not hold
            a manifest already.
        columns, algorithm, oversize, max_seqs, position_ids, seed: see
            :func:`tokenbatch.hf.pack_dataset`.
        rows_per_pack: input rows packed together (``None``: one block).
        num_shards: output files (``None``: one per packed block).

    Returns:
        The manifest: ``shards`` (file name, ``rows``, ``sequences``, ``tokens`` of each),
        the totals, and the options.

    Raises:
        InvalidTypeError, InvalidValueError: as :func:`tokenbatch.hf.pack_dataset`, for
            the schema or invalid options (before any task runs), or a dataset without
            tokens (after, leaving nothing in the output).
        PackingFailedError: a task failed (its error is the cause); the output folder
            holds no shard of this run.
    """
    import pyarrow.parquet as pq
    import ray.data

    if not isinstance(dataset, ray.data.Dataset):
        raise InvalidTypeError(f"dataset must be a ray.data.Dataset, got {type(dataset).__name__}")
    budget = as_int(max_tokens, "max_tokens", minimum=1)
    batch_rows = (
        None if rows_per_pack is None else as_int(rows_per_pack, "rows_per_pack", minimum=1)
    )
    shards = None if num_shards is None else as_int(num_shards, "num_shards", minimum=1)
    schema = dataset.schema()
    if schema is None:
        raise InvalidValueError("the dataset is empty: there is nothing to pack")
    arrow_schema = getattr(schema, "base_schema", schema)
    names = _packed_columns(arrow_schema.empty_table(), columns)
    for taken in ("seq_lengths", "position_ids") if position_ids else ("seq_lengths",):
        if taken in arrow_schema.names:
            raise InvalidValueError(
                f"the dataset already has a {taken!r} column; drop or rename it"
            )
    folder = Path(output)
    manifest_path = folder / "manifest.json"
    if manifest_path.exists():
        raise InvalidValueError(f"{manifest_path} exists: {folder} holds a finished packing")
    options: dict[str, Any] = {
        "max_tokens": budget,
        "columns": names,
        "algorithm": algorithm,
        "oversize": oversize,
        "max_seqs": max_seqs,
        "position_ids": position_ids,
        "seed": seed,
    }
    # Check the options once here, on the driver, rather than in every task.
    import pyarrow as pa

    probe = {name: pa.array([[]], type=arrow_schema.field(name).type) for name in names}
    pack_table(pa.table(probe), **options)

    packed = dataset.select_columns(names).map_batches(
        _pack_batch,
        batch_format="pyarrow",
        batch_size=batch_rows,
        zero_copy_batch=True,
        fn_kwargs=options,
    )
    if shards is not None:
        packed = packed.repartition(shards)
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder / f".staging-{uuid.uuid4().hex}"
    try:
        packed.write_parquet(str(staging))
        written = sorted(staging.glob("*.parquet"))
        entries: list[dict[str, Any]] = []
        for number, path in enumerate(written):
            lengths = pq.read_table(path, columns=["seq_lengths"]).column("seq_lengths")
            entries.append(
                {
                    "file": f"part-{number:05d}.parquet",
                    "rows": len(lengths),
                    "sequences": sum(len(chunk.values) for chunk in lengths.chunks),
                    "tokens": sum(int(chunk.values.to_numpy().sum()) for chunk in lengths.chunks),
                }
            )
        if not sum(entry["tokens"] for entry in entries):
            raise InvalidValueError("the dataset is empty: it holds no tokens to pack")
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, TokenBatchError):
            raise
        raise PackingFailedError(
            f"packing on Ray failed, nothing was written to {folder}: {exc}"
        ) from exc
    for entry, path in zip(entries, written, strict=True):
        os.replace(path, folder / entry["file"])
    shutil.rmtree(staging, ignore_errors=True)
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        **options,
        "rows_per_pack": batch_rows,
        "rows": sum(entry["rows"] for entry in entries),
        "sequences": sum(entry["sequences"] for entry in entries),
        "tokens": sum(entry["tokens"] for entry in entries),
        "shards": entries,
    }
    partial = folder / f".manifest-{uuid.uuid4().hex}.json"
    partial.write_text(json.dumps(manifest, indent=2))
    os.replace(partial, manifest_path)  # the manifest appears complete or not at all
    return manifest


def _pack_batch(batch: Any, **options: Any) -> Any:
    """Pack one batch of rows (a ``pyarrow.Table``); runs inside a Ray task."""
    import pyarrow as pa

    if batch.num_rows == 0:
        # The schema pack_table gives non-empty batches, so that all blocks agree.
        budget = options["max_tokens"]
        fields = []
        for name in options["columns"]:
            kind = batch.schema.field(name).type
            large = pa.types.is_large_list(kind) or hf._CHUNK_TOKENS + budget > 2**31 - 1
            fields.append(pa.field(name, _list_type(kind, large=large)))
        length_type = pa.int32() if budget <= 2**31 - 1 else pa.int64()
        fields.append(pa.field("seq_lengths", pa.list_(length_type)))
        if options["position_ids"]:
            fields.append(pa.field("position_ids", pa.list_(pa.int64())))
        return pa.schema(fields).empty_table()
    table, _ = pack_table(batch, **options)
    return table
