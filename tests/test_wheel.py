"""Packaging: the release wheel that ``.ci/wheel`` builds is abi3, manylinux_2_28 or
older and complete; it installs into a clean virtual environment (no Rust toolchain on
``PATH``, the oldest numpy tokenbatch supports) where the portable tests pass against
the installed package; and the sdist holds everything a source build needs and builds
into a wheel.

``TOKENBATCH_WHEEL`` may name a wheel (or a folder with the wheel and the sdist) that
``.ci/wheel`` built already, as ``.ci/run`` does; otherwise the tests build one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10: pytest brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def run(*command: str | Path, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding the release wheel and the sdist of ``.ci/wheel``."""
    given = os.environ.get("TOKENBATCH_WHEEL")
    if given:
        path = Path(given)
        return path if path.is_dir() else path.parent
    out = tmp_path_factory.mktemp("dist")
    run("bash", ROOT / ".ci" / "wheel", out, env={**os.environ, "PYTHON": sys.executable})
    return out


@pytest.fixture(scope="module")
def wheel(built: Path) -> Path:
    wheels = list(built.glob("tokenbatch-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_one_version_from_cargo_toml() -> None:
    import importlib.metadata

    import tokenbatch

    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in pyproject, "the version is Cargo.toml's (dynamic)"
    assert pyproject["dynamic"] == ["version"]
    assert tokenbatch.__version__ == cargo
    assert Version(importlib.metadata.version("tokenbatch")) == Version(cargo)
    # The changelog has a section for the version (released or on its way).
    assert f"\n## {cargo}\n" in (ROOT / "CHANGELOG.md").read_text()


def oldest_numpy() -> str:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (numpy,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("numpy")]
    match = re.fullmatch(r"numpy>=([\d.]+)", numpy)
    assert match, numpy
    return match.group(1)


def test_wheel_is_abi3_manylinux_and_complete(wheel: Path) -> None:
    assert "-cp310-abi3-" in wheel.name, "one wheel for CPython 3.10 and newer"
    if sys.platform == "linux":
        glibc = [int(v) for v in re.findall(r"manylinux_2_(\d+)", wheel.name)]
        assert glibc, f"{wheel.name} is not a manylinux wheel"
        assert min(glibc) <= 28, f"{wheel.name} needs a glibc newer than 2.28"
        assert "linux_x86_64" not in wheel.name.replace("manylinux", "")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for required in (
        "tokenbatch/__init__.py",
        "tokenbatch/py.typed",
        "tokenbatch/_core.pyi",
        "tokenbatch/_arrow.py",
        "tokenbatch/torch/streaming.py",
        "tokenbatch/hf.py",
        "tokenbatch/integrations/_compat/__init__.py",
        "tokenbatch/cli/__init__.py",
    ):
        assert required in names
    assert [n for n in names if n.startswith("tokenbatch/_core.") and n.endswith(".so")] == [
        "tokenbatch/_core.abi3.so"
    ]
    assert not [n for n in names if n.startswith(("tests/", "benches/", "rust/"))]


def without_rust(path: str) -> str:
    """``PATH`` less every folder that holds a Rust toolchain."""
    folders = [f for f in path.split(os.pathsep) if f]
    return os.pathsep.join(
        f for f in folders if not any(Path(f, tool).exists() for tool in ("cargo", "rustc"))
    )


def test_installed_wheel_passes_the_portable_tests_without_rust(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)  # no system site packages
    bindir = Path(sysconfig.get_path("scripts", vars={"base": str(venv)}))
    python = bindir / "python"
    env = {**os.environ, "PATH": os.pathsep.join([str(bindir), without_rust(os.environ["PATH"])])}
    env.pop("PYTHONPATH", None)
    assert shutil.which("cargo", path=env["PATH"]) is None
    assert shutil.which("rustc", path=env["PATH"]) is None
    numpy = oldest_numpy()
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # The oldest numpy first: pip then keeps it, as tokenbatch asks for numpy>=1.24.
    run(*pip, f"numpy=={numpy}", "pytest", "hypothesis", env=env)
    run(*pip, "--no-index", "--no-deps", wheel, env=env)
    versions = run(
        python, "-c", "import numpy, tokenbatch; print(numpy.__version__, tokenbatch.__file__)"
    ).split()
    assert Version(versions[0]) == Version(numpy), versions[0]
    assert Path(versions[1]).is_relative_to(venv), versions[1]
    output = run(python, ROOT / ".ci" / "portable-tests", cwd=tmp_path, env=env)
    assert " passed" in output
    assert "failed" not in output
    assert "1,000,000 sequences" in output


def test_sdist_has_the_sources_and_builds_a_wheel(built: Path, tmp_path: Path) -> None:
    (sdist,) = built.glob("tokenbatch-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for required in (
        "pyproject.toml",
        "Cargo.toml",
        "Cargo.lock",
        "README.md",
        "rust/core/src/lib.rs",
        "rust/core/src/packing/mod.rs",
        "rust/py/src/lib.rs",
        "python/tokenbatch/__init__.py",
        "python/tokenbatch/_core.pyi",
    ):
        assert required in names, required
    # Build the wheel from the sdist alone, as pip does for a source install, in a cargo
    # target directory of its own: reusing the tree's would let cargo call the sdist's
    # sources fresh by their timestamps without compiling them.
    env = {**os.environ, "CARGO_TARGET_DIR": str(tmp_path / "target")}
    out = tmp_path / "wheel"
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--quiet",
        "--wheel-dir",
        out,
        sdist,
        env=env,
    )
    (from_source,) = out.glob("*.whl")
    assert "-cp310-abi3-" in from_source.name
    with zipfile.ZipFile(from_source) as archive:
        assert "tokenbatch/_core.abi3.so" in archive.namelist()
