"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


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
