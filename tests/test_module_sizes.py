"""No source file outside the tests is over 600 lines: a module that long holds more than
one job (Rust files are counted up to their inline ``#[cfg(test)]`` module)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["python", "rust", "fuzz", "benches", "docs", "examples"]
MAX_LINES = 600


def _lines(path: Path) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix == ".rs" and "#[cfg(test)]" in lines:
        lines = lines[: lines.index("#[cfg(test)]")]
    return len(lines)


def _sources() -> list[Path]:
    found = []
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            parts = path.relative_to(ROOT).parts
            if path.suffix not in {".py", ".pyi", ".rs"} or "target" in parts:
                continue
            if "tests" in parts or path.name == "tests.rs":
                continue
            found.append(path)
    return found


def test_no_source_file_is_over_600_lines() -> None:
    sources = _sources()
    assert ROOT / "python" / "tokenbatch" / "_core.pyi" in sources
    assert ROOT / "rust" / "core" / "src" / "memory" / "grid.rs" in sources
    long = {str(path.relative_to(ROOT)): _lines(path) for path in sources}
    assert {path: n for path, n in long.items() if n > MAX_LINES} == {}
