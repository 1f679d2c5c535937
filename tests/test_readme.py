"""Statements of the README that a reader acts on, checked against the code."""

from __future__ import annotations

import re
from pathlib import Path

import tokenbatch as tb
import tokenbatch.ray

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _example(call: str) -> tuple[str, str]:
    """The code and the comment of the README line that makes ``call``."""
    line = next(line for line in README.splitlines() if call in line)
    code, _, comment = line.partition("#")
    return code.strip(), comment.strip()


def test_max_micro_batch_tokens_example_returns_tokens() -> None:
    code, comment = _example("tb.max_micro_batch_tokens(")
    assert "token" in comment
    assert "bytes" not in comment
    spec = tb.ModelSpec.preset("llama-3.1-70b")
    tokens = eval(code, {"tb": tb, "spec": spec})
    # A token budget: one packed row of that many tokens fits the 80 GB.
    assert isinstance(tokens, int)
    assert 0 < tokens < 10**6
    assert tb.estimate_memory(spec, seq_len=tokens, tp=8, pp=4).total <= 80e9


def test_ray_shards_are_called_equal_only_with_num_shards() -> None:
    paragraph = next(p for p in README.split("\n\n") if "`tokenbatch.ray.pack` writes" in p)
    assert "balanced" not in paragraph
    assert re.search(r"equal row counts when `num_shards` is given", " ".join(paragraph.split()))
    assert "balanced size" not in (tokenbatch.ray.__doc__ or "")
