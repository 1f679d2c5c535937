"""Fixtures shared by the test modules, ``tests/runs`` on the import path (the trainer
runs' shared corpus and settings, ``run_support``), and the hypothesis profiles.

``TOKENBATCH_HYPOTHESIS_PROFILE=thorough pytest tests`` runs every property at least
10,000 times (``default``: each test's own budget, sized for a quick run). A test's own
``@settings(max_examples=...)`` would override a profile, so under ``thorough`` each
property's budget is raised to the profile's where it is lower; its other settings stay.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis_profiles import PROFILE_VARIABLE, raise_budgets

sys.path.insert(0, str(Path(__file__).resolve().parent / "runs"))

settings.load_profile(os.environ.get(PROFILE_VARIABLE, "default"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    raise_budgets(items)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run torch on one thread: tiny models train many times faster without threads
    competing for a shared machine's cores (as the multi-process runs do with
    ``OMP_NUM_THREADS=1``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
