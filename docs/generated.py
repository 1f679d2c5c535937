"""What the docs generators share: a generated block of a guide, rewritten or checked.

The generators run as ``python docs/gen_*.py``, which puts this directory first on
``sys.path``; the tests load them the same way (``tests/script_module.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path


def replace_block(text: str, begin: str, end: str, block: str) -> str:
    """``text`` with everything from the line ``begin`` to the line ``end`` replaced by
    ``block`` (which carries both markers itself)."""
    start, stop = text.index(begin), text.index(end) + len(end)
    return text[:start] + block + text[stop:]


def write_or_check(path: Path, updated: str, argv: list[str], command: str) -> int:
    """Write ``updated`` to ``path``, or with ``--check`` in ``argv`` return 1 (naming the
    ``command`` that regenerates it) when the file differs."""
    if "--check" in argv:
        if path.read_text(encoding="utf-8") != updated:
            print(f"{path.name} is out of date: run {command}", file=sys.stderr)
            return 1
        return 0
    path.write_text(updated, encoding="utf-8")
    return 0
