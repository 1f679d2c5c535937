"""Thread-count control and fork safety of the parallel core."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

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


FORK_WHILE_PACKING = textwrap.dedent(
    """
    import multiprocessing, sys, threading
    import numpy as np
    import tokenbatch as tb

    lengths = np.arange(1, 2000, dtype=np.int64) % 300
    expected = tb.pack(lengths, 512).indices.tolist()


    def pack_in_child(queue):
        queue.put(tb.pack(lengths, 512).indices.tolist() == expected)


    stop = threading.Event()


    def pack_with_changing_thread_counts():
        # Each count change builds a new pool: the parent's threads are busy with pools
        # (building, installing, dropping, falling asleep) at every moment of a fork.
        count = 0
        while not stop.is_set():
            tb.set_num_threads(3 + count % 2)
            count += 1
            tb.pack(lengths, 512)


    background = threading.Thread(target=pack_with_changing_thread_counts)
    background.start()
    fork = multiprocessing.get_context("fork")
    for child in range(int(sys.argv[1])):
        queue = fork.Queue()
        process = fork.Process(target=pack_in_child, args=(queue,))
        process.start()
        process.join(20)
        if process.is_alive():
            process.kill()
            stop.set()
            sys.exit(f"child {child} hung")
        if process.exitcode != 0 or not queue.get(timeout=5):
            stop.set()
            sys.exit(f"child {child} failed (exit code {process.exitcode})")
    stop.set()
    background.join()
    """
)


def test_children_forked_while_the_parent_packs_on_threads_can_pack() -> None:
    # The DataLoader pattern (pack, then fork workers that pack) with a parent thread
    # still packing and resizing its pool at each fork. A child that inherited the pool's
    # lock held, or that dropped the parent's pool (whose threads it does not have),
    # blocked forever: about one child in ten did before the fix.
    result = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_PACKING, "40"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]


NO_THREADS_ALLOWED = textwrap.dedent(
    """
    import resource, warnings
    import numpy as np
    import tokenbatch as tb

    lengths = np.arange(1, 5000, dtype=np.int64) % 700
    tb.set_num_threads(1)
    expected = tb.pack(lengths, 1024).indices.tolist()  # the pool of one thread works
    # No room left for the stacks of more threads: building a larger pool fails.
    with open("/proc/self/status") as status:
        vm_kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize"))
    limit = (vm_kib << 10) + (16 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    tb.set_num_threads(64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = tb.pack(lengths, 1024).indices.tolist()
        second = tb.pack(lengths, 1024).indices.tolist()
    assert first == second == expected
    messages = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert len(messages) == 1, messages
    assert "could not start 64 threads" in messages[0], messages
    assert "set_num_threads" in messages[0], messages
    print("ok")
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux")
def test_a_pool_that_cannot_start_warns_once_and_packs_on_the_calling_thread() -> None:
    result = subprocess.run(
        [sys.executable, "-c", NO_THREADS_ALLOWED],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"
