"""A minimal progress bar for long command-line work.

It draws one line on stderr, and only when stderr is a terminal, so pipes, logs and
tests see no control characters.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``with Progress("reading", total) as bar: bar.advance(n)``: a bar that redraws at
    most ten times a second and clears itself at the end."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.label = label
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._last_draw = 0.0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def advance(self, amount: int) -> None:
        """Record ``amount`` more units of work and redraw if due."""
        self.done = min(self.done + amount, self.total)
        now = time.monotonic()
        if self.enabled and (now - self._last_draw >= 0.1 or self.done == self.total):
            self._last_draw = now
            self.stream.write(f"\r{self.render()}")
            self.stream.flush()

    def update(self, done: int, total: int) -> None:
        """Set the work done and the total (for work whose size is known only once it
        runs) and redraw if due."""
        self.total = max(total, 1)
        self.done = 0
        self.advance(done)

    def render(self, width: int = 30) -> str:
        """The bar as text, e.g. ``reading [#########.....]  31%``."""
        fraction = self.done / self.total
        filled = int(fraction * width)
        return f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {fraction:4.0%}"
