"""Token arithmetic of a global batch: tokens and sequences per step, gradient
accumulation, tokens for a number of steps; errors name the nearest valid sizes."""

from __future__ import annotations

import math

import numpy as np

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidValueError, TokenBatchOverflowError

__all__ = ["grad_accum_steps", "sequences_per_step", "tokens_for_steps", "tokens_per_step"]

INT64_MAX = int(np.iinfo(np.int64).max)


def tokens_per_step(batch_sequences: int, seq_len: int) -> int:
    """Tokens in a global batch of ``batch_sequences`` sequences of ``seq_len`` tokens."""
    sequences = as_int(batch_sequences, "batch_sequences", minimum=1)
    length = as_int(seq_len, "seq_len", minimum=1)
    return _fits_int64(sequences * length, "batch_sequences x seq_len")


def sequences_per_step(batch_tokens: int, seq_len: int) -> int:
    """Sequences of ``seq_len`` tokens in a global batch of ``batch_tokens`` tokens.

    Raises :class:`~tokenbatch.errors.InvalidValueError` (with the nearest valid batch
    sizes) when ``batch_tokens`` is not a whole number of sequences.
    """
    tokens = as_int(batch_tokens, "batch_tokens", minimum=1)
    length = as_int(seq_len, "seq_len", minimum=1)
    if tokens % length:
        raise InvalidValueError(
            f"batch_tokens={tokens:,} is not a whole number of sequences of seq_len={length:,}; "
            f"nearest valid batch_tokens: {_nearest_multiples(tokens, length)}"
        )
    return tokens // length


def grad_accum_steps(global_batch_tokens: int, micro_batch_tokens: int, dp: int) -> int:
    """Micro-batches each data-parallel rank accumulates per optimizer step.

    ``global_batch_tokens = grad_accum_steps x micro_batch_tokens x dp`` must hold exactly.
    When it does not, the error names the nearest valid global batch sizes and, where
    they exist, the nearest micro-batch sizes and data-parallel sizes that divide.

    >>> grad_accum_steps(4 * 2**20, 8192, 64)
    8
    """
    total = as_int(global_batch_tokens, "global_batch_tokens", minimum=1)
    micro = as_int(micro_batch_tokens, "micro_batch_tokens", minimum=1)
    ranks = as_int(dp, "dp", minimum=1)
    round_tokens = micro * ranks
    if total % round_tokens == 0:
        return total // round_tokens
    hints = [f"global_batch_tokens: {_nearest_multiples(total, round_tokens)}"]
    if total % ranks == 0:
        near = _nearest_divisors(total // ranks, micro)
        if near:
            hints.append(f"micro_batch_tokens: {near}")
    if total % micro == 0:
        near = _nearest_divisors(total // micro, ranks)
        if near:
            hints.append(f"dp: {near}")
    raise InvalidValueError(
        f"global_batch_tokens={total:,} is not a multiple of micro_batch_tokens x dp = "
        f"{micro:,} x {ranks} = {round_tokens:,}; nearest valid " + "; ".join(hints)
    )


def tokens_for_steps(steps: int, batch_tokens: int) -> int:
    """Tokens consumed by ``steps`` optimizer steps of ``batch_tokens`` tokens."""
    count = as_int(steps, "steps", minimum=0)
    tokens = as_int(batch_tokens, "batch_tokens", minimum=1)
    return _fits_int64(count * tokens, "steps x batch_tokens")


def _fits_int64(value: int, what: str) -> int:
    if value > INT64_MAX:
        raise TokenBatchOverflowError(f"{what} = {value} does not fit in a signed 64-bit integer")
    return value


def _nearest_multiples(value: int, step: int) -> str:
    below = value // step * step
    if below == 0:
        return f"{step:,}"
    return f"{below:,} or {below + step:,}"


def _nearest_divisors(n: int, around: int) -> str:
    """The divisors of ``n`` closest to ``around`` (below and above), or '' if too costly."""
    if n > 10**14:
        return ""
    candidates = np.arange(1, math.isqrt(n) + 1, dtype=np.int64)
    small = candidates[n % candidates == 0]
    divisors = np.unique(np.concatenate([small, n // small]))
    below = divisors[divisors < around]
    above = divisors[divisors > around]
    picks = [f"{int(below[-1]):,}"] if below.size else []
    picks += [f"{int(above[0]):,}"] if above.size else []
    return " or ".join(picks)
