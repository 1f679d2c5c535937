"""Packaging: the release wheel is abi3 and complete, installs into a clean virtual
environment where the packing tests pass against the installed package (not the source
tree), and the sdist holds everything a source build needs and builds into a wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Test files that need only numpy, pytest and hypothesis.
PORTABLE_TESTS = ["test_packing.py", "test_packing_errors.py", "test_stream.py"]
CONFTEST = """
import sys
from pathlib import Path

import tokenbatch


def pytest_sessionstart(session):
    installed = Path(tokenbatch.__file__).resolve()
    assert Path(sys.prefix).resolve() in installed.parents, installed
"""


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
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Same profile and features as `pip install .`, so cargo reuses that build.
    run(sys.executable, "-m", "maturin", "build", "--release", "--out", out)
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_is_abi3_and_complete(wheel: Path) -> None:
    assert "-cp310-abi3-" in wheel.name, "one wheel for CPython 3.10 and newer"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for required in (
        "tokenbatch/__init__.py",
        "tokenbatch/py.typed",
        "tokenbatch/_core.pyi",
        "tokenbatch/stream.py",
        "tokenbatch/torch/streaming.py",
        "tokenbatch/hf.py",
        "tokenbatch/cli/__init__.py",
    ):
        assert required in names
    assert [n for n in names if n.startswith("tokenbatch/_core.") and n.endswith(".so")] == [
        "tokenbatch/_core.abi3.so"
    ]
    assert not [n for n in names if n.startswith(("tests/", "benches/", "rust/"))]


def test_installed_wheel_passes_the_packing_tests(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # numpy, pytest and hypothesis come from the system; tokenbatch only from the wheel.
    run(sys.executable, "-m", "venv", "--system-site-packages", venv)
    python = venv / "bin" / "python"
    # --ignore-installed: where tokenbatch of the same version is installed system-wide
    # (as CI does), pip would otherwise call the requirement satisfied and skip the wheel.
    run(
        python,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-index",
        "--ignore-installed",
        "--quiet",
        wheel,
    )
    location = run(python, "-c", "import tokenbatch; print(tokenbatch.__file__)").strip()
    assert Path(location).is_relative_to(venv), location
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in PORTABLE_TESTS:
        shutil.copy(ROOT / "tests" / name, suite / name)
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    output = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", suite, cwd=suite)
    assert " passed" in output
    assert "failed" not in output
    cli = run(venv / "bin" / "tokenbatch", "pack", "--example", "chat", "--n", "1000", "--json")
    assert '"n_seqs": 1000' in cli


def test_sdist_has_the_sources_and_builds_a_wheel(tmp_path: Path) -> None:
    run(sys.executable, "-m", "maturin", "sdist", "--out", tmp_path)
    (sdist,) = tmp_path.glob("*.tar.gz")
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
    # sources fresh by their timestamps without compiling them (about 30 s this way).
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
    (built,) = out.glob("*.whl")
    assert "-cp310-abi3-" in built.name
    with zipfile.ZipFile(built) as archive:
        assert "tokenbatch/_core.abi3.so" in archive.namelist()
