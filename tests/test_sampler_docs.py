"""The examples of docs/sampler.md run as written and print what the guide shows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from guide_output import promised_output

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "sampler.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)


def test_guide_has_examples() -> None:
    assert len(BLOCKS) >= 5
    assert sum(len(promised_output(code)) for code in BLOCKS) >= 5


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_guide_example_runs(code: str) -> None:
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, str(GUIDE), "exec"), {"__name__": "guide"})
    printed = output.getvalue().splitlines()
    for line in promised_output(code):
        assert line in printed, f"the guide promises {line!r}, the code printed {printed}"
