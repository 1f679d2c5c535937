"""The modules of the package import each other without circles (imports inside functions
included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "tokenbatch"


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


def test_no_import_circles() -> None:
    graph = {module: _imports(module) for module in MODULES}
    assert {"tokenbatch", "tokenbatch._core", "tokenbatch.torch.sampler"} <= graph.keys()
    assert "tokenbatch._arrow" in graph["tokenbatch.ray"]
    # Depth-first search; a module met again while still on the path closes a circle.
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
    assert circles == []
