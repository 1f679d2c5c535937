"""The numbers every command reads: counts, byte sizes and positive reals.

One parser for counts and one for byte sizes, so that ``4B`` means four billion tokens to
every command and ``80GB`` means 80 x 10^9 bytes to every command:

* a **count** (tokens, sequences, GPUs, steps) is a whole number with an optional suffix
  K, M, B, T (10^3, 10^6, 10^9, 10^12, as Megatron-LM's batch-size schedules write them)
  or Ki, Mi, Gi, Ti (2^10 .. 2^40): ``4096``, ``8Ki``, ``469B``, ``14.8T``, ``3e9``;
* a **byte size** is a whole number of bytes with an optional unit B, KB, MB, GB, TB
  (10^3 .. 10^12) or KiB, MiB, GiB, TiB (2^10 .. 2^40): ``80GB``, ``141GB``, ``80GiB``.

A count written with a byte unit, or a size without one (``80G``), is refused with the
spelling to use instead, rather than guessed. Suffixes and units ignore case; ``_`` and
``,`` may group digits.

The argparse ``type=`` factories (:func:`count`, :func:`byte_size`, :func:`positive_real`,
:func:`seed`, :func:`output_file`) check the range too, so a bad value is reported as
``argument --seq-len: ...`` before any work starts.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path

__all__ = [
    "BYTES_HELP",
    "COUNT_HELP",
    "GPU_MEMORY_MINIMUM",
    "byte_size",
    "count",
    "non_negative_real",
    "output_file",
    "parse_bytes",
    "parse_count",
    "positive_real",
    "seed",
]

#: One line for each command's description.
COUNT_HELP = (
    "Counts take K, M, B, T (10^3..10^12) or Ki, Mi, Gi, Ti (2^10..2^40): 4096, 8Ki, 469B, 14.8T."
)
BYTES_HELP = (
    "Byte sizes take KB, MB, GB, TB (10^3..10^12) or KiB, MiB, GiB, TiB (2^10..2^40): 80GB, 80GiB."
)

_INT64_MAX = 2**63 - 1

#: No GPU has less memory: a smaller ``--gpu-memory`` is a missing unit (``80`` for 80GB).
GPU_MEMORY_MINIMUM = 2**20
_NUMBER = re.compile(
    r"\s*(?P<number>[0-9][0-9_,]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)"
    r"\s*(?P<unit>[A-Za-z]*)\s*"
)
_COUNT_SCALES = {
    "": 1,
    **{"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12},
    **{"KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40},
}
_BYTE_SCALES = {
    "": 1,
    "B": 1,
    **{"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12},
    **{"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40},
}


def _split(text: str, what: str, examples: str) -> tuple[Decimal, str]:
    """The number and the upper-cased unit of ``text``, refusing signs, NaN and infinity."""
    stripped = text.strip()
    if stripped.startswith("-"):
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    match = _NUMBER.fullmatch(stripped.lstrip("+"))
    if match is None:
        raise argparse.ArgumentTypeError(f"expected {what} (e.g. {examples}), got {text!r}")
    try:
        number = Decimal(match.group("number").replace("_", "").replace(",", ""))
    except InvalidOperation:
        raise argparse.ArgumentTypeError(
            f"expected {what} (e.g. {examples}), got {text!r}"
        ) from None
    return number, match.group("unit").upper()


def _whole(value: Decimal, text: str, what: str) -> int:
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole {what}")
    return int(value)


def parse_count(text: str) -> int:
    """A non-negative whole count: ``469B`` -> 469_000_000_000, ``4Mi`` -> 4_194_304."""
    number, unit = _split(text, "a count", "4096, 8Ki, 469B, 14.8T")
    scale = _COUNT_SCALES.get(unit)
    if scale is None:
        if unit in _BYTE_SCALES:
            problem = "is a size in bytes, but this is a count"
        elif unit == "G":
            problem = "uses G; in a count, 10^9 is B"
        else:
            problem = f"has an unknown suffix {unit!r}"
        raise argparse.ArgumentTypeError(
            f"{text!r} {problem}: counts take K, M, B, T (10^3..10^12) or Ki, Mi, Gi, Ti "
            "(2^10..2^40), e.g. 4B or 4Gi"
        )
    return _whole(number * scale, text, "number")


def parse_bytes(text: str) -> int:
    """A non-negative whole number of bytes: ``80GB`` -> 80 x 10^9, ``80GiB`` -> 80 x 2^30."""
    number, unit = _split(text, "a byte size", "80GB, 80GiB, 141GB")
    scale = _BYTE_SCALES.get(unit)
    if scale is None:
        prefix = unit.removesuffix("I")
        if prefix in {"K", "M", "G", "T"}:
            raise argparse.ArgumentTypeError(
                f"{text!r} has no byte unit: write {number}{prefix}B ({prefix}B = 10^"
                f"{3 * ('KMGT'.index(prefix) + 1)} bytes) or {number}{prefix}iB "
                f"(2^{10 * ('KMGT'.index(prefix) + 1)} bytes)"
            )
        raise argparse.ArgumentTypeError(
            f"{text!r} has an unknown unit {unit!r}: sizes take B, KB, MB, GB, TB "
            "(10^3..10^12) or KiB, MiB, GiB, TiB (2^10..2^40), e.g. 80GB"
        )
    return _whole(number * scale, text, "number of bytes")


def _bounded(
    parse: Callable[[str], int],
    minimum: int,
    maximum: int,
    describe: Callable[[int], str],
    name: str,
) -> Callable[[str], int]:
    def convert(text: str) -> int:
        value = parse(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {describe(minimum)}, got {text!r}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {describe(maximum)}, got {text!r}")
        return value

    convert.__name__ = name  # argparse names the type in its own messages
    return convert


def count(minimum: int = 1, maximum: int = _INT64_MAX) -> Callable[[str], int]:
    """argparse type: a count (see :func:`parse_count`) in ``[minimum, maximum]``."""
    return _bounded(parse_count, minimum, maximum, lambda v: f"{v:,}", "count")


def byte_size(minimum: int = 1, maximum: int = _INT64_MAX) -> Callable[[str], int]:
    """argparse type: a byte size (see :func:`parse_bytes`) in ``[minimum, maximum]``."""
    return _bounded(parse_bytes, minimum, maximum, _format_bytes, "byte size")


def _format_bytes(value: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale}{unit}"
    return f"{value:,} bytes"


def _real(text: str, allow_zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number (e.g. 3e-4), got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "at least 0" if allow_zero else "above 0"
        raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
    return value


def positive_real(text: str) -> float:
    """argparse type: a finite number above zero (``989``, ``3e-4``)."""
    return _real(text, allow_zero=False)


def non_negative_real(text: str) -> float:
    """argparse type: a finite number at least zero."""
    return _real(text, allow_zero=True)


def seed(text: str) -> int:
    """argparse type: a seed, a whole number in ``[0, 2^64)``."""
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"must be in [0, 2^64), got {text!r}")
    return value


def output_file(*suffixes: str) -> Callable[[str], Path]:
    """argparse type: a file to write, with one of ``suffixes``, in an existing folder."""

    def convert(text: str) -> Path:
        path = Path(text)
        if suffixes and path.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"must end in {' or '.join(suffixes)}, got {text!r}")
        folder = path.parent
        if not folder.is_dir():
            raise argparse.ArgumentTypeError(
                f"the folder {str(folder)!r} does not exist; create it first"
            )
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name")
        return path

    convert.__name__ = "output file"
    return convert
