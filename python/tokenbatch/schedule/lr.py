"""Learning-rate schedules keyed to consumed tokens, so they stay right when the batch
size changes, and rescaling a learning rate to another batch size."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.schedule.batch import BatchSchedule

__all__ = [
    "BatchScaledLR",
    "ConstantLR",
    "CosineLR",
    "LRSchedule",
    "WarmupStableDecayLR",
    "rescale_lr",
]

FloatArrayLike = Sequence[float] | npt.NDArray[np.floating[Any]] | npt.NDArray[np.integer[Any]]

_F64 = npt.NDArray[np.float64]


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
