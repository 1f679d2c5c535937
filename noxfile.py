"""The integration tests on the oldest and the newest release of every library tokenbatch
integrates with, one session per integration and stack:

    nox -l                                      # the sessions
    nox -s "integration(hf_trainer, oldest)"    # one of them
    nox -t oldest                               # every integration on its oldest stack
    nox -t lightning                            # one integration on both stacks
    nox                                         # all of them

A session installs numpy and the extras its integration needs (and what its tests need
besides, such as transformers for the tiny model every trainer run trains). On the
``oldest`` stack each of them is exactly its lower bound (the highest one where two
extras bound the same library), on the ``newest`` the newest release the ranges allow:
pyproject.toml is the one place the ranges are written. Each session installs one
tokenbatch wheel, built once per ``nox`` run (or the wheel ``TOKENBATCH_WHEEL`` names),
runs the integration's tests against the installed package, and writes its row of the
table in ``docs/compatibility.md``: the releases it ran on and its result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import nox

try:
    import tomllib
except ImportError:  # Python 3.10: nox brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
TABLE = ROOT / "docs" / "compatibility.md"
TABLE_START, TABLE_END = "<!-- sessions: start -->", "<!-- sessions: end -->"

nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True

STACKS = ("oldest", "newest")


@dataclasses.dataclass(frozen=True)
class Integration:
    title: str
    extras: tuple[str, ...]  # what a user installs for it
    libraries: tuple[str, ...]  # the releases its row names
    tests: tuple[str, ...]
    select: str  # pytest -k expression over those files
    runs: str  # what the tests run, for the table
    #: Libraries its tests need besides (named in another extra, whose range they take).
    harness: tuple[str, ...] = ()


INTEGRATIONS = {
    "hf_trainer": Integration(
        "Hugging Face Trainer",
        ("torch", "hf"),
        ("transformers", "accelerate", "datasets", "torch", "numpy"),
        ("tests/test_trainers.py", "tests/test_integrations.py", "tests/test_evaluation_runs.py"),
        "test_trainer_ or hf_evaluate",
        "2 ranks: gradient accumulation and a batch-size ramp, each stopped mid-epoch and "
        "resumed exactly; a mixture of two datasets sources, each rank on its plan; a "
        "sampler packing images besides tokens; evaluate() with every document once and its "
        "exact loss",
    ),
    "trl_sft": Integration(
        "TRL SFTTrainer",
        ("torch", "trl"),
        ("trl", "transformers", "accelerate", "torch", "numpy"),
        ("tests/test_trainers.py", "tests/test_integrations.py"),
        "sft",
        "2 ranks on TRL's own tokenization",
    ),
    "accelerate_loop": Integration(
        "Accelerate loop",
        ("torch", "hf"),
        ("accelerate", "torch", "numpy"),
        ("tests/test_trainers.py", "tests/test_integrations.py"),
        "accelerate",
        "2 ranks with prepare_data_loader; plain accelerator.prepare refused on every rank",
    ),
    "lightning": Integration(
        "Lightning",
        ("torch", "lightning"),
        ("lightning", "torch", "numpy"),
        ("tests/test_trainers.py", "tests/test_lightning.py"),
        "lightning",
        "2 DDP ranks, stopped mid-epoch and resumed exactly; use_distributed_sampler=True refused",
        harness=("transformers",),
    ),
    "stateful_loader": Integration(
        "torchdata StatefulDataLoader",
        ("torch", "torchdata"),
        ("torchdata", "torch", "numpy"),
        ("tests/test_trainers.py",),
        "stateful_loader or step_normalization",
        "2 DDP ranks, resumed mid-epoch exactly with 0 and 2 workers; step gradients",
        harness=("transformers",),
    ),
    "hf_datasets": Integration(
        "HF datasets packing",
        ("hf", "trl"),  # the tests read the rows with TRL's collator
        ("datasets", "pyarrow", "numpy"),
        ("tests/test_hf.py", "tests/test_cli_dataset.py", "tests/test_sft_recipe.py"),
        "",
        "pack_dataset: every token once, every value type, views and formats; TRL's "
        "padding-free collator and SFT recipe on the rows (the recipe from TRL 1.16)",
    ),
    "ray": Integration(
        "Ray",
        ("ray",),
        ("ray", "pyarrow", "numpy"),
        ("tests/test_ray.py", "tests/test_ray_cluster.py"),
        "",
        "a 3-node cluster on one machine: exactly once when a worker node dies, S3 output, "
        "unshared output refused",
    ),
}


def requirements(extras: tuple[str, ...]) -> list[str]:
    """numpy and the requirements of ``extras``, with tokenbatch's own extras expanded."""
    optional = PYPROJECT["project"]["optional-dependencies"]
    found: list[str] = list(PYPROJECT["project"]["dependencies"])
    for extra in extras:
        for requirement in optional[extra]:
            own = re.fullmatch(r"tokenbatch\[(.+)\]", requirement)
            found += requirements(tuple(own.group(1).split(","))) if own else [requirement]
    return list(dict.fromkeys(found))


def named(library: str) -> str:
    """The requirement an extra of pyproject.toml gives ``library``."""
    for requirement in requirements(tuple(PYPROJECT["project"]["optional-dependencies"])):
        if _name(requirement) == library:
            return requirement
    raise ValueError(f"no extra of pyproject.toml names {library}")


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.\-]+", requirement)
    assert match, requirement
    return match.group(0).lower()


def _lower_bound(requirement: str) -> tuple[str, tuple[int, ...]]:
    """``name[extras]`` and X of ``name[extras]>=X,...``."""
    match = re.fullmatch(r"([A-Za-z0-9_.\-]+(?:\[[^\]]+\])?)\s*>=\s*([\d.]+)\b.*", requirement)
    if not match:
        raise ValueError(f"{requirement!r} has no lower bound to test")
    return match.group(1), tuple(int(part) for part in match.group(2).split("."))


def oldest(requirements: list[str]) -> list[str]:
    """Each library pinned to its lower bound (the highest, where several bound it)."""
    bounds: dict[str, tuple[str, tuple[int, ...]]] = {}
    for requirement in requirements:
        spelled, bound = _lower_bound(requirement)
        name = _name(requirement)
        if name not in bounds or bound > bounds[name][1]:
            bounds[name] = (spelled, bound)
    return [f"{spelled}=={'.'.join(map(str, bound))}" for spelled, bound in bounds.values()]


def test_tools() -> list[str]:
    """The test extra's tools (not tokenbatch's own extras, nor what only the memory
    tests need)."""
    tools = PYPROJECT["project"]["optional-dependencies"]["test"]
    return [t for t in tools if not t.startswith(("tokenbatch", "megatron-core"))]


_wheel: Path | None = None


def tokenbatch_wheel(session: nox.Session) -> Path:
    """The wheel the sessions install: ``TOKENBATCH_WHEEL`` (a wheel or a folder holding
    one), or one release build of this tree per nox run."""
    global _wheel
    given = os.environ.get("TOKENBATCH_WHEEL")
    if given:
        path = Path(given)
        wheels = sorted(path.glob("tokenbatch-*.whl")) if path.is_dir() else [path]
        if len(wheels) != 1:
            session.error(f"TOKENBATCH_WHEEL={given} holds {len(wheels)} tokenbatch wheels")
        return wheels[0].resolve()
    if _wheel is None:
        out = ROOT / ".nox" / "_wheel"
        for old in out.glob("*.whl"):
            old.unlink()
        session.install("maturin>=1.9.4,<2")
        session.run("maturin", "build", "--release", "--out", str(out))
        (_wheel,) = out.glob("tokenbatch-*.whl")
    return _wheel


def _installed(session: nox.Session, names: tuple[str, ...]) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys; "
        f"v = {{n: m.version(n) for n in {list(names)!r}}}; "
        "v['python'] = '.'.join(map(str, sys.version_info[:3])); print(json.dumps(v))"
    )
    output = session.run("python", "-c", code, silent=True)
    return dict(json.loads(str(output).strip().splitlines()[-1]))


def _outcome(junit: Path) -> tuple[int, int]:
    """(passed, failed or in error) of a pytest JUnit report; a missing one failed."""
    if not junit.exists():
        return 0, 1
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    total, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
    failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return total - skipped - failed, failed


def write_row(name: str, stack: str, versions: dict[str, str], passed: int, failed: int) -> None:
    """Put the session's row into the table of docs/compatibility.md."""
    integration = INTEGRATIONS[name]
    releases = ", ".join(f"{library} {versions[library]}" for library in integration.libraries)
    result = f"**failed** ({failed} of {passed + failed})" if failed else f"{passed} passed"
    row = (
        f"| {integration.title} | {stack} | {releases}, Python {versions['python']} | "
        f"{integration.runs} | {result} |"
    )
    text = TABLE.read_text()
    head, rest = text.split(TABLE_START, 1)
    body, tail = rest.split(TABLE_END, 1)
    rows = {}
    for line in body.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0], cells[1]] = line
    rows[integration.title, stack] = row
    order = [(i.title, s) for i in INTEGRATIONS.values() for s in STACKS]
    lines = [
        "| integration | stack | releases | what the tests run | result |",
        "|---|---|---|---|---|",
        *[rows[key] for key in order if key in rows],
    ]
    TABLE.write_text(f"{head}{TABLE_START}\n" + "\n".join(lines) + f"\n{TABLE_END}{tail}")


@nox.session
@nox.parametrize("stack", [nox.param(stack, id=stack, tags=[stack]) for stack in STACKS])
@nox.parametrize("name", [nox.param(name, id=name, tags=[name]) for name in INTEGRATIONS])
def integration(session: nox.Session, name: str, stack: str) -> None:
    """One integration's tests on its oldest or newest stack."""
    spec = INTEGRATIONS[name]
    session.install(*test_tools())
    declared = requirements(spec.extras) + [named(library) for library in spec.harness]
    session.install(*(oldest(declared) if stack == "oldest" else declared))
    session.install("--no-deps", "--reinstall", str(tokenbatch_wheel(session)))
    # Not in the session's temporary folder: Ray refuses one inside a virtual environment.
    junit = ROOT / ".nox" / "_results" / f"{name}-{stack}.xml"
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    command = ["pytest", *spec.tests, "tests/test_compat.py", "-p", "no:cacheprovider"]
    if spec.select:
        command += ["-k", f"({spec.select}) or test_compat"]
    session.run(*command, f"--junitxml={junit}", success_codes=[0, 1])
    passed, failed = _outcome(junit)
    versions = _installed(session, spec.libraries)
    write_row(name, stack, versions, passed, failed)
    if failed or not passed:
        session.error(f"{name} on the {stack} stack: {failed} failed, {passed} passed")
