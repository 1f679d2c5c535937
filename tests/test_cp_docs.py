"""The examples of docs/context-parallel.md run as written and print what it shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from guide_output import promised_output, run_and_check

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "context-parallel.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), flags=re.DOTALL | re.MULTILINE)


def test_guide_shows_its_output() -> None:
    assert len(BLOCKS) >= 5
    assert sum(len(promised_output(code)) for code in BLOCKS) >= 10


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_guide_example_prints_what_it_promises(code: str) -> None:
    run_and_check(code, str(GUIDE))
