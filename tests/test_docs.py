"""The guides in docs/ run as written, and docs/api.md matches the docstrings."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

import pytest
from script_module import load_script

DOCS = Path(__file__).resolve().parents[1] / "docs"
GUIDES = sorted(path for path in DOCS.glob("*.md") if path.name != "api.md")
# ```python blocks run; ```python cluster (and other languages) are shown, not run.
BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)


def test_every_capability_has_a_guide() -> None:
    names = {path.stem for path in GUIDES}
    assert {"packing", "datasets", "ray"} <= names
    for path in GUIDES:
        assert BLOCK.findall(path.read_text()), f"{path.name} has no runnable example"


@pytest.mark.usefixtures("one_torch_thread")  # guides train tiny models
@pytest.mark.parametrize("guide", GUIDES, ids=[path.stem for path in GUIDES])
def test_guide_examples_run(guide: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # examples may write files
    namespace: dict[str, object] = {"__name__": "__guide__"}
    for number, code in enumerate(BLOCK.findall(guide.read_text())):
        output = io.StringIO()
        with contextlib.redirect_stdout(output), warnings.catch_warnings():
            # Guides may show warnings on purpose (extrapolation, deprecations of peers).
            warnings.simplefilter("ignore")
            exec(compile(code, f"{guide.name} block {number}", "exec"), namespace)


def test_api_reference_is_up_to_date() -> None:
    gen_api = load_script(DOCS / "gen_api.py", "gen_api")
    rendered = gen_api.render()
    assert "## `tokenbatch.stream`" in rendered
    assert "#### `StreamPacker.state_dict" in rendered
    assert (DOCS / "api.md").read_text() == rendered, (
        "docs/api.md is out of date: run python docs/gen_api.py"
    )


def test_a_generated_block_is_checked_then_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generated = load_script(DOCS / "generated.py", "generated")
    guide = tmp_path / "guide.md"
    guide.write_text("intro\n<!-- b -->\nold\n<!-- e -->\nend\n", encoding="utf-8")
    updated = generated.replace_block(
        guide.read_text(encoding="utf-8"), "<!-- b -->", "<!-- e -->", "<!-- b -->\nnew\n<!-- e -->"
    )
    assert updated == "intro\n<!-- b -->\nnew\n<!-- e -->\nend\n"
    assert generated.write_or_check(guide, updated, ["--check"], "python gen.py") == 1
    assert "guide.md is out of date: run python gen.py" in capsys.readouterr().err
    assert "old" in guide.read_text(encoding="utf-8")  # a check writes nothing
    assert generated.write_or_check(guide, updated, [], "python gen.py") == 0
    assert generated.write_or_check(guide, updated, ["--check"], "python gen.py") == 0
