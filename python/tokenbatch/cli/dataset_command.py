"""``tokenbatch pack-dataset``: pack a tokenized dataset on disk into rows of a token budget.

Reads Parquet (one file or a directory of files) or a directory written by
``datasets.Dataset.save_to_disk``, packs it with :func:`tokenbatch.hf.pack_table` and
writes the packed rows to a Parquet file. Reading, assembling and writing show progress
bars on a terminal; the output appears only when complete (it is written to a temporary
file first), so an interrupted run leaves nothing that looks finished.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenbatch.cli.output import atomic_output
from tokenbatch.cli.progress import Progress
from tokenbatch.cli.table import format_table, format_value
from tokenbatch.cli.units import COUNT_HELP, count, output_file, seed
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.packing import ALGORITHMS

if TYPE_CHECKING:
    import pyarrow as pa

#: Rows per record batch written to the output file (progress is reported per batch).
WRITE_BATCH_ROWS = 16_384


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "pack-dataset",
        help="pack a tokenized dataset (Parquet or save_to_disk) into rows of a token budget",
        description=(
            "Pack the token-list columns of a dataset into rows of at most --max-tokens "
            "tokens, in one best-fit decreasing packing over the whole dataset, and write "
            "them with a seq_lengths column (the format TRL's padding-free training reads) "
            "to a Parquet file. Needs the hf extra (pyarrow; datasets for save_to_disk "
            f"directories). {COUNT_HELP}"
        ),
    )
    parser.add_argument(
        "input",
        type=Path,
        help="a .parquet file, a directory of .parquet files, or a save_to_disk directory",
    )
    parser.add_argument(
        "output", type=output_file(".parquet"), help="the packed dataset, a .parquet file"
    )
    parser.add_argument("--max-tokens", type=count(), required=True, help="token budget per row")
    parser.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default="bfd",
        help="packing algorithm (default: best-fit decreasing)",
    )
    parser.add_argument(
        "--oversize",
        choices=["truncate", "split", "drop", "error"],
        default="truncate",
        help="sequences longer than --max-tokens (default: keep their first tokens)",
    )
    parser.add_argument(
        "--columns", help="comma-separated list columns to pack (default: every column)"
    )
    parser.add_argument(
        "--max-seqs", type=count(), default=None, help="at most this many sequences per row"
    )
    parser.add_argument("--position-ids", action="store_true", help="add a position_ids column")
    parser.add_argument("--seed", type=seed, default=0, help="seed of first_fit_shuffled")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    pq = _import_parquet()
    from tokenbatch.hf import pack_table

    started = time.perf_counter()
    table = read_table(args.input)
    columns = None if args.columns is None else [c for c in args.columns.split(",") if c]
    with Progress("assembling rows", 1) as bar:
        packed, packing = pack_table(
            table,
            args.max_tokens,
            algorithm=args.algorithm,
            oversize=args.oversize,
            columns=columns,
            max_seqs=args.max_seqs,
            position_ids=args.position_ids,
            seed=args.seed,
            progress=bar.update,
        )
    del table
    write_table(pq, packed, args.output)
    stats = packing.stats()
    summary: dict[str, Any] = {
        "input_rows": packing.n_seqs,
        "output_rows": packed.num_rows,
        "max_tokens": args.max_tokens,
        "tokens": int(stats["total_tokens"]),
        "efficiency": round(float(stats["efficiency"]), 6),
        "dropped_seqs": int(stats["dropped_seqs"]),
        "truncated_tokens": int(stats["truncated_tokens"]),
        "split_seqs": int(stats["split_seqs"]),
        "seconds": round(time.perf_counter() - started, 3),
        "output": str(args.output),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        rows = [[key, format_value(value, ".6g")] for key, value in summary.items()]
        print(format_table(["quantity", "value"], rows))
    return 0


def read_table(path: Path) -> pa.Table:
    """The dataset at ``path`` as one Arrow table, read with a progress bar."""
    pq = _import_parquet()
    import pyarrow as pa

    if not path.exists():
        raise InvalidValueError(f"{path} does not exist")
    if path.is_dir() and (path / "state.json").exists():
        try:
            import datasets
        except ImportError:  # pragma: no cover - the hf extra installs it
            raise InvalidTypeError(
                f"{path} is a save_to_disk directory, which needs the datasets package "
                "(pip install 'tokenbatch[hf]')"
            ) from None
        try:
            table: pa.Table = datasets.load_from_disk(str(path)).with_format("arrow")[:]
        except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
            raise InvalidValueError(
                f"{path} is not a readable save_to_disk directory ({type(exc).__name__}: {exc})"
            ) from None
        return table
    files = [path] if path.is_file() else sorted(path.glob("*.parquet"))
    if not files:
        raise InvalidValueError(f"{path} holds no .parquet files")
    sources = [_open_parquet(pq, file) for file in files]
    parts = []
    with Progress(f"reading {path.name}", sum(s.metadata.num_rows for s in sources)) as bar:
        for file, source in zip(files, sources, strict=True):
            try:
                for group in range(source.num_row_groups):
                    part = source.read_row_group(group)
                    parts.append(part)
                    bar.advance(part.num_rows)
            except (OSError, pa.ArrowException) as exc:
                raise _unreadable(file, exc) from None
    try:
        return pa.concat_tables(parts)
    except pa.ArrowInvalid as error:
        raise InvalidValueError(f"the files of {path} have different schemas: {error}") from None


def _open_parquet(pq: Any, file: Path) -> Any:
    import pyarrow as pa

    try:
        return pq.ParquetFile(file)
    except (OSError, pa.ArrowException) as exc:
        raise _unreadable(file, exc) from None


def _unreadable(file: Path, exc: Exception) -> InvalidValueError:
    return InvalidValueError(
        f"{file} is not a readable Parquet file ({exc}); write it with "
        "pyarrow.parquet.write_table or Dataset.to_parquet"
    )


def write_table(pq: Any, table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` through a temporary file moved into place at the end."""
    with (
        atomic_output(path) as partial,
        pq.ParquetWriter(partial, table.schema) as writer,
        Progress(f"writing {path.name}", table.num_rows) as bar,
    ):
        for batch in table.to_batches(max_chunksize=WRITE_BATCH_ROWS):
            writer.write_batch(batch)
            bar.advance(batch.num_rows)


def _import_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - the hf extra installs it
        raise InvalidTypeError(
            "tokenbatch pack-dataset needs pyarrow: pip install 'tokenbatch[hf]'"
        ) from None
    return pq
