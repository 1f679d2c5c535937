"""Guides whose examples promise their output: the comment lines right below a print."""

from __future__ import annotations

import contextlib
import io


def promised_output(code: str) -> list[str]:
    """Comment lines directly below a ``print(...)`` line show what it prints."""
    promised: list[str] = []
    after_print = False
    for line in code.splitlines():
        if after_print and line.startswith("# "):
            promised.append(line[2:])
            continue
        after_print = "print(" in line
    return promised


def run_and_check(code: str, source: str) -> None:
    """Run one example in a fresh namespace; fail unless it prints every promised line."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, source, "exec"), {"__name__": "guide"})
    printed = output.getvalue().splitlines()
    for line in promised_output(code):
        assert line in printed, f"the guide promises {line!r}, the code printed {printed}"
