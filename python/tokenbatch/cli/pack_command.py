"""``tokenbatch pack``: pack lengths from a file or a built-in distribution."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenbatch.cli.output import atomic_output
from tokenbatch.cli.progress import Progress
from tokenbatch.cli.table import format_table, format_value
from tokenbatch.cli.units import COUNT_HELP, count, output_file, seed
from tokenbatch.datasets import EXAMPLE_DISTRIBUTIONS, example_lengths
from tokenbatch.errors import InvalidValueError
from tokenbatch.packing import ALGORITHMS, Packing, batch_padded, pack


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "pack",
        help="pack sequence lengths into token budgets and print statistics",
        description=(
            "Pack variable-length sequences into bins of at most --max-tokens tokens and "
            "print a statistics table. Lengths come from a .npy or .txt file (one integer "
            f"per line) or from a built-in example distribution. {COUNT_HELP}"
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("lengths_file", nargs="?", type=Path, help=".npy or .txt file of lengths")
    source.add_argument(
        "--example",
        choices=sorted(EXAMPLE_DISTRIBUTIONS),
        help="use a built-in length distribution instead of a file",
    )
    parser.add_argument("--n", type=count(), default=1_000_000, help="sequences for --example")
    parser.add_argument("--seed", type=seed, default=0, help="seed (example data, shuffled fit)")
    parser.add_argument(
        "--max-tokens", type=count(), default=8192, help="token budget per bin (default 8192)"
    )
    parser.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default="bfd",
        help="packing algorithm (default: best-fit decreasing)",
    )
    parser.add_argument("--padded", action="store_true", help="padded batching instead of packing")
    parser.add_argument(
        "--max-seqs", type=count(), default=None, help="at most this many sequences per bin"
    )
    parser.add_argument(
        "--pad-to-multiple-of", type=count(), default=1, help="round each sequence up to this"
    )
    parser.add_argument(
        "--oversize",
        choices=["error", "truncate", "split", "drop"],
        default="error",
        help="what to do with sequences longer than --max-tokens",
    )
    parser.add_argument(
        "--output", type=output_file(".npz"), help="write the packing arrays to this .npz file"
    )
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    parser.add_argument(
        "--plot",
        type=output_file(),
        help="draw fill and length histograms to this image (needs matplotlib)",
    )
    parser.set_defaults(handler=run)


#: Text files are parsed in blocks of this many bytes (progress is reported per block).
TEXT_BLOCK_BYTES = 8 << 20


def read_lengths(path: Path) -> npt.NDArray[np.int64]:
    """Lengths from a ``.npy`` file or a text file of integers (whitespace separated).

    Text is parsed block by block with a progress bar on a terminal, so a file of
    hundreds of millions of lengths shows progress and stops cleanly on Ctrl-C. A file
    that cannot be read, holds no lengths, or holds anything but a 1-D array of integers
    is refused with what to do instead; pickled ``.npy`` files are never loaded.
    """
    if not path.exists():
        raise InvalidValueError(f"lengths file {str(path)!r} does not exist")
    if path.is_dir():
        raise InvalidValueError(f"lengths file {str(path)!r} is a folder; give a .npy or .txt file")
    try:
        lengths = _read_npy(path) if path.suffix == ".npy" else _read_text(path)
    except OSError as exc:
        raise InvalidValueError(f"cannot read lengths file {str(path)!r}: {exc.strerror}") from None
    if lengths.size == 0:
        raise InvalidValueError(f"lengths file {str(path)!r} holds no lengths")
    return lengths


_SAVE_HINT = "save them with np.save(path, np.asarray(lengths, dtype=np.int64))"


def _read_npy(path: Path) -> npt.NDArray[np.int64]:
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc):  # numpy's refusal of object arrays and of non-.npy files
            raise InvalidValueError(
                f"lengths file {str(path)!r} is pickled or not a .npy file; pickles are never "
                f"loaded (they can run code): {_SAVE_HINT}"
            ) from None
        raise InvalidValueError(
            f"lengths file {str(path)!r} is not a valid .npy file ({exc})"
        ) from None
    except EOFError:
        raise InvalidValueError(f"lengths file {str(path)!r} is empty or truncated") from None
    if not isinstance(array, np.ndarray) or array.ndim != 1 or array.dtype.kind not in "iu":
        what = (
            f"an array of shape {array.shape} and dtype {array.dtype}"
            if isinstance(array, np.ndarray)
            else type(array).__name__
        )
        raise InvalidValueError(
            f"lengths file {str(path)!r} holds {what}; it needs a 1-D array of integers: "
            + _SAVE_HINT
        )
    return np.asarray(array)


def _read_text(path: Path) -> npt.NDArray[np.int64]:
    parts: list[npt.NDArray[np.int64]] = []
    carry = b""
    total = path.stat().st_size if path.is_file() else 0
    with path.open("rb") as handle, Progress(f"reading {path.name}", total) as bar:
        while block := handle.read(TEXT_BLOCK_BYTES):
            bar.advance(len(block))
            text = carry + block
            # A number may continue in the next block: keep the unfinished tail.
            cut = max(text.rfind(b"\n"), text.rfind(b" "), text.rfind(b"\t"))
            carry, text = (text[cut + 1 :], text[: cut + 1]) if cut >= 0 else (text, b"")
            parts.append(_parse_integers(text, path))
        parts.append(_parse_integers(carry, path))
    return np.concatenate(parts)


def _parse_integers(text: bytes, path: Path) -> npt.NDArray[np.int64]:
    words = text.split()
    try:
        return np.array(words, dtype=np.int64) if words else np.zeros(0, dtype=np.int64)
    except (ValueError, OverflowError):
        bad = next(w for w in words if not w.lstrip(b"+-").isdigit() or abs(int(w)) >= 2**63)
        raise InvalidValueError(
            f"lengths file {str(path)!r} is not a text file of integers "
            f"(found {bad.decode(errors='replace')[:40]!r}); write one length per line"
        ) from None


def run(args: argparse.Namespace) -> int:
    if args.example is not None:
        lengths = example_lengths(args.example, args.n, max_length=args.max_tokens, seed=args.seed)
        source = f"example '{args.example}' (n={args.n:,}, seed={args.seed})"
    else:
        lengths = read_lengths(args.lengths_file)
        source = str(args.lengths_file)
    options: dict[str, Any] = {
        "max_seqs": args.max_seqs,
        "pad_to_multiple_of": args.pad_to_multiple_of,
        "oversize": args.oversize,
    }
    if args.padded:
        packing = batch_padded(lengths, args.max_tokens, **options)
    else:
        packing = pack(
            lengths, args.max_tokens, algorithm=args.algorithm, seed=args.seed, **options
        )
    stats = packing.stats()
    if args.json:
        print(json.dumps({"source": source, **stats}, indent=2))
    else:
        method = "padded batching" if args.padded else args.algorithm
        print(f"tokenbatch pack: {source}, {method}, max_tokens={args.max_tokens:,}")
        rows = [[k, format_value(v)] for k, v in stats.items()]
        print(format_table(["statistic", "value"], rows))
    if args.output is not None:
        save_packing(packing, args.output)
        print(f"wrote {args.output}", file=sys.stderr)
    if args.plot is not None:
        from tokenbatch.plot import plot_packing

        with atomic_output(args.plot) as partial:
            plot_packing(packing, path=partial)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def save_packing(packing: Packing, path: Path) -> None:
    """Write the CSR arrays (and the budget) to an ``.npz`` file (complete or not at all)."""
    with atomic_output(path) as partial:
        np.savez(
            partial,
            bin_offsets=packing.bin_offsets,
            indices=packing.indices,
            starts=packing.starts,
            lengths=packing.lengths,
            bin_tokens=packing.bin_tokens,
            max_tokens=np.int64(packing.max_tokens),
        )
