"""Exceptions raised by tokenbatch.

Every error tokenbatch raises on bad input derives from :class:`TokenBatchError`, and also
from the builtin a caller would expect (``ValueError``, ``TypeError``, ``OverflowError``),
so both ``except TokenBatchError`` and ``except ValueError`` work.
"""

from __future__ import annotations

__all__ = [
    "InternalError",
    "InvalidTypeError",
    "InvalidValueError",
    "OversizeError",
    "TokenBatchError",
    "TokenBatchOverflowError",
]


class TokenBatchError(Exception):
    """Base class of every tokenbatch error."""


class InvalidValueError(TokenBatchError, ValueError):
    """An argument has the right type but an invalid value (negative length, zero budget...)."""


class OversizeError(InvalidValueError):
    """A sequence is longer than the token budget and ``oversize="error"`` was asked for."""


class InvalidTypeError(TokenBatchError, TypeError):
    """An argument has the wrong type (floats where integers are needed, a 2-D array...)."""


class TokenBatchOverflowError(TokenBatchError, OverflowError):
    """A value or total does not fit the 64-bit integers tokenbatch computes with."""


class InternalError(TokenBatchError, RuntimeError):
    """A bug in tokenbatch: its Rust core panicked. The message names the function; please
    report it with the input that caused it. (Raised instead of pyo3's ``PanicException``,
    which ``except Exception`` would not catch.)"""
