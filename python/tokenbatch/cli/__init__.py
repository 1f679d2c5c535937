"""The ``tokenbatch`` command line: one sub-command per capability.

Each sub-command lives in its own module exposing ``register(subparsers)``, which adds
its parser and sets ``handler`` (a function taking the parsed namespace and returning
the exit code).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from tokenbatch import __version__
from tokenbatch.cli import dataset_command, memory_command, pack_command, schedule_command
from tokenbatch.errors import TokenBatchError

COMMANDS = [pack_command, dataset_command, memory_command, schedule_command]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
        print(f"tokenbatch: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tokenbatch: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:  # e.g. `tokenbatch pack ... | head`
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
