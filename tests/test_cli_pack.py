"""The `tokenbatch pack` command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tokenbatch.cli import main


def test_pack_example_prints_a_stats_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", "--example", "lognormal", "--n", "5000", "--max-tokens", "4096"]) == 0
    out = capsys.readouterr().out
    assert "example 'lognormal' (n=5,000, seed=0), bfd, max_tokens=4,096" in out
    for row in ("n_bins", "efficiency", "lower_bound"):
        assert row in out


def test_pack_reads_npy_and_txt_and_writes_npz(tmp_path: Path) -> None:
    lengths = np.array([5, 3, 9, 1, 7], dtype=np.int32)
    np.save(tmp_path / "lengths.npy", lengths)
    (tmp_path / "lengths.txt").write_text("5\n3\n9\n1\n7\n")
    for name in ("lengths.npy", "lengths.txt"):
        out = tmp_path / f"{name}.npz"
        assert main(["pack", str(tmp_path / name), "--max-tokens", "10", "--output", str(out)]) == 0
        saved = np.load(out)
        assert sorted(saved["indices"].tolist()) == [0, 1, 2, 3, 4]
        assert int(saved["max_tokens"]) == 10
        assert (saved["bin_tokens"] <= 10).all()


def test_pack_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", "--example", "chat", "--n", "1000", "--padded", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["n_seqs"] == 1000
    assert stats["padding_tokens"] > 0


def test_pack_bad_input_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.txt").write_text("5\n-3\n")
    assert main(["pack", str(tmp_path / "bad.txt"), "--max-tokens", "10"]) == 2
    assert "lengths[1] = -3 is negative" in capsys.readouterr().err
    assert main(["pack", str(tmp_path / "missing.npy")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "long.txt").write_text("50\n")
    assert main(["pack", str(tmp_path / "long.txt"), "--max-tokens", "10"]) == 2
    assert "oversize='truncate'" in capsys.readouterr().err


def test_console_script_help_documents_every_option() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tokenbatch.cli", "pack", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    for option in ("--example", "--max-tokens", "--algorithm", "--max-seqs", "--oversize"):
        assert option in result.stdout


def test_text_lengths_are_read_across_block_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenbatch.cli import pack_command

    monkeypatch.setattr(pack_command, "TEXT_BLOCK_BYTES", 5)
    (tmp_path / "lengths.txt").write_text("123 45\n6789\t10\n11")
    assert pack_command.read_lengths(tmp_path / "lengths.txt").tolist() == [123, 45, 6789, 10, 11]
    (tmp_path / "bad.txt").write_text("12\n3.5\n")
    with pytest.raises(ValueError, match=r"'3\.5'"):
        pack_command.read_lengths(tmp_path / "bad.txt")


def test_progress_bar_draws_only_on_a_terminal() -> None:
    import io

    from tokenbatch.cli.progress import Progress

    quiet = io.StringIO()
    with Progress("reading", 100, stream=quiet) as bar:
        bar.advance(50)
    assert quiet.getvalue() == ""  # StringIO is not a terminal
    shown = io.StringIO()
    with Progress("reading", 200, stream=shown, enabled=True) as bar:
        bar.advance(200)
    assert "reading [" + "#" * 30 + "] 100%" in shown.getvalue()
    assert Progress("x", 4, enabled=False).render(width=4) == "x [....]   0%"


def test_ctrl_c_stops_cleanly_without_a_traceback(tmp_path: Path) -> None:
    import os
    import signal
    import time

    fifo = tmp_path / "lengths.txt"
    os.mkfifo(fifo)  # reading blocks until a writer appears: a stand-in for a huge file
    # A shell starts background jobs with SIGINT ignored, a child inherits that, and
    # Python then never turns it into KeyboardInterrupt: start the command with SIGINT
    # handled here, which a child gets back as the default, as from a terminal.
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "tokenbatch.cli", "pack", str(fifo)],
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    # A non-blocking open for writing succeeds only once the reader has the FIFO open:
    # then the command is past start-up and waiting for data.
    deadline = time.monotonic() + 60
    while True:
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert time.monotonic() < deadline, "the command never opened the file"
            time.sleep(0.05)
    try:
        time.sleep(0.2)  # into the blocking read
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        os.close(writer)
    assert process.returncode == 128 + signal.SIGINT
    assert "interrupted" in err
    assert "Traceback" not in err
