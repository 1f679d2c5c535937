"""One parser for counts and one for byte sizes, the same in every command."""

from __future__ import annotations

import argparse
import re

import pytest

from tokenbatch.cli import build_parser, main
from tokenbatch.cli.units import BYTES_HELP, COUNT_HELP, parse_bytes, parse_count


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        ("8K", 8_000),
        ("8Ki", 8_192),
        ("4M", 4_000_000),
        ("4Mi", 4 * 2**20),
        ("469B", 469_000_000_000),
        ("4b", 4_000_000_000),
        ("14.8T", 14_800_000_000_000),
        ("1Ti", 2**40),
        ("3e9", 3_000_000_000),
        ("1_024", 1024),
        ("1,024", 1024),
        (" 7 B ", 7_000_000_000),
    ],
)
def test_counts(text: str, value: int) -> None:
    assert parse_count(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1.5", "not a whole number"),
        ("-4", "negative"),
        ("nan", "expected a count"),
        ("inf", "expected a count"),
        ("", "expected a count"),
        ("12Q", "unknown suffix 'Q'"),
        ("4GB", "is a size in bytes"),
        ("4KiB", "is a size in bytes"),
        ("4G", "10^9 is B"),
    ],
)
def test_bad_counts(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        parse_count(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80GB", 80 * 10**9),
        ("80gb", 80 * 10**9),
        ("141GB", 141 * 10**9),
        ("80GiB", 80 * 2**30),
        ("1.5GB", 1_500_000_000),
        ("0.5KiB", 512),
        ("2TB", 2 * 10**12),
        ("1TiB", 2**40),
        ("4B", 4),
        ("1e9", 10**9),
    ],
)
def test_byte_sizes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("80G", "no byte unit: write 80GB"),
        ("80Gi", "80GiB"),
        ("4M", "no byte unit"),
        ("80XB", "unknown unit 'XB'"),
        ("1.5", "not a whole number of bytes"),
        ("-1GB", "negative"),
        ("lots", "expected a byte size"),
    ],
)
def test_bad_byte_sizes(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        parse_bytes(text)


def test_plan_and_schedule_read_4b_as_four_billion(capsys: pytest.CaptureFixture[str]) -> None:
    """``--global-batch-tokens 4B`` used to mean 4 (bytes) to plan and 4e9 to schedule."""
    plan = ["plan", "llama-3.1-8b", "--gpus", "1024", "--global-batch-tokens", "4B", "--top", "1"]
    assert main(plan) == 0
    # 4e9 tokens rounded to whole sequences of 4096: 976,562 x 4096.
    assert "3,999,997,952 tokens per step" in capsys.readouterr().out
    schedule = ["schedule", "--piecewise", "0:4B", "--total-tokens", "8B", "--micro-batch-tokens"]
    schedule += ["1K", "--json"]
    assert main(schedule) == 0
    assert '"final_batch_tokens": 4000000000' in capsys.readouterr().out


def test_help_of_every_command_documents_the_formats() -> None:
    parser = build_parser()
    subcommands = next(
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    )
    assert set(subcommands.choices) == {"pack", "pack-dataset", "memory", "plan", "schedule"}
    for name, command in subcommands.choices.items():
        text = " ".join(command.format_help().split())
        assert " ".join(COUNT_HELP.split()) in text, name
        if name in ("memory", "plan", "schedule"):
            assert " ".join(BYTES_HELP.split()) in text, name
