"""The modules of the package import each other without circles: the Python modules
(imports inside functions included) and the Rust modules of the core and of the binding."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "tokenbatch"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# The extension (``_core``) is a module too, known by its stub.
MODULES = {_module_name(path): path for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyi")]}


def _imports(module: str) -> set[str]:
    """The package's modules that ``module`` imports, inside functions too; ``from a import
    b`` imports ``a.b`` where that is a module, else ``a``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in MODULES else base)
    return (found & MODULES.keys()) - {module}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle a depth-first search meets: a module met again while still on the path."""
    state: dict[str, str] = {}
    circles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return circles


def test_no_import_circles() -> None:
    graph = {module: _imports(module) for module in MODULES}
    assert {"tokenbatch", "tokenbatch._core", "tokenbatch.torch.sampler"} <= graph.keys()
    assert "tokenbatch._arrow" in graph["tokenbatch.ray"]
    assert _circles(graph) == []


def _rust_module(source: Path, path: Path) -> tuple[str, ...]:
    parts = path.relative_to(source).with_suffix("").parts
    return parts[:-1] if parts[-1] in ("mod", "lib") else parts


def _expand(tree: str) -> list[str]:
    """The paths of a `use` tree: `a::{b, c::{d, e}}` is `a::b`, `a::c::d`, `a::c::e`."""
    tree = re.sub(r"\s+", "", tree)
    head, brace, rest = tree.partition("{")
    if not brace:
        return [tree]
    inner, depth, items, item = rest[:-1], 0, [], ""
    for char in inner:
        depth += (char == "{") - (char == "}")
        if char == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += char
    return [path for part in [*items, item] if part for path in _expand(head + part)]


def rust_graph(source: Path) -> dict[str, set[str]]:
    """Which modules of a crate each module uses (`use` statements and inline `crate::`
    paths, outside test files), file by file. A module's use of its ancestors (items
    re-exported there) and an ancestor's of its descendants (declaring and re-exporting
    them) are how Rust modules nest, not circles, and are left out."""
    files = {
        _rust_module(source, path): path for path in source.rglob("*.rs") if path.name != "tests.rs"
    }
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        code = re.sub(r"//[^\n]*", "", path.read_text(encoding="utf-8"))
        code = code.split("#[cfg(test)]\nmod tests {")[0]
        paths = [p for tree in re.findall(r"\buse\s+([^;]+);", code) for p in _expand(tree)]
        paths += re.findall(r"(?<![\w:])crate(?:::\w+)+", code)
        used: set[tuple[str, ...]] = set()
        for use in paths:
            words = use.split("::")
            if words[0] == "crate":
                words = words[1:]
            elif words[0] == "super":
                words = [*module[:-1], *words[1:]]
            else:
                continue
            target = next(
                (tuple(words[:n]) for n in range(len(words), 0, -1) if tuple(words[:n]) in files),
                (),
            )
            nested = target[: len(module)] == module or module[: len(target)] == target
            if not nested:
                used.add(target)
        graph["::".join(module)] = {"::".join(target) for target in used}
    return graph


@pytest.mark.parametrize("crate", ["rust/core/src", "rust/py/src"])
def test_no_rust_module_circles(crate: str) -> None:
    graph = rust_graph(ROOT / crate)
    assert len(graph) >= 10
    assert _circles(graph) == []


def test_the_rust_graph_sees_a_circle_between_siblings(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "lib.rs").write_text("pub mod a;\n")
    (tmp_path / "a" / "mod.rs").write_text("mod b;\nmod c;\npub use b::B;\n")
    (tmp_path / "a" / "b.rs").write_text("use super::{c::C, B};\npub struct B;\n")
    (tmp_path / "a" / "c.rs").write_text("pub struct C(crate::a::b::B);\n")
    graph = rust_graph(tmp_path)
    assert graph["a::b"] == {"a::c"}
    assert graph["a::c"] == {"a::b"}
    assert graph["a"] == set()
    assert _circles(graph) == [["a::b", "a::c", "a::b"]]
