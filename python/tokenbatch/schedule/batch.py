"""Batch-size schedules: a global batch as a function of consumed tokens (or samples),
tabulated per optimizer step by the Rust core, and the published ones by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_int, as_lengths
from tokenbatch.errors import InvalidTypeError, InvalidValueError, TokenBatchOverflowError
from tokenbatch.schedule.tokens import INT64_MAX

__all__ = [
    "PRESETS",
    "BatchSchedule",
    "LinearRamp",
    "MegatronRampup",
    "MegatronStepSchedule",
    "Piecewise",
    "deepseek_v3_ramp",
    "gpt3_ramp",
    "group_into_steps",
    "llama3_405b_schedule",
    "steps_for_tokens",
]

Unit = Literal["tokens", "sequences"]
RampBy = Literal["tokens", "steps"]
IntArrayLike = Sequence[int] | npt.NDArray[np.integer[Any]]

_I64 = npt.NDArray[np.int64]


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
        if batches.size and int(batches.max()) > INT64_MAX // unit_tokens:
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
