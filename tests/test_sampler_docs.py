"""The examples of docs/sampler.md run as written and print what the guide shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from guide_output import promised_output, run_and_check

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "sampler.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)


def test_guide_has_examples() -> None:
    assert len(BLOCKS) >= 5
    assert sum(len(promised_output(code)) for code in BLOCKS) >= 5


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_guide_example_runs(code: str) -> None:
    run_and_check(code, str(GUIDE))
