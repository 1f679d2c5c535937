"""Megatron-LM launcher arguments for batch-size schedules, both ways.

Megatron-LM (core 0.18 and later) takes a batch-size schedule as
``--step-batch-size-schedule "0:768 250B:1536 500B:3072"``: ``THRESHOLD:BATCH`` pairs, batches
in samples (sequences), thresholds with optional ``K``/``M``/``B``/``T`` suffixes (powers of
1,000), read as tokens when ``--seq-length`` is given and as samples otherwise. Token
thresholds are converted to samples by floor division by the sequence length, and the batch
after ``consumed_samples`` samples is that of the last threshold at or below it. Earlier
versions took ``--rampup-batch-size START INCREMENT RAMP_SAMPLES``, which newer ones ignore.

* :func:`from_step_batch_size_schedule` parses the string into a
  :class:`~tokenbatch.schedule.MegatronStepSchedule` that gives the batch Megatron gives, at
  every consumed sample count;
* :func:`to_step_batch_size_schedule` writes any tokenbatch schedule as that string, exactly:
  Megatron reading it gives the schedule's batch at every whole number of consumed samples;
* :func:`to_rampup_batch_size` writes a schedule that is linear in samples as the legacy
  :class:`~tokenbatch.schedule.MegatronRampup` triple, checked to be exact.
"""

from __future__ import annotations

import itertools
from decimal import Decimal
from typing import Literal

import numpy as np
import numpy.typing as npt

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError, TokenBatchOverflowError
from tokenbatch.schedule import (
    BatchSchedule,
    LinearRamp,
    MegatronRampup,
    MegatronStepSchedule,
    Piecewise,
)

__all__ = [
    "from_step_batch_size_schedule",
    "to_rampup_batch_size",
    "to_step_batch_size_schedule",
]

_I64 = npt.NDArray[np.int64]
_SUFFIXES = (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3))
_INT64_MAX = int(np.iinfo(np.int64).max)


# ---------------------------------------------------------------------------------------
# Parsing, as Megatron-LM parses
# ---------------------------------------------------------------------------------------


def _megatron_number(text: str, entry: str) -> int:
    """A count with an optional K/M/B/T suffix, read as Megatron-LM reads it.

    Megatron multiplies the float of the digits by the suffix and truncates, so ``2.4B``
    is whatever ``int(2.4 * 1e9)`` is: reproducing that keeps thresholds bit-identical.
    """
    digits = text.strip().upper()
    multiplier = 1
    for suffix, scale in _SUFFIXES:
        if digits.endswith(suffix):
            digits, multiplier = digits[: -len(suffix)], scale
            break
    try:
        return int(float(digits) * multiplier)
    except (ValueError, OverflowError):
        raise InvalidValueError(
            f"schedule entry {entry!r}: cannot read {text!r} as a count (e.g. 768, 250B, 1.5T)"
        ) from None


def from_step_batch_size_schedule(
    text: str, *, seq_length: int | None = None
) -> MegatronStepSchedule:
    """Parse a ``--step-batch-size-schedule`` value exactly as Megatron-LM does.

    Entries are separated by spaces or commas; each is ``THRESHOLD:BATCH``. With
    ``seq_length`` (Megatron's ``--seq-length``) thresholds are tokens, converted to samples
    by floor division; without it they are samples. Entries are sorted by threshold; the
    first must be 0, thresholds must then strictly increase (after conversion) and batches
    be positive. Megatron's assertions become :class:`~tokenbatch.errors.InvalidValueError`
    naming the entry. The result keeps ``seq_length`` as its ``seq_len``, so
    :meth:`~tokenbatch.schedule.BatchSchedule.table` works in tokens.

    >>> schedule = from_step_batch_size_schedule("0:768 250B:1536", seq_length=4096)
    >>> schedule.pieces
    [(0, 768), (61035156, 1536)]
    """
    if not isinstance(text, str):
        raise InvalidTypeError(f"the schedule must be a string, got {type(text).__name__}")
    length = None if seq_length is None else as_int(seq_length, "seq_length", minimum=1)
    pieces: list[tuple[int, int]] = []
    for entry in text.strip().replace(",", " ").split():
        threshold_text, colon, batch_text = entry.partition(":")
        if not colon:
            raise InvalidValueError(
                f"invalid schedule entry {entry!r}: expected THRESHOLD:BATCH_SIZE"
            )
        threshold = _megatron_number(threshold_text, entry)
        batch = _megatron_number(batch_text, entry)
        if length is not None:
            threshold //= length
        pieces.append((threshold, batch))
    if not pieces:
        raise InvalidValueError("the schedule has no entry (expected e.g. '0:768 250B:1536')")
    pieces.sort(key=lambda piece: piece[0])  # stable, as Megatron's list.sort
    unit = "samples" if length is None else f"samples (tokens // seq_length={length})"
    if pieces[0][0] != 0:
        raise InvalidValueError(f"the first threshold must be 0, got {pieces[0][0]} {unit}")
    for (before, _), (after, _) in itertools.pairwise(pieces):
        if after <= before:
            raise InvalidValueError(
                f"thresholds must strictly increase, got {before} before {after} {unit}"
            )
    for threshold, batch in pieces:
        if batch <= 0:
            raise InvalidValueError(
                f"batch sizes must be positive, got {batch} from threshold {threshold}"
            )
        if threshold > _INT64_MAX or batch > _INT64_MAX:
            raise TokenBatchOverflowError(
                f"entry {threshold}:{batch} does not fit in a signed 64-bit integer"
            )
    return MegatronStepSchedule(pieces, seq_len=length)


# ---------------------------------------------------------------------------------------
# Exporting: the schedule's batch at every whole number of consumed samples
# ---------------------------------------------------------------------------------------


def _seq_len_for(schedule: BatchSchedule, seq_len: int | None) -> int | None:
    if seq_len is None:
        return schedule.seq_len
    given = as_int(seq_len, "seq_len", minimum=1)
    if schedule.seq_len is not None and schedule.seq_len != given:
        raise InvalidValueError(
            f"seq_len={given} differs from the schedule's seq_len={schedule.seq_len}"
        )
    return given


def _batch_sequences_at(schedule: BatchSchedule, samples: _I64, seq_len: int | None) -> _I64:
    """The schedule's batch in sequences after each number of consumed samples."""
    if schedule.key == "samples":
        return schedule.batch_at(samples)
    if seq_len is None:
        raise InvalidValueError(
            f"{type(schedule).__name__} is keyed by tokens: give seq_len (Megatron's "
            "--seq-length) to express it in samples"
        )
    if samples.size and int(samples.max()) > _INT64_MAX // seq_len:
        raise TokenBatchOverflowError("consumed samples x seq_len does not fit in 64 bits")
    tokens = schedule.batch_tokens_at(samples * seq_len)
    ragged = np.flatnonzero(tokens % seq_len)
    if ragged.size:
        at = int(samples[ragged[0]]) * seq_len
        raise InvalidValueError(
            f"after {at:,} tokens the batch is {int(tokens[ragged[0]]):,} tokens, not a whole "
            f"number of sequences of seq_len={seq_len}: Megatron-LM counts batches in sequences"
        )
    result: _I64 = tokens // seq_len
    return result


def _ramp_end_samples(schedule: BatchSchedule, seq_len: int | None) -> int:
    """A number of consumed samples from which the schedule's batch no longer changes."""
    if isinstance(schedule, MegatronRampup):
        return schedule.ramp_samples + 1
    if isinstance(schedule, LinearRamp) and seq_len is not None:
        return -(-schedule.ramp_tokens // seq_len)
    raise InvalidTypeError(f"cannot export a {type(schedule).__name__} to Megatron-LM")


def _monotone_breakpoints(
    schedule: BatchSchedule, seq_len: int | None
) -> tuple[list[int], list[int]]:
    """Every sample count where a non-decreasing schedule's batch changes, and the batch.

    Bisection over all intervals at once: an interval whose ends give different batches
    holds a change and is halved, one whose ends agree holds none (the batch is monotone),
    so each change costs about log2(ramp samples) evaluations, in few vectorized calls.
    """
    end = _ramp_end_samples(schedule, seq_len)
    first = int(_batch_sequences_at(schedule, np.zeros(1, dtype=np.int64), seq_len)[0])
    low = np.zeros(1, dtype=np.int64)
    high = np.array([end], dtype=np.int64)
    low_batch = np.array([first], dtype=np.int64)
    high_batch = _batch_sequences_at(schedule, high, seq_len)
    found: dict[int, int] = {0: first}
    while low.size:
        changing = low_batch != high_batch
        low, high = low[changing], high[changing]
        low_batch, high_batch = low_batch[changing], high_batch[changing]
        adjacent = high - low == 1
        found.update(zip(high[adjacent].tolist(), high_batch[adjacent].tolist(), strict=True))
        low, high = low[~adjacent], high[~adjacent]
        low_batch, high_batch = low_batch[~adjacent], high_batch[~adjacent]
        middle = low + (high - low) // 2
        middle_batch = _batch_sequences_at(schedule, middle, seq_len)
        low = np.concatenate([low, middle])
        high = np.concatenate([middle, high])
        low_batch, high_batch = (
            np.concatenate([low_batch, middle_batch]),
            np.concatenate([middle_batch, high_batch]),
        )
    starts = sorted(found)
    return starts, [found[start] for start in starts]


def _sample_breakpoints(
    schedule: BatchSchedule, seq_len: int | None
) -> tuple[list[int], list[int]]:
    """``(samples, batches)``: the batch changes to ``batches[i]`` at ``samples[i]``.

    Token thresholds become the first whole sample at or after them (a Megatron run only
    consumes whole samples), so the schedule and its export agree at every sample count.
    """
    if isinstance(schedule, (Piecewise, MegatronStepSchedule)):
        starts = np.array([start for start, _ in schedule.pieces], dtype=np.int64)
        if schedule.key == "tokens":
            if seq_len is None:
                raise InvalidValueError(
                    "Piecewise is keyed by tokens: give seq_len (Megatron's --seq-length) to "
                    "express it in samples"
                )
            starts = np.unique(-(-starts // seq_len))
        batches = _batch_sequences_at(schedule, starts, seq_len)
        keep = np.concatenate([[True], batches[1:] != batches[:-1]])
        return starts[keep].tolist(), batches[keep].tolist()
    return _monotone_breakpoints(schedule, seq_len)


def _format_count(value: int) -> str:
    """The shortest spelling of ``value`` that Megatron-LM reads back as exactly ``value``.

    Megatron reads every count through a float, so above 2^53 some integers have no exact
    spelling; those are refused rather than written off by one.
    """
    spellings = [str(value)]
    for suffix, scale in _SUFFIXES:
        if value >= scale:
            digits = format(Decimal(value) / Decimal(scale), "f")
            if "." in digits:
                digits = digits.rstrip("0").rstrip(".")
            spellings.append(f"{digits}{suffix}")
    exact = [text for text in spellings if _megatron_number(text, text) == value]
    if not exact:
        raise TokenBatchOverflowError(
            f"{value} cannot be written exactly for Megatron-LM, which reads counts as "
            "floating-point numbers (exact up to 2^53)"
        )
    return min(exact, key=len)


def to_step_batch_size_schedule(
    schedule: BatchSchedule,
    *,
    seq_len: int | None = None,
    thresholds: Literal["tokens", "samples"] = "tokens",
) -> str:
    """The ``--step-batch-size-schedule`` value that makes Megatron-LM follow ``schedule``.

    Exact: Megatron-LM reading the string (with ``--seq-length seq_len`` for token
    thresholds) gives ``schedule``'s batch, in sequences, after every whole number of
    consumed samples; so a run takes the same batch at every step. Ramps are written as one
    entry per change of the batch (found by bisection, a few hundred microseconds per
    entry), piecewise schedules as their pieces. Thresholds are ``"tokens"`` (what
    Megatron reads when ``--seq-length`` is set, as in GPT training) or ``"samples"``,
    spelled with a K/M/B/T suffix when that is shorter and exact.

    ``seq_len`` defaults to the schedule's; it is needed for token thresholds and for
    schedules keyed by tokens, whose batches must be whole sequences.

    >>> from tokenbatch.schedule import Piecewise
    >>> to_step_batch_size_schedule(Piecewise([(0, 768), (250 * 10**9, 1536)],
    ...     unit="sequences", seq_len=4096))
    '0:768 250000003072:1536'
    """
    if not isinstance(schedule, BatchSchedule):
        raise InvalidTypeError(
            f"schedule must be a tokenbatch BatchSchedule, got {type(schedule).__name__}"
        )
    if thresholds not in ("tokens", "samples"):
        raise InvalidValueError(f"thresholds must be 'tokens' or 'samples', got {thresholds!r}")
    length = _seq_len_for(schedule, seq_len)
    if thresholds == "tokens" and length is None:
        raise InvalidValueError(
            "token thresholds need seq_len (Megatron's --seq-length); or pass thresholds='samples'"
        )
    starts, batches = _sample_breakpoints(schedule, length)
    scale = 1 if thresholds == "samples" or length is None else length
    entries = []
    for start, batch in zip(starts, batches, strict=True):
        if start > _INT64_MAX // scale:
            raise TokenBatchOverflowError(f"threshold {start} x {scale} overflows 64 bits")
        entries.append(f"{_format_count(start * scale)}:{batch}")
    return " ".join(entries)


def to_rampup_batch_size(schedule: BatchSchedule, *, seq_len: int | None = None) -> MegatronRampup:
    """The legacy ``--rampup-batch-size`` equivalent of a schedule linear in samples.

    Returns a :class:`~tokenbatch.schedule.MegatronRampup` (see its ``launcher_args()``)
    whose batch equals ``schedule``'s after every whole number of consumed samples; this is
    checked, change by change, including Megatron's floating-point division. A schedule
    that is not such a ramp (a constant or decreasing batch, or changes that fall where
    no Megatron ramp puts them) raises :class:`~tokenbatch.errors.InvalidValueError`
    saying why. ``seq_len`` is as in :func:`to_step_batch_size_schedule`.

    >>> from tokenbatch.schedule import LinearRamp
    >>> ramp = LinearRamp(32, 1024, 1000 * 2048, unit="sequences", seq_len=2048, multiple_of=32)
    >>> to_rampup_batch_size(ramp).launcher_args()
    '--rampup-batch-size 32 32 1000 --global-batch-size 1024 --seq-length 2048'
    """
    if not isinstance(schedule, BatchSchedule):
        raise InvalidTypeError(
            f"schedule must be a tokenbatch BatchSchedule, got {type(schedule).__name__}"
        )
    length = _seq_len_for(schedule, seq_len)
    starts, batches = _sample_breakpoints(schedule, length)
    if len(batches) == 1:
        raise InvalidValueError(
            f"the batch is constant ({batches[0]} sequences): no ramp, use "
            f"--global-batch-size {batches[0]}"
        )
    steps = np.diff(batches)
    if np.any(steps <= 0):
        raise InvalidValueError(
            "not a ramp: the batch decreases ("
            + " -> ".join(str(batch) for batch in batches[:6])
            + (" ...)" if len(batches) > 6 else ")")
        )
    # A Megatron ramp may skip values (several increments per sample): the increment
    # divides every change.
    increment = int(np.gcd.reduce(steps))
    last = starts[-1]
    # Megatron reaches the last batch by the increment at `ramp_samples`, or one sample
    # after it; its float division decides which, so try both and keep an exact one.
    for ramp_samples in (last, last - 1):
        if ramp_samples < 1:
            continue
        candidate = MegatronRampup(batches[0], increment, ramp_samples, batches[-1], seq_len=length)
        if _sample_breakpoints(candidate, length) == (starts, batches):
            return candidate
    increments = (batches[-1] - batches[0]) // increment
    raise InvalidValueError(
        f"not linear in samples: the batch changes at samples {starts[1:4]}... to "
        f"{batches[1:4]}...; a --rampup-batch-size ramp from {batches[0]} by +{increment} "
        f"changes at ceil(k x ramp_samples / {increments}), which no ramp_samples matches"
    )
