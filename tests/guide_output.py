"""What a guide's examples promise to print: the comment lines right below a print."""

from __future__ import annotations


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
