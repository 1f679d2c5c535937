"""Plain-text tables for the command line."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-align the first column, right-align the others, rule under the header."""
    columns = [header, *rows]
    widths = [max(len(str(row[i])) for row in columns) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            str(cell).ljust(width) if i == 0 else str(cell).rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def format_value(value: object, float_format: str = ".6f") -> str:
    """A table cell: integers with thousands separators, floats with ``float_format``,
    booleans in lower case, anything else as ``str``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return format(value, float_format)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
