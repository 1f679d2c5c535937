"""The examples of docs/schedules.md run and print what the guide says they print."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "schedules.md"


def _normalize(text: str) -> str:
    return " ".join(text.split())


def test_guide_examples_print_what_the_guide_shows() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) >= 10
    namespace: dict[str, object] = {}
    for number, block in enumerate(blocks):
        shown = _normalize(
            " ".join(line[2:] for line in block.splitlines() if line.startswith("# "))
        )
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # extrapolation warnings are part of the examples
            exec(compile(block, f"{GUIDE.name} block {number}", "exec"), namespace)
        for line in printed.getvalue().splitlines():
            assert _normalize(line) in shown, f"block {number} printed {line!r}"
