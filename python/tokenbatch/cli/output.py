"""Writing output files so that a failed or interrupted command leaves nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffix, so writers that pick a format
    from it still do); it becomes ``path`` only when the block completes, and is removed
    otherwise."""
    partial = path.with_name(f"{path.stem}.partial{path.suffix}")
    try:
        yield partial
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
