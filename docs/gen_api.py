"""Generate docs/api.md, the API reference, from the docstrings of the public modules.

    python docs/gen_api.py          # rewrite docs/api.md
    python docs/gen_api.py --check  # exit 1 if docs/api.md is out of date

The test suite runs the check, so the reference cannot drift from the code.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from pathlib import Path
from typing import Any

from generated import write_or_check

API = Path(__file__).resolve().parent / "api.md"

#: Modules documented, in order; each lists its public names in ``__all__``.
MODULES = [
    "tokenbatch",
    "tokenbatch.stream",
    "tokenbatch.hf",
    "tokenbatch.ray",
    "tokenbatch.plot",
    "tokenbatch.torch",
    "tokenbatch.integrations.transformers",
    "tokenbatch.integrations.trl",
    "tokenbatch.integrations.accelerate",
    "tokenbatch.integrations.lightning",
    "tokenbatch.context_parallel",
    "tokenbatch.distribute",
    "tokenbatch.mixture",
    "tokenbatch.memory",
    "tokenbatch.schedule",
    "tokenbatch.megatron",
    "tokenbatch.scaling",
    "tokenbatch.datasets",
    "tokenbatch.errors",
]


def _signature(obj: Any) -> str:
    if inspect.isclass(obj) and _is_compiled(obj) and obj.__text_signature__ is None:
        return ""  # a class of the Rust core that Python code does not construct
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _is_compiled(cls: type) -> bool:
    """A class of the compiled extension (its members are descriptors, not functions)."""
    return cls.__module__ == "tokenbatch._core"


def _doc(obj: Any) -> str:
    return inspect.getdoc(obj) or "(no docstring)"


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties defined by ``cls`` or its tokenbatch bases."""
    members = []
    for name in sorted(dir(cls)):
        if name.startswith("_") and name not in ("__iter__", "__len__", "__getitem__"):
            continue
        owner = next((base for base in cls.__mro__ if name in vars(base)), None)
        if owner is None or not owner.__module__.startswith("tokenbatch"):
            continue
        value = vars(owner)[name]
        python_member = isinstance(value, (property, staticmethod, classmethod))
        compiled_member = _is_compiled(owner) and isinstance(
            value, (types.GetSetDescriptorType, types.MethodDescriptorType)
        )
        if python_member or compiled_member or inspect.isfunction(value):
            members.append((name, value))
    return members


def _render_object(module: str, name: str, obj: Any) -> list[str]:
    lines: list[str] = []
    if inspect.isclass(obj):
        lines += [f"### class `{module}.{name}{_signature(obj)}`", "", _doc(obj), ""]
        for member, value in _members(obj):
            if isinstance(value, (property, types.GetSetDescriptorType)):
                lines += [f"#### property `{name}.{member}`", "", _doc(value), ""]
                continue
            function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            lines += [
                f"#### `{name}.{member}{_signature(function)}`",
                "",
                _doc(function),
                "",
            ]
    elif callable(obj):
        lines += [f"### `{module}.{name}{_signature(obj)}`", "", _doc(obj), ""]
    elif inspect.ismodule(obj):
        lines += [f"### module `{obj.__name__}`", "", "See its section.", ""]
    else:
        lines += [f"### `{module}.{name}`", "", _describe_value(obj), ""]
    return lines


def _describe_value(obj: Any) -> str:
    """A constant, shown without memory addresses so that the output is reproducible."""
    if isinstance(obj, dict):
        return f"A `dict` with keys {', '.join(f'`{key}`' for key in obj)}."
    text = repr(obj)
    if " at 0x" in text or len(text) > 200:
        return f"A `{type(obj).__name__}`."
    return f"`{text}`"


def render() -> str:
    """The API reference as Markdown."""
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `python docs/gen_api.py`; do not edit by hand.",
        "",
    ]
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        lines += [f"## `{module_name}`", "", _doc(module), ""]
        for name in module.__all__:
            lines += _render_object(module_name, name, getattr(module, name))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    """Write docs/api.md, or with ``--check`` report whether it is up to date."""
    return write_or_check(API, render(), argv, "python docs/gen_api.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
