"""Packing corpora too large for one machine on Ray Data (the ``ray`` extra).

:func:`pack` packs every block (or group of ``rows_per_pack`` rows) of a
``ray.data.Dataset`` with the Rust core inside ``map_batches``, has the tasks write the
packed rows as Parquet shards (through ``pyarrow.fs``, so the output may be a local or
shared folder or object storage: ``s3://``, ``gs://``, ``hdfs://``, ``file://``), checks
every shard from the driver, and then writes a ``manifest.json`` of counts. The same code
runs on a laptop (``ray.init()``) and on a multi-node cluster (``ray.init(address="auto")``),
where the output must be storage every node reaches: a driver that cannot see a shard a
task wrote refuses to publish the packing.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from tokenbatch._arrow import packed_columns, packed_schema
from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError, TokenBatchError
from tokenbatch.hf import pack_table
from tokenbatch.packing import Algorithm

__all__ = ["PackingFailedError", "pack"]

MANIFEST_FORMAT = "tokenbatch.ray.pack/1"

#: Filesystems whose storage every node sees; any other may be a disk of one node.
_SHARED_FILESYSTEMS = frozenset({"s3", "gcs", "hdfs", "abfs"})


class PackingFailedError(TokenBatchError, RuntimeError):
    """A Ray task failed while packing or writing, or the driver could not see every shard
    the tasks wrote; nothing was left in the output."""


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
    filesystem: Any = None,
) -> dict[str, Any]:
    """Pack a ``ray.data.Dataset`` of token lists and write Parquet shards and a manifest.

    Each Ray task packs one batch of input rows globally (best-fit decreasing over the
    whole batch, with the options of :func:`tokenbatch.hf.pack_dataset`): a whole block by
    default, or ``rows_per_pack`` rows (Ray bundles small blocks into one batch, so a
    larger value packs tighter at the cost of task memory). With ``num_shards``, the
    packed rows are redistributed into that many shards of nearly equal row counts (each
    row holds up to ``max_tokens`` tokens, so the shards also hold nearly equal tokens);
    without it, each packed block is one shard, of whatever size the block had.

    The tasks write their shards to a staging folder inside ``output`` and report what
    they wrote (file, rows, sequences, tokens). The driver then reads every reported
    shard back from its own view of the storage and compares the counts; only if all
    match are the shards moved into place and ``manifest.json`` written, last. A folder
    without a manifest is incomplete.

    Args:
        dataset: a ``ray.data.Dataset`` whose packed columns are lists.
        max_tokens: token budget of one packed row.
        output: folder for ``part-00000.parquet``... and ``manifest.json``: a local path,
            or a URI that ``pyarrow.fs.FileSystem.from_uri`` reads (``s3://bucket/path``,
            ``gs://``, ``hdfs://``, ``file://``); must not hold a manifest already. On a
            multi-node cluster it must be storage every node shares.
        columns, algorithm, oversize, max_seqs, position_ids, seed: see
            :func:`tokenbatch.hf.pack_dataset`.
        rows_per_pack: input rows packed together (``None``: one block).
        num_shards: output files of nearly equal rows (``None``: one per packed block).
        filesystem: a ``pyarrow.fs.FileSystem`` to write through (for example an
            ``S3FileSystem`` with an endpoint or credentials); ``output`` is then a path
            inside it.

    Returns:
        The manifest: ``shards`` (file name, ``rows``, ``sequences``, ``tokens`` of each),
        the totals, and the options.

    Raises:
        InvalidTypeError, InvalidValueError: as :func:`tokenbatch.hf.pack_dataset`, for
            the schema or invalid options (before any task runs), or a dataset without
            tokens (after, leaving nothing in the output).
        PackingFailedError: a task failed (its error is the cause), or a shard a task
            reported is missing or different from the driver's view (an output folder
            that is not shared by every node); the output holds no shard of this run.
    """
    import ray.data

    if not isinstance(dataset, ray.data.Dataset):
        raise InvalidTypeError(f"dataset must be a ray.data.Dataset, got {type(dataset).__name__}")
    budget = as_int(max_tokens, "max_tokens", minimum=1)
    batch_rows = (
        None if rows_per_pack is None else as_int(rows_per_pack, "rows_per_pack", minimum=1)
    )
    shards = None if num_shards is None else as_int(num_shards, "num_shards", minimum=1)
    fs, root = _resolve_output(output, filesystem)
    schema = dataset.schema()
    if schema is None:
        raise InvalidValueError("the dataset is empty: there is nothing to pack")
    arrow_schema = getattr(schema, "base_schema", schema)
    names = packed_columns(arrow_schema, columns)
    for taken in ("seq_lengths", "position_ids") if position_ids else ("seq_lengths",):
        if taken in arrow_schema.names:
            raise InvalidValueError(
                f"the dataset already has a {taken!r} column; drop or rename it"
            )
    manifest_path = f"{root}/manifest.json"
    if _exists(fs, manifest_path):
        raise InvalidValueError(f"{manifest_path} exists: {output} holds a finished packing")
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
    staging = f"{root}/.staging-{uuid.uuid4().hex}"
    fs.create_dir(staging, recursive=True)
    try:
        reports = packed.map_batches(
            _write_shard,
            batch_format="pyarrow",
            batch_size=None,
            fn_kwargs={"filesystem": fs, "folder": staging},
        ).take_all()
        entries = _check_shards(fs, staging, reports)
        if not sum(entry["tokens"] for entry in entries):
            raise InvalidValueError("the dataset is empty: it holds no tokens to pack")
    except Exception as exc:
        _remove_everywhere(fs, staging)
        if isinstance(exc, TokenBatchError):
            raise
        raise PackingFailedError(
            f"packing on Ray failed, nothing was written to {output}: {exc}"
        ) from exc
    for entry in entries:
        fs.move(f"{staging}/{entry.pop('written')}", f"{root}/{entry['file']}")
    fs.delete_dir(staging)
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        **options,
        "rows_per_pack": batch_rows,
        "rows": sum(entry["rows"] for entry in entries),
        "sequences": sum(entry["sequences"] for entry in entries),
        "tokens": sum(entry["tokens"] for entry in entries),
        "shards": entries,
    }
    partial = f"{root}/.manifest-{uuid.uuid4().hex}.json"
    with fs.open_output_stream(partial) as stream:
        stream.write(json.dumps(manifest, indent=2).encode())
    fs.move(partial, manifest_path)  # the manifest appears complete or not at all
    return manifest


def _resolve_output(output: str | os.PathLike[str], filesystem: Any) -> tuple[Any, str]:
    """The filesystem and the path inside it of ``output``."""
    import pyarrow.fs as pafs

    text = os.fspath(output)
    if filesystem is not None:
        if not isinstance(filesystem, pafs.FileSystem):
            raise InvalidTypeError(
                f"filesystem must be a pyarrow.fs.FileSystem, got {type(filesystem).__name__}"
            )
        return filesystem, text.rstrip("/")
    if "://" in text:
        try:
            fs, path = pafs.FileSystem.from_uri(text)
        except (ValueError, OSError) as exc:
            raise InvalidValueError(
                f"output {text!r} is not a URI pyarrow can open: {exc}"
            ) from exc
        return fs, path.rstrip("/")
    # Absolute: tasks run in other working directories.
    return pafs.LocalFileSystem(), os.path.abspath(text)


def _exists(fs: Any, path: str) -> bool:
    import pyarrow.fs as pafs

    return bool(fs.get_file_info(path).type != pafs.FileType.NotFound)


def _counts(table: Any) -> dict[str, int]:
    """Rows, sequences and tokens of a packed table (from its ``seq_lengths`` column)."""
    lengths = table.column("seq_lengths")
    return {
        "rows": len(lengths),
        "sequences": sum(len(chunk.values) for chunk in lengths.chunks),
        "tokens": sum(int(chunk.values.to_numpy().sum()) for chunk in lengths.chunks),
    }


#: What a writing task reports for each shard it wrote.
_REPORT_FIELDS = ("written", "rows", "sequences", "tokens", "node")


def _write_shard(batch: Any, **destination: Any) -> Any:
    """Write one packed batch as a shard into ``destination["folder"]`` of
    ``destination["filesystem"]`` and report it; runs inside a Ray task."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    columns: dict[str, list[Any]] = {field: [] for field in _REPORT_FIELDS}
    if batch.num_rows:
        name = f"{uuid.uuid4().hex}.parquet"
        filesystem, folder = destination["filesystem"], destination["folder"]
        # The driver made the folder, but on storage it does not share with this node,
        # it exists only here once made here (and the driver will say so).
        filesystem.create_dir(folder, recursive=True)
        pq.write_table(batch, f"{folder}/{name}", filesystem=filesystem)
        counts = _counts(batch)
        for field, value in [
            ("written", name),
            *counts.items(),
            ("node", ray.get_runtime_context().get_node_id()),
        ]:
            columns[field].append(value)
    types = [pa.string(), pa.int64(), pa.int64(), pa.int64(), pa.string()]
    schema = pa.schema(list(zip(_REPORT_FIELDS, types, strict=True)))
    return pa.table(columns, schema=schema)


def _check_shards(fs: Any, folder: str, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest entries of the reported shards, after reading each one back from the
    driver's view of the storage; raises if any is missing or differs from its report."""
    import pyarrow.parquet as pq

    problems = []
    for report in reports:
        path = f"{folder}/{report['written']}"
        try:
            with fs.open_input_file(path) as source:
                seen = _counts(pq.read_table(source, columns=["seq_lengths"]))
        except (OSError, ValueError) as exc:
            problems.append(f"{path} (written on node {report['node']}) cannot be read: {exc}")
            continue
        claimed = {key: report[key] for key in seen}
        if seen != claimed:
            problems.append(f"{path} holds {seen}, its task wrote {claimed}")
    if problems:
        raise PackingFailedError(
            f"{len(problems)} of {len(reports)} shards are not as their tasks wrote them, from "
            f"the driver's view: {problems[0]}. On a multi-node cluster, the output must be "
            "storage every node shares (a shared file system, or s3://, gs://, hdfs://)."
        )
    return [
        {
            "file": f"part-{number:05d}.parquet",
            **{k: r[k] for k in ("rows", "sequences", "tokens")},
            "written": r["written"],
        }
        for number, r in enumerate(reports)
    ]


def _remove_everywhere(fs: Any, folder: str) -> None:
    """Remove ``folder`` from the driver's view and, unless the storage is shared by
    construction, from every other live node's (where tasks may have written it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    _remove_dir(fs, folder)
    if fs.type_name in _SHARED_FILESYSTEMS:
        return
    here = ray.get_runtime_context().get_node_id()
    remove = ray.remote(num_cpus=0, max_retries=0)(_remove_dir)
    pending = [
        remove.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote(fs, folder)
        for node in ray.nodes()  # type: ignore[no-untyped-call]
        if node["Alive"] and node["NodeID"] != here
    ]
    ray.wait(pending, num_returns=len(pending), timeout=60)


def _remove_dir(fs: Any, folder: str) -> None:
    if _exists(fs, folder):
        fs.delete_dir(folder)


def _pack_batch(batch: Any, **options: Any) -> Any:
    """Pack one batch of rows (a ``pyarrow.Table``); runs inside a Ray task."""
    if batch.num_rows == 0:
        # The schema pack_table gives non-empty batches, so that all blocks agree.
        schema = packed_schema(
            batch.schema, options["columns"], options["max_tokens"], options["position_ids"]
        )
        return schema.empty_table()
    table, _ = pack_table(batch, **options)
    return table
