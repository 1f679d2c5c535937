"""Fixtures shared by the test modules, and ``tests/runs`` on the import path (the
trainer runs' shared corpus and settings, ``run_support``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "runs"))


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
