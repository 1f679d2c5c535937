"""The ``tokenbatch`` command line: one sub-command per capability.

Each sub-command lives in its own module exposing ``register(subparsers)``, which adds
its parser and sets ``handler`` (a function taking the parsed namespace and returning
the exit code). Numbers are read by :mod:`tokenbatch.cli.units`, the same way by every
command. Bad input ends with exit status 2 and one line on stderr that names the
argument and what to give instead; no traceback, and no output file is left behind.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from tokenbatch import __version__
from tokenbatch.cli import dataset_command, memory_command, pack_command, schedule_command
from tokenbatch.errors import TokenBatchError

COMMANDS = [pack_command, dataset_command, memory_command, schedule_command]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tokenbatch",
        description="Token-based batch sizing for LLM training.",
    )
    parser.add_argument("--version", action="version", version=f"tokenbatch {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tokenbatch`` script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except TokenBatchError as exc:
        print(f"tokenbatch {args.command}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file that cannot be read or written
        if isinstance(exc, BrokenPipeError):  # e.g. `tokenbatch pack ... | head`
            return 0
        where = f": {exc.filename}" if exc.filename else ""
        print(f"tokenbatch {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tokenbatch: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    return code


def _one_line(message: str) -> str:
    return " ".join(message.split())


if __name__ == "__main__":
    sys.exit(main())
