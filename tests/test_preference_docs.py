"""The examples of docs/preference-and-multimodal.md run as written, one after the other,
and print what the guide shows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from guide_output import promised_output

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "preference-and-multimodal.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), flags=re.DOTALL | re.MULTILINE)


def test_guide_shows_its_output() -> None:
    assert len(BLOCKS) >= 8
    assert sum(len(promised_output(code)) for code in BLOCKS) >= 8


@pytest.mark.usefixtures("one_torch_thread")  # the guide trains tiny models
def test_guide_examples_print_what_they_promise() -> None:
    namespace: dict[str, object] = {"__name__": "guide"}
    for number, code in enumerate(BLOCKS):
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            exec(compile(code, f"{GUIDE.name} block {number}", "exec"), namespace)
        printed = output.getvalue().splitlines()
        for line in promised_output(code):
            assert line in printed, f"block {number} promises {line!r}, printed {printed}"
