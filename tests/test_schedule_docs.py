"""The examples of docs/schedules.md and docs/scaling.md run and print what the guides say
they print."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

from script_module import load_script

DOCS = Path(__file__).resolve().parent.parent / "docs"
SCHEDULES = DOCS / "schedules.md"
GUIDE = DOCS / "scaling.md"


def _normalize(text: str) -> str:
    return " ".join(text.split())


def test_guide_examples_print_what_the_guide_shows() -> None:
    blocks = [
        (guide.name, block)
        for guide in (SCHEDULES, GUIDE)
        for block in re.findall(
            r"```python\n(.*?)```", guide.read_text(encoding="utf-8"), flags=re.DOTALL
        )
    ]
    assert len(blocks) >= 10
    namespace: dict[str, object] = {}
    for number, (name, block) in enumerate(blocks):
        shown = _normalize(
            " ".join(line[2:] for line in block.splitlines() if line.startswith("# "))
        )
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # extrapolation warnings are part of the examples
            exec(compile(block, f"{name} block {number}", "exec"), namespace)
        for line in printed.getvalue().splitlines():
            assert _normalize(line) in shown, f"block {number} printed {line!r}"


def test_published_runs_table_is_the_generators() -> None:
    module = load_script(GUIDE.parent / "gen_published_runs.py", "gen_published_runs")
    text = GUIDE.read_text(encoding="utf-8")
    table = module.render()
    assert table in text, (
        "the table of published runs is out of date: python docs/gen_published_runs.py"
    )
    # One row per published run, each with every law's value.
    body = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(body) == 1 + len(module.PUBLISHED_RUNS)
    assert all(line.count("/") >= 6 for line in body[1:])
    assert module.main(["--check"]) == 0


def test_launch_plan_figure_script_draws_the_guides_plan(tmp_path: Path) -> None:
    script = GUIDE.parent / "gen_launch_plan_figure.py"
    module = load_script(script, "gen_launch_plan_figure")
    out = tmp_path / "launch_plan.png"
    module.main(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The committed figure is the one the guide shows, and the script draws it.
    assert "![The ramp of the plan above" in GUIDE.read_text(encoding="utf-8")
    assert (GUIDE.parent / "launch_plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = script.read_text(encoding="utf-8")
    guide = GUIDE.read_text(encoding="utf-8")
    call = "spec, 15 * 10**12, num_gpus=512, gpu_memory=80e9, seq_len=8192)"
    assert call in text
    assert call in guide
