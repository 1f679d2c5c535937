"""The integrations use only what each library makes public, and the few private hooks
they cannot avoid sit in ``tokenbatch.integrations._compat`` and exist in the installed
releases.

The check reads each integration module's source: every private name it uses (an
attribute, an imported name, a method it overrides) must be tokenbatch's own, neither
defined by a class of the library it integrates (``super()._save_checkpoint``) nor
missing from tokenbatch (``trainer._accelerator_connector``, ``dataset._fingerprint``).
The compatibility modules name their hooks as strings, so they are not read here; their
hooks are checked against the installed library instead.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tokenbatch.integrations import _compat
from tokenbatch.integrations._compat import Hook, UnsupportedVersionError

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "tokenbatch"

#: Each integration module and the libraries it plugs into.
INTEGRATIONS = {
    "tokenbatch.integrations.transformers": ("transformers", "accelerate"),
    "tokenbatch.integrations.trl": ("trl", "transformers"),
    "tokenbatch.integrations.accelerate": ("accelerate",),
    "tokenbatch.integrations.lightning": ("lightning",),
    "tokenbatch.integrations._sharding": ("accelerate",),
    "tokenbatch.integrations._hf_evaluation": ("transformers",),
    "tokenbatch.torch.sampler": ("accelerate", "torch"),
    "tokenbatch.hf": ("datasets", "pyarrow"),
    "tokenbatch.ray": ("ray", "pyarrow"),
}
#: Library modules a module reaches without importing them (found in ``sys.modules``).
LOOKED_UP = {"tokenbatch.integrations._sharding": ("accelerate.state", "accelerate.data_loader")}
COMPAT_MODULES = ["transformers", "accelerate", "datasets"]


def _source(module: str) -> ast.Module:
    path = Path(importlib.import_module(module).__file__ or "")
    return ast.parse(path.read_text(), filename=str(path))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_names_used(tree: ast.Module) -> dict[str, int]:
    """Private names the module reads (also by ``getattr``), imports or defines in a
    class, with a line."""
    used: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            used.setdefault(node.attr, node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
        ):
            used.setdefault(node.args[1].value, node.lineno)
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("tokenbatch"):
            for alias in node.names:
                if _is_private(alias.name):
                    used.setdefault(alias.name, node.lineno)
            for part in (node.module or "").split("."):
                if _is_private(part):
                    used.setdefault(part, node.lineno)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and _is_private(item.name):
                    used.setdefault(item.name, item.lineno)
    return used


def _private_names_of_tokenbatch() -> set[str]:
    """Private names tokenbatch itself defines: functions, classes, attributes it assigns
    and module-level names."""
    defined: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
            elif isinstance(node, ast.alias):
                defined.add(node.asname or node.name.split(".")[0])
    return {name for name in defined if _is_private(name)}


def _library_classes(
    module: ModuleType, tree: ast.Module, libraries: tuple[str, ...]
) -> list[type]:
    """The classes of ``libraries`` the module can reach: the library modules it imports
    (also inside functions, and those named in ``LOOKED_UP``), the classes they hold, and
    the library bases of its own classes."""

    def of_library(obj: object) -> bool:
        name = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
        return str(name).split(".")[0] in libraries

    values: list[object] = list(vars(module).values())
    imported = list(LOOKED_UP.get(module.__name__, ()))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.append(node.module)
    for name in imported:
        if name.split(".")[0] in libraries:
            values.append(importlib.import_module(name))
    found: list[type] = []
    for value in values:
        candidates = list(vars(value).values()) if isinstance(value, ModuleType) else [value]
        for candidate in candidates:
            if inspect.isclass(candidate):
                found += [cls for cls in candidate.__mro__ if of_library(cls)]
    return found


@pytest.mark.parametrize("module_name", sorted(INTEGRATIONS))
def test_integration_uses_no_private_name_of_its_library(module_name: str) -> None:
    libraries = INTEGRATIONS[module_name]
    for library in libraries:
        pytest.importorskip(library)
    module = importlib.import_module(module_name)
    tree = _source(module_name)
    classes = _library_classes(module, tree, libraries)
    assert classes, f"{module_name} refers to no class of {libraries}"
    ours = _private_names_of_tokenbatch()
    problems = []
    for name, line in sorted(_private_names_used(tree).items()):
        owners = [cls.__qualname__ for cls in classes if hasattr(cls, name)]
        if owners:
            problems.append(f"line {line}: {name} is defined by {owners[0]}")
        elif name not in ours:
            problems.append(f"line {line}: {name} is not tokenbatch's")
    assert not problems, (
        f"{module_name} uses private names of {', '.join(libraries)} outside "
        f"tokenbatch.integrations._compat: {problems}"
    )


def test_the_trainer_mixin_sets_no_attribute_a_trainer_has() -> None:
    # Instance attributes are not on the class: compare with a Trainer's own.
    pytest.importorskip("accelerate")
    sys.path.insert(0, str(Path(__file__).resolve().parent / "runs"))
    from run_support import documents, tiny_llama
    from transformers import Trainer, TrainingArguments

    from tokenbatch.integrations.transformers import TokenBudgetTrainer
    from tokenbatch.torch import TokenBudgetBatchSampler

    args = TrainingArguments("unused", use_cpu=True, report_to=[], save_strategy="no")
    data = documents(8)
    plain = Trainer(model=tiny_llama(), args=args, train_dataset=data)
    sampler = TokenBudgetBatchSampler([len(d["input_ids"]) for d in data], 512)
    ours = TokenBudgetTrainer(
        model=tiny_llama(), args=args, train_dataset=data, batch_sampler=sampler
    )
    (mixin,) = [
        node
        for node in _source("tokenbatch.integrations.transformers").body
        if isinstance(node, ast.ClassDef) and node.name == "TokenBudgetTrainerMixin"
    ]
    assigned = {
        node.attr
        for node in ast.walk(mixin)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    assert {"_cursor", "_resume", "micro_batches_per_step"} <= assigned
    assert assigned - {"current_gradient_accumulation_steps"} <= set(vars(ours))
    shared = assigned & set(vars(plain))
    # Only the Trainer's public attributes it means to set: its copy of the arguments,
    # and the micro-batches of the current step (for the loss of models without
    # num_items_in_batch).
    assert shared <= {"args", "current_gradient_accumulation_steps"}, shared


def _compat_module(name: str) -> ModuleType:
    return importlib.import_module(f"tokenbatch.integrations._compat.{name}")


@pytest.mark.parametrize("library", COMPAT_MODULES)
def test_compatibility_hooks_exist_in_the_installed_release(library: str) -> None:
    pytest.importorskip(library)
    hooks: tuple[Hook, ...] = _compat_module(library).HOOKS
    assert hooks
    missing = [hook.qualified for hook in hooks if not hook.exists()]
    assert not missing, (
        f"{library} {_compat.installed(library)} moved the private hooks {missing} that "
        f"tokenbatch.integrations._compat.{library} uses"
    )


def test_every_compatibility_module_is_checked() -> None:
    modules = {path.stem for path in (PACKAGE / "integrations" / "_compat").glob("*.py")}
    assert modules - {"__init__"} == set(COMPAT_MODULES)


def test_a_moved_hook_fails_naming_it() -> None:
    hook = Hook("numpy", "numpy:ndarray", "_gone", "show the error")
    assert not hook.exists()
    with pytest.raises(UnsupportedVersionError, match=r"numpy [\d.]+ has no numpy\.ndarray\._gone"):
        hook.get(object())


def test_the_sampler_reads_no_frame_and_imports_no_accelerate() -> None:
    pytest.importorskip("torch")
    for path in (PACKAGE / "torch" / "sampler.py", PACKAGE / "integrations" / "_sharding.py"):
        source = path.read_text()
        for sign in ("_getframe", "f_locals", "f_back", "inspect.", "__name__ =="):
            assert sign not in source, f"{path.name} has {sign}"
    code = "import sys, tokenbatch.torch; print('accelerate' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_the_table_shows_passing_sessions_on_the_releases_the_extras_name() -> None:
    # docs/compatibility.md is written by the nox sessions: its oldest rows must name the
    # lower bounds pyproject.toml declares today, and every row must have passed.
    pytest.importorskip("nox")
    from packaging.version import Version
    from script_module import load_script

    noxfile = load_script(PACKAGE.parents[1] / "noxfile.py", "noxfile")
    table = (PACKAGE.parents[1] / "docs" / "compatibility.md").read_text()
    for integration in noxfile.INTEGRATIONS.values():
        lines = table.splitlines()
        rows = {}
        for stack in noxfile.STACKS:
            start = f"| {integration.title} | {stack} |"
            rows[stack] = next((line for line in lines if line.startswith(start)), "")
        for stack, row in rows.items():
            assert row.endswith(" passed |"), f"{integration.title} on the {stack} stack: {row!r}"
        declared = noxfile.requirements(integration.extras)
        declared += [noxfile.named(library) for library in integration.harness]
        for pin in noxfile.oldest(declared):
            library, version = re.fullmatch(r"([\w.\-]+)(?:\[.*\])?==(.+)", pin).groups()
            if library not in integration.libraries:
                continue
            releases = rows["oldest"].split("|")[3]
            shown = re.search(rf"\b{re.escape(library)} ([\d.]+)", releases)
            assert shown, f"{integration.title}: the oldest row names no {library}"
            assert Version(shown.group(1)) == Version(version), (
                f"{integration.title}: the oldest session ran {library} {shown.group(1)}, "
                f"pyproject.toml's lower bound is {version}: run nox -t oldest"
            )
