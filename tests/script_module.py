"""Importing a script that is not part of the package (an example, a benchmark, a docs
generator) so that a test can call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str) -> ModuleType:
    """The module of the script at ``path``, registered as ``name`` (dataclasses and
    pickling look their module up in ``sys.modules``). As ``python path`` would, it puts
    the script's directory first on ``sys.path``, so the script finds its neighbours."""
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
