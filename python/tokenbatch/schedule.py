"""Batch-size schedules, token arithmetic and learning rates keyed to tokens.

State the batch in tokens and let everything else follow: sequences per step, gradient
accumulation, optimizer steps for a token budget, batch-size ramps during training
(Megatron-LM's ``--rampup-batch-size``, DeepSeek-V3's and GPT-3's linear ramps, Llama 3's
doublings, Megatron-LM's ``--step-batch-size-schedule``) and learning-rate schedules
defined in tokens, so they stay right when the batch size changes. The per-step
arithmetic runs in the Rust core; :mod:`tokenbatch.megatron` reads and writes Megatron-LM's
launcher arguments.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_int, as_lengths
from tokenbatch.errors import InvalidTypeError, InvalidValueError, TokenBatchOverflowError

__all__ = [
    "PRESETS",
    "BatchScaledLR",
    "BatchSchedule",
    "ConstantLR",
    "CosineLR",
    "LRSchedule",
    "LinearRamp",
    "MegatronRampup",
    "MegatronStepSchedule",
    "Piecewise",
    "WarmupStableDecayLR",
    "deepseek_v3_ramp",
    "gpt3_ramp",
    "grad_accum_steps",
    "group_into_steps",
    "llama3_405b_schedule",
    "rescale_lr",
    "sequences_per_step",
    "steps_for_tokens",
    "tokens_for_steps",
    "tokens_per_step",
]

Unit = Literal["tokens", "sequences"]
RampBy = Literal["tokens", "steps"]
IntArrayLike = Sequence[int] | npt.NDArray[np.integer[Any]]
FloatArrayLike = Sequence[float] | npt.NDArray[np.floating[Any]] | npt.NDArray[np.integer[Any]]

_I64 = npt.NDArray[np.int64]
_F64 = npt.NDArray[np.float64]
_INT64_MAX = int(np.iinfo(np.int64).max)


# ---------------------------------------------------------------------------------------
# Token arithmetic
# ---------------------------------------------------------------------------------------


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


def steps_for_tokens(total_tokens: int, batch: int | BatchSchedule) -> int:
    """Optimizer steps that consume at most ``total_tokens`` tokens.

    ``batch`` is a constant global batch in tokens, or a :class:`BatchSchedule` (steps are
    then counted as :meth:`BatchSchedule.table` counts them). A partial last batch is not
    a step, as in Megatron-LM: round ``total_tokens`` up to a batch multiple to include it.
    """
    if isinstance(batch, BatchSchedule):
        return batch.num_steps(total_tokens)
    total = as_int(total_tokens, "total_tokens", minimum=0)
    tokens = as_int(batch, "batch", minimum=1)
    return total // tokens


def tokens_for_steps(steps: int, batch_tokens: int) -> int:
    """Tokens consumed by ``steps`` optimizer steps of ``batch_tokens`` tokens."""
    count = as_int(steps, "steps", minimum=0)
    tokens = as_int(batch_tokens, "batch_tokens", minimum=1)
    return _fits_int64(count * tokens, "steps x batch_tokens")


def _fits_int64(value: int, what: str) -> int:
    if value > _INT64_MAX:
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


# ---------------------------------------------------------------------------------------
# Batch-size schedules
# ---------------------------------------------------------------------------------------


def _as_consumed(values: Any, name: str) -> tuple[_I64, tuple[int, ...] | None]:
    """Flatten ``values`` to a contiguous int64 array; the shape is ``None`` for scalars."""
    if isinstance(values, (int, np.integer)) and not isinstance(values, (bool, np.bool_)):
        return np.array([as_int(values, name)], dtype=np.int64), None
    array = values if isinstance(values, np.ndarray) else np.asarray(values)
    if array.ndim == 0:
        return np.array([as_int(array.item(), name)], dtype=np.int64), None
    shape = array.shape
    flat = as_lengths(array.reshape(-1), name)
    return np.ascontiguousarray(flat, dtype=np.int64), shape


def _as_unit(value: object) -> Unit:
    if value == "tokens":
        return "tokens"
    if value == "sequences":
        return "sequences"
    raise InvalidValueError(f"unit must be 'tokens' or 'sequences', got {value!r}")


def _as_seq_len(value: object, unit: Unit) -> int | None:
    if value is None:
        if unit == "sequences":
            raise InvalidValueError("unit='sequences' needs seq_len (tokens per sequence)")
        return None
    return as_int(value, "seq_len", minimum=1)


class BatchSchedule(ABC):
    """A global batch size as a function of training progress.

    ``batch_at`` reads the schedule in its own terms (:attr:`key` consumed, result in
    :attr:`unit`); ``batch_tokens_at`` always maps consumed tokens to a batch in tokens.
    ``table`` and :func:`group_into_steps` are computed by the Rust core.
    """

    unit: Unit
    """What the batch counts: ``"tokens"`` or ``"sequences"`` (of :attr:`seq_len` tokens)."""
    seq_len: int | None
    """Tokens per sequence (needed to convert sequences to tokens), or ``None``."""
    key: Literal["tokens", "samples"] = "tokens"
    """What :meth:`batch_at` reads: consumed tokens, or consumed samples (Megatron-LM)."""

    @property
    @abstractmethod
    def _raw(self) -> _core.Schedule: ...

    @overload
    def batch_at(self, consumed: int) -> int: ...
    @overload
    def batch_at(self, consumed: IntArrayLike) -> _I64: ...
    def batch_at(self, consumed: int | IntArrayLike) -> int | _I64:
        """Global batch (in :attr:`unit`) after ``consumed`` tokens (samples for Megatron).

        Accepts an integer or an integer array of any shape; returns the same shape.
        """
        name = "consumed_samples" if self.key == "samples" else "tokens"
        flat, shape = _as_consumed(consumed, name)
        batches = self._raw.batch_at(flat)
        if shape is None:
            return int(batches[0])
        return batches.reshape(shape)

    @overload
    def batch_tokens_at(self, tokens: int) -> int: ...
    @overload
    def batch_tokens_at(self, tokens: IntArrayLike) -> _I64: ...
    def batch_tokens_at(self, tokens: int | IntArrayLike) -> int | _I64:
        """Global batch in tokens for a step that starts after ``tokens`` consumed tokens."""
        flat, shape = _as_consumed(tokens, "tokens")
        unit_tokens = 1
        if self.unit == "sequences" or self.key == "samples":
            if self.seq_len is None:
                raise InvalidValueError(
                    f"{type(self).__name__} counts sequences: give it seq_len to convert to tokens"
                )
            unit_tokens = self.seq_len
        at = flat // unit_tokens if self.key == "samples" else flat
        batches = self._raw.batch_at(np.ascontiguousarray(at))
        if batches.size and int(batches.max()) > _INT64_MAX // unit_tokens:
            raise TokenBatchOverflowError("a batch in tokens does not fit in 64 bits")
        in_tokens = batches * unit_tokens if self.unit == "sequences" else batches
        if shape is None:
            return int(in_tokens[0])
        return in_tokens.reshape(shape)

    def table(self, total_tokens: int, micro_batch_tokens: int, dp: int) -> dict[str, _I64]:
        """Per optimizer step until ``total_tokens`` are consumed, as int64 numpy arrays.

        Keys: ``batch_sequences``, ``batch_tokens``, ``grad_accum_steps`` (micro-batches per
        rank) and ``consumed_tokens`` (after the step). Each step takes the batch the
        schedule gives at the tokens consumed before it; a step that would overrun
        ``total_tokens`` is not taken (less than one batch is left over, as Megatron-LM
        drops a partial last batch). Every batch must be a whole number of
        ``micro_batch_tokens x dp`` rounds, otherwise the first offending step is reported.
        ``batch_sequences`` counts sequences of :attr:`seq_len` tokens, or packed rows of
        ``micro_batch_tokens`` tokens when the schedule has no ``seq_len``.
        """
        total = as_int(total_tokens, "total_tokens", minimum=0)
        micro = as_int(micro_batch_tokens, "micro_batch_tokens", minimum=1)
        ranks = as_int(dp, "dp", minimum=1)
        batch_sequences, batch_tokens, accum, consumed = self._raw.table(total, micro, ranks)
        return {
            "batch_sequences": batch_sequences,
            "batch_tokens": batch_tokens,
            "grad_accum_steps": accum,
            "consumed_tokens": consumed,
        }

    def num_steps(self, total_tokens: int) -> int:
        """Optimizer steps :meth:`table` takes for ``total_tokens`` (any micro-batch size)."""
        row = self.seq_len if self.seq_len is not None else 1
        return len(self.table(total_tokens, row, 1)["batch_tokens"])

    def group_into_steps(
        self, micro_batch_tokens: IntArrayLike, dp: int, *, consumed_tokens: int = 0
    ) -> _I64:
        """See :func:`group_into_steps`."""
        tokens = np.ascontiguousarray(
            as_lengths(micro_batch_tokens, "micro_batch_tokens"), dtype=np.int64
        )
        return self._raw.group_into_steps(
            tokens,
            as_int(dp, "dp", minimum=1),
            as_int(consumed_tokens, "consumed_tokens", minimum=0),
        )


class MegatronRampup(BatchSchedule):
    """Megatron-LM's ``--rampup-batch-size start increment ramp_samples``.

    With ``--global-batch-size global_batch``: while ``consumed_samples <= ramp_samples``
    the global batch (in sequences) is ``start + floor(consumed_samples /
    (ramp_samples / ((global_batch - start) / increment))) x increment``, then
    ``global_batch``. The division is done in floating point exactly as Megatron-LM does it,
    so the batch switches at the same sample as in a Megatron run. :meth:`batch_at` reads
    consumed *samples*; give ``seq_len`` to use :meth:`table` and token-based methods.

    >>> MegatronRampup(32, 32, 1000, 1024).batch_at([0, 32, 33, 999, 1000, 1001]).tolist()
    [32, 32, 64, 992, 1024, 1024]
    """

    key: Literal["tokens", "samples"] = "samples"

    def __init__(
        self,
        start: int,
        increment: int,
        ramp_samples: int,
        global_batch: int,
        *,
        seq_len: int | None = None,
    ) -> None:
        self.start = as_int(start, "start")
        self.increment = as_int(increment, "increment")
        self.ramp_samples = as_int(ramp_samples, "ramp_samples")
        self.global_batch = as_int(global_batch, "global_batch")
        self.unit = "sequences"
        self.seq_len = None if seq_len is None else as_int(seq_len, "seq_len", minimum=1)
        self._schedule = _core.Schedule.megatron(
            self.start, self.increment, self.ramp_samples, self.global_batch, self.seq_len
        )

    @property
    def _raw(self) -> _core.Schedule:
        return self._schedule

    def train_iters(self, train_samples: int) -> int:
        """Optimizer steps Megatron-LM runs for ``--train-samples train_samples``.

        Counted as Megatron's ``update_train_iters`` counts them: every step of the ramp
        (which runs while consumed samples <= ``ramp_samples``), then whole global batches
        of what is left, rounded down (a partial last batch is dropped).
        """
        iters = self._schedule.megatron_train_iters(as_int(train_samples, "train_samples"))
        return 0 if iters is None else iters

    def launcher_args(self) -> str:
        """The Megatron-LM arguments of this ramp (``--seq-length`` when known).

        Megatron-LM ignores ``--rampup-batch-size`` since core 0.18 (April 2026); newer
        versions take :func:`tokenbatch.megatron.to_step_batch_size_schedule` instead.

        >>> MegatronRampup(32, 32, 1000, 1024).launcher_args()
        '--rampup-batch-size 32 32 1000 --global-batch-size 1024'
        """
        args = (
            f"--rampup-batch-size {self.start} {self.increment} {self.ramp_samples} "
            f"--global-batch-size {self.global_batch}"
        )
        return args if self.seq_len is None else f"{args} --seq-length {self.seq_len}"

    def __repr__(self) -> str:
        return (
            f"MegatronRampup(start={self.start}, increment={self.increment}, "
            f"ramp_samples={self.ramp_samples}, global_batch={self.global_batch}, "
            f"seq_len={self.seq_len})"
        )


class LinearRamp(BatchSchedule):
    """A batch growing linearly from ``start`` to ``end`` over the first ``ramp_tokens``.

    ``unit`` says what ``start`` and ``end`` count (sequences of ``seq_len`` tokens, or
    tokens). ``by="tokens"`` grows the batch linearly in consumed tokens (DeepSeek-V3:
    3,072 to 15,360 sequences of 4,096 tokens over the first 469B tokens); ``by="steps"``
    grows it by the same amount every optimizer step, which in consumed tokens ``T`` is
    ``sqrt(start^2 + (end^2 - start^2) T / ramp_tokens)``. Values are rounded down to a
    multiple of ``multiple_of`` (e.g. micro-batch x data-parallel size, in ``unit``), so
    ``start`` and ``end`` must be multiples of it. After ``ramp_tokens`` the batch is
    ``end``.

    >>> LinearRamp(3072, 15360, 469_000_000_000, unit="sequences", seq_len=4096).batch_at(
    ...     234_500_000_000
    ... )
    9216
    """

    def __init__(
        self,
        start: int,
        end: int,
        ramp_tokens: int,
        *,
        unit: Unit = "tokens",
        seq_len: int | None = None,
        by: RampBy = "tokens",
        multiple_of: int = 1,
    ) -> None:
        self.start = as_int(start, "start")
        self.end = as_int(end, "end")
        self.ramp_tokens = as_int(ramp_tokens, "ramp_tokens")
        self.unit = _as_unit(unit)
        self.seq_len = _as_seq_len(seq_len, self.unit)
        if by not in ("tokens", "steps"):
            raise InvalidValueError(f"by must be 'tokens' or 'steps', got {by!r}")
        self.by: RampBy = by
        self.multiple_of = as_int(multiple_of, "multiple_of")
        self._schedule = _core.Schedule.linear(
            self.start,
            self.end,
            self.ramp_tokens,
            unit=self.unit,
            seq_len=self.seq_len,
            by=self.by,
            multiple_of=self.multiple_of,
        )

    @property
    def _raw(self) -> _core.Schedule:
        return self._schedule

    def __repr__(self) -> str:
        return (
            f"LinearRamp({self.start}, {self.end}, {self.ramp_tokens}, unit={self.unit!r}, "
            f"seq_len={self.seq_len}, by={self.by!r}, multiple_of={self.multiple_of})"
        )


class Piecewise(BatchSchedule):
    """Constant batch sizes switching at token boundaries.

    ``pieces`` lists ``(from_tokens, batch)`` pairs: ``batch`` applies from ``from_tokens``
    consumed tokens on. The first piece starts at 0, boundaries strictly increase and
    batches never decrease unless ``allow_decrease=True``.

    >>> llama = Piecewise([(0, 4 * 2**20), (252_000_000, 8 * 2**20)])
    >>> llama.batch_at([0, 300_000_000]).tolist()
    [4194304, 8388608]
    """

    def __init__(
        self,
        pieces: Sequence[tuple[int, int]],
        *,
        unit: Unit = "tokens",
        seq_len: int | None = None,
        allow_decrease: bool = False,
    ) -> None:
        starts, batches = _as_pieces(pieces, "from_tokens")
        self.pieces: list[tuple[int, int]] = list(zip(starts, batches, strict=True))
        self.unit = _as_unit(unit)
        self.seq_len = _as_seq_len(seq_len, self.unit)
        self.allow_decrease = bool(allow_decrease)
        self._schedule = _core.Schedule.piecewise(
            np.array(starts, dtype=np.int64),
            np.array(batches, dtype=np.int64),
            unit=self.unit,
            seq_len=self.seq_len,
            allow_decrease=self.allow_decrease,
        )

    @property
    def _raw(self) -> _core.Schedule:
        return self._schedule

    def __repr__(self) -> str:
        return f"Piecewise({self.pieces}, unit={self.unit!r}, seq_len={self.seq_len})"


def _as_pieces(pieces: object, start_name: str) -> tuple[list[int], list[int]]:
    """``(start, batch)`` pairs as two lists of ints, with errors naming the bad pair."""
    if isinstance(pieces, (str, bytes)) or not isinstance(pieces, Sequence):
        raise InvalidTypeError(
            f"pieces must be a sequence of ({start_name}, batch) pairs, got {pieces!r}"
        )
    starts: list[int] = []
    batches: list[int] = []
    for position, piece in enumerate(pieces):
        if not isinstance(piece, (tuple, list)) or len(piece) != 2:
            raise InvalidTypeError(
                f"pieces[{position}] must be a ({start_name}, batch) pair, got {piece!r}"
            )
        starts.append(as_int(piece[0], f"pieces[{position}] {start_name}"))
        batches.append(as_int(piece[1], f"pieces[{position}] batch"))
    return starts, batches


class MegatronStepSchedule(BatchSchedule):
    """Megatron-LM's ``--step-batch-size-schedule``, with Megatron's semantics.

    ``pieces`` lists ``(from_samples, batch)`` pairs, both in samples (sequences), as
    Megatron-LM holds the schedule once parsed: the global batch after
    ``consumed_samples`` samples is the batch of the last piece whose threshold is at most
    ``consumed_samples``. Thresholds start at 0 and strictly increase; batches are positive
    and may decrease (Megatron allows it). :meth:`batch_at` reads consumed *samples*; give
    ``seq_len`` (``--seq-length``) to use :meth:`table` and the token-based methods.

    Build one from the launcher string with
    :func:`tokenbatch.megatron.from_step_batch_size_schedule`, which converts token
    thresholds to samples as Megatron does.

    >>> MegatronStepSchedule([(0, 768), (1000, 1536)]).batch_at([0, 999, 1000]).tolist()
    [768, 768, 1536]
    """

    key: Literal["tokens", "samples"] = "samples"

    def __init__(self, pieces: Sequence[tuple[int, int]], *, seq_len: int | None = None) -> None:
        starts, batches = _as_pieces(pieces, "from_samples")
        self.pieces: list[tuple[int, int]] = list(zip(starts, batches, strict=True))
        self.unit = "sequences"
        self.seq_len = None if seq_len is None else as_int(seq_len, "seq_len", minimum=1)
        self._schedule = _core.Schedule.megatron_steps(
            np.array(starts, dtype=np.int64), np.array(batches, dtype=np.int64), self.seq_len
        )

    @property
    def _raw(self) -> _core.Schedule:
        return self._schedule

    def __repr__(self) -> str:
        return f"MegatronStepSchedule({self.pieces}, seq_len={self.seq_len})"


def group_into_steps(
    micro_batch_tokens: IntArrayLike,
    schedule: BatchSchedule,
    dp: int,
    *,
    consumed_tokens: int = 0,
) -> npt.NDArray[np.int64]:
    """Group micro-batches into optimizer steps whose token totals follow ``schedule``.

    ``micro_batch_tokens`` holds the tokens of every micro-batch in global order: the
    ``j``-th goes to data-parallel rank ``j % dp`` in round ``j // dp`` (its length must
    be a multiple of ``dp``). Steps are made of whole rounds, greedily: a step takes its
    first round, then each next round while that brings the step's token total closer
    to ``schedule.batch_tokens_at(tokens consumed before the step)``. The last step holds
    what is left. ``consumed_tokens`` is where the schedule stands before the first
    micro-batch (tokens trained on in earlier epochs, say).

    Returns ``step_offsets`` (int64, ``n_steps + 1``, in rounds): step ``s`` is rounds
    ``step_offsets[s]:step_offsets[s + 1]``, so every rank accumulates
    ``step_offsets[s + 1] - step_offsets[s]`` micro-batches and then steps the optimizer.
    Multiply by ``dp`` for offsets into ``micro_batch_tokens``.
    """
    if not isinstance(schedule, BatchSchedule):
        raise InvalidTypeError(f"schedule must be a BatchSchedule, got {type(schedule).__name__}")
    return schedule.group_into_steps(micro_batch_tokens, dp, consumed_tokens=consumed_tokens)


def deepseek_v3_ramp(*, multiple_of: int = 1) -> LinearRamp:
    """DeepSeek-V3's ramp: 3,072 to 15,360 sequences of 4,096 tokens over 469B tokens."""
    return LinearRamp(
        3072, 15360, 469_000_000_000, unit="sequences", seq_len=4096, multiple_of=multiple_of
    )


def gpt3_ramp(*, ramp_tokens: int = 4_000_000_000, multiple_of: int = 16) -> LinearRamp:
    """GPT-3 175B's ramp: 32K tokens (16 x 2,048) to 3.2M (1,536 x 2,048), linear in tokens.

    The paper ramps over the first 4 to 12 billion tokens depending on model size.
    """
    return LinearRamp(
        16, 1536, ramp_tokens, unit="sequences", seq_len=2048, multiple_of=multiple_of
    )


def llama3_405b_schedule() -> Piecewise:
    """Llama 3 405B: 4M tokens, 8M after 252M tokens, 16M after 2.87T tokens."""
    return Piecewise([(0, 4 * 2**20), (252_000_000, 8 * 2**20), (2_870_000_000_000, 16 * 2**20)])


PRESETS: dict[str, Callable[[], BatchSchedule]] = {
    "deepseek-v3": deepseek_v3_ramp,
    "gpt3-175b": gpt3_ramp,
    "llama3-405b": llama3_405b_schedule,
}
"""Published schedules by name (functions returning a fresh schedule)."""


# ---------------------------------------------------------------------------------------
# Learning rate keyed to tokens
# ---------------------------------------------------------------------------------------


def _as_tokens_float(values: Any, name: str) -> tuple[_F64, bool]:
    array = np.asarray(values)
    if array.dtype.kind not in "iuf" or array.dtype == np.bool_:
        raise InvalidTypeError(f"{name} must be numbers, got dtype {array.dtype}")
    result = array.astype(np.float64)
    if np.any(~np.isfinite(result)) or np.any(result < 0):
        raise InvalidValueError(f"{name} must be finite and >= 0")
    return result, array.ndim == 0


def _as_rate(value: object, name: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidTypeError(f"{name} must be a number, got {value!r}")
    rate = float(value)
    if not math.isfinite(rate) or rate < 0 or (rate == 0 and not allow_zero):
        raise InvalidValueError(f"{name} must be a finite positive number, got {value!r}")
    return rate


class LRSchedule(ABC):
    """A learning rate as a function of consumed tokens.

    Defining the schedule in tokens keeps warmup and decay where they belong when the
    batch size changes (a ramp, a resumed run on more GPUs): evaluate it at the
    ``consumed_tokens`` of each step (e.g. the column of :meth:`BatchSchedule.table`).
    """

    @abstractmethod
    def _lr(self, tokens: _F64) -> _F64: ...

    @overload
    def lr_at(self, tokens: int | float) -> float: ...
    @overload
    def lr_at(self, tokens: FloatArrayLike) -> _F64: ...
    def lr_at(self, tokens: int | float | FloatArrayLike) -> float | _F64:
        """Learning rate after ``tokens`` consumed tokens (scalar or array)."""
        array, scalar = _as_tokens_float(tokens, "tokens")
        rates = self._lr(np.atleast_1d(array)).reshape(array.shape)
        return float(rates) if scalar else rates


def _warmup_factor(tokens: _F64, warmup: float) -> _F64:
    if warmup <= 0:
        return np.ones_like(tokens)
    return np.minimum(tokens / warmup, 1.0)


class ConstantLR(LRSchedule):
    """``lr`` after a linear warmup from 0 over ``warmup_tokens``."""

    def __init__(self, lr: float, *, warmup_tokens: int = 0) -> None:
        self.lr = _as_rate(lr, "lr")
        self.warmup_tokens = as_int(warmup_tokens, "warmup_tokens", minimum=0)

    def _lr(self, tokens: _F64) -> _F64:
        return self.lr * _warmup_factor(tokens, self.warmup_tokens)


class CosineLR(LRSchedule):
    """Linear warmup to ``peak_lr``, cosine decay to ``min_lr`` at ``total_tokens``."""

    def __init__(
        self,
        peak_lr: float,
        total_tokens: int,
        *,
        warmup_tokens: int = 0,
        min_lr: float = 0.0,
    ) -> None:
        self.peak_lr = _as_rate(peak_lr, "peak_lr")
        self.min_lr = _as_rate(min_lr, "min_lr", allow_zero=True)
        self.total_tokens = as_int(total_tokens, "total_tokens", minimum=1)
        self.warmup_tokens = as_int(warmup_tokens, "warmup_tokens", minimum=0)
        if self.warmup_tokens >= self.total_tokens:
            raise InvalidValueError(
                f"warmup_tokens={self.warmup_tokens:,} must be below "
                f"total_tokens={self.total_tokens:,}"
            )
        if self.min_lr > self.peak_lr:
            raise InvalidValueError(f"min_lr={min_lr} is above peak_lr={peak_lr}")

    def _lr(self, tokens: _F64) -> _F64:
        span = self.total_tokens - self.warmup_tokens
        progress = np.clip((tokens - self.warmup_tokens) / span, 0.0, 1.0)
        cosine = self.min_lr + 0.5 * (self.peak_lr - self.min_lr) * (1 + np.cos(np.pi * progress))
        warm = self.peak_lr * _warmup_factor(tokens, self.warmup_tokens)
        result: _F64 = np.where(tokens < self.warmup_tokens, warm, cosine)
        return result


class WarmupStableDecayLR(LRSchedule):
    """Warmup-stable-decay (WSD): warmup to ``peak_lr``, hold, decay over the last tokens.

    The decay covers the last ``decay_tokens`` of ``total_tokens`` (default: the last
    20%), to ``min_lr``, with shape ``"linear"``, ``"cosine"`` or ``"sqrt"``
    (``1 - sqrt(progress)``).
    """

    def __init__(
        self,
        peak_lr: float,
        total_tokens: int,
        *,
        warmup_tokens: int = 0,
        decay_tokens: int | None = None,
        min_lr: float = 0.0,
        decay_shape: Literal["linear", "cosine", "sqrt"] = "linear",
    ) -> None:
        self.peak_lr = _as_rate(peak_lr, "peak_lr")
        self.min_lr = _as_rate(min_lr, "min_lr", allow_zero=True)
        self.total_tokens = as_int(total_tokens, "total_tokens", minimum=1)
        self.warmup_tokens = as_int(warmup_tokens, "warmup_tokens", minimum=0)
        default_decay = self.total_tokens // 5
        self.decay_tokens = as_int(
            default_decay if decay_tokens is None else decay_tokens, "decay_tokens", minimum=0
        )
        if self.warmup_tokens + self.decay_tokens > self.total_tokens:
            raise InvalidValueError(
                f"warmup_tokens + decay_tokens = {self.warmup_tokens + self.decay_tokens:,} "
                f"exceeds total_tokens={self.total_tokens:,}"
            )
        if self.min_lr > self.peak_lr:
            raise InvalidValueError(f"min_lr={min_lr} is above peak_lr={peak_lr}")
        if decay_shape not in ("linear", "cosine", "sqrt"):
            raise InvalidValueError(
                f"decay_shape must be 'linear', 'cosine' or 'sqrt', got {decay_shape!r}"
            )
        self.decay_shape = decay_shape

    def _lr(self, tokens: _F64) -> _F64:
        decay_start = self.total_tokens - self.decay_tokens
        if self.decay_tokens > 0:
            progress = np.clip((tokens - decay_start) / self.decay_tokens, 0.0, 1.0)
        else:
            progress = (tokens >= self.total_tokens).astype(np.float64)
        if self.decay_shape == "linear":
            remaining = 1.0 - progress
        elif self.decay_shape == "cosine":
            remaining = 0.5 * (1.0 + np.cos(np.pi * progress))
        else:
            remaining = 1.0 - np.sqrt(progress)
        decayed = self.min_lr + (self.peak_lr - self.min_lr) * remaining
        warm = self.peak_lr * _warmup_factor(tokens, self.warmup_tokens)
        result: _F64 = np.where(tokens < self.warmup_tokens, warm, decayed)
        return result


@overload
def rescale_lr(
    lr: float, from_batch: float, to_batch: float, rule: Literal["sqrt", "linear"] = ...
) -> float: ...
@overload
def rescale_lr(
    lr: float, from_batch: float, to_batch: FloatArrayLike, rule: Literal["sqrt", "linear"] = ...
) -> _F64: ...
def rescale_lr(
    lr: float,
    from_batch: float,
    to_batch: float | FloatArrayLike,
    rule: Literal["sqrt", "linear"] = "sqrt",
) -> float | _F64:
    """Learning rate for a batch of ``to_batch`` given one tuned at ``from_batch``.

    ``rule="sqrt"`` scales by ``sqrt(to_batch / from_batch)`` (Adam-type optimizers);
    ``rule="linear"`` by ``to_batch / from_batch`` (SGD). Batches in any one unit;
    ``to_batch`` may be an array (e.g. a table's ``batch_tokens``).
    """
    base = _as_rate(lr, "lr")
    reference = _as_rate(from_batch, "from_batch")
    target, scalar = _as_tokens_float(to_batch, "to_batch")
    if np.any(target <= 0):
        raise InvalidValueError("to_batch must be > 0")
    if rule == "sqrt":
        factor = np.sqrt(target / reference)
    elif rule == "linear":
        factor = target / reference
    else:
        raise InvalidValueError(f"rule must be 'sqrt' or 'linear', got {rule!r}")
    result = base * factor
    return float(result) if scalar else np.asarray(result, dtype=np.float64)


class BatchScaledLR(LRSchedule):
    """A learning-rate schedule rescaled to the batch a batch schedule gives.

    ``lr_at(tokens) = base.lr_at(tokens) x rule(batch_tokens_at(tokens) / reference)``,
    where ``base`` was tuned at a batch of ``reference_batch_tokens`` tokens: during a
    ramp the smaller batches get the smaller learning rate the rule asks for.
    """

    def __init__(
        self,
        base: LRSchedule,
        schedule: BatchSchedule,
        reference_batch_tokens: int,
        *,
        rule: Literal["sqrt", "linear"] = "sqrt",
    ) -> None:
        if not isinstance(base, LRSchedule):
            raise InvalidTypeError(f"base must be an LRSchedule, got {type(base).__name__}")
        if not isinstance(schedule, BatchSchedule):
            raise InvalidTypeError(
                f"schedule must be a BatchSchedule, got {type(schedule).__name__}"
            )
        if rule not in ("sqrt", "linear"):
            raise InvalidValueError(f"rule must be 'sqrt' or 'linear', got {rule!r}")
        self.base = base
        self.schedule = schedule
        self.reference_batch_tokens = as_int(
            reference_batch_tokens, "reference_batch_tokens", minimum=1
        )
        self.rule: Literal["sqrt", "linear"] = rule

    def _lr(self, tokens: _F64) -> _F64:
        whole = np.floor(tokens).astype(np.int64)
        batches = self.schedule.batch_tokens_at(whole).astype(np.float64)
        ratio = batches / self.reference_batch_tokens
        factor = np.sqrt(ratio) if self.rule == "sqrt" else ratio
        result: _F64 = self.base._lr(tokens) * factor
        return result
