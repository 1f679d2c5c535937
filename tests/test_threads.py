"""Thread-count control and fork safety of the parallel core."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import tokenbatch as tb


def test_set_and_get_num_threads() -> None:
    default = tb.get_num_threads()
    assert default >= 1
    try:
        tb.set_num_threads(1)
        assert tb.get_num_threads() == 1
        # Parallel work still gives the same answer on one thread.
        table_one = tb.schedule.MegatronRampup(32, 32, 1000, 1024).batch_at(np.arange(2000))
    finally:
        tb.set_num_threads(None)
    assert tb.get_num_threads() == default
    table_all = tb.schedule.MegatronRampup(32, 32, 1000, 1024).batch_at(np.arange(2000))
    assert np.array_equal(table_one, table_all)
    with pytest.raises(tb.InvalidValueError, match="num_threads"):
        tb.set_num_threads(0)


def test_parallel_work_after_fork_does_not_hang() -> None:
    # Warm the pool in the parent, then use it in a forked child (as DataLoader workers do).
    consumed = np.arange(200_000)
    ramp = tb.schedule.MegatronRampup(32, 32, 100_000, 1024)
    expected = ramp.batch_at(consumed)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: compute, report, exit without running pytest's teardown
        signal.alarm(30)  # a deadlocked pool kills the child instead of hanging the suite
        ok = np.array_equal(ramp.batch_at(consumed), expected)
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert os.read(read, 1) == b"1"
