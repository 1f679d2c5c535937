"""Mixtures of named sources in target shares of tokens.

A :class:`Mixture` says how many of every optimizer step's tokens come from each source
(web, code, math...), how often a small source may be repeated in one pass, what happens
when one runs out, and how the shares change over training (annealing). The sampler
(:class:`tokenbatch.torch.TokenBudgetBatchSampler` with ``mixture=``) composes every step
from it in the Rust core, and :class:`MixturePlan` reports what each step holds.

This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_choice, as_int, as_str
from tokenbatch.distribute import EpochDeal
from tokenbatch.errors import InvalidTypeError, InvalidValueError

__all__ = ["Exhausted", "Interpolation", "Mixture", "MixturePlan"]

Exhausted = Literal["stop", "renormalize"]
Interpolation = Literal["constant", "linear"]

_I64 = npt.NDArray[np.int64]
_F64 = npt.NDArray[np.float64]


class Mixture:
    """Target token shares of named sources, with repetition caps and a share schedule.

    Args:
        shares: ``{source: share}``, the shares from the first token on; or a schedule of
            change points ``[(consumed_tokens, {source: share}), ...]`` starting at 0, in
            tokens consumed over the whole run (all epochs). The sources are the names of
            the first point, in that order; a later point may leave a source out (share
            0) but not name a new one. Every point's shares are non-negative and sum to 1.
        max_repetition: how many times a pass may use each source: one ``int`` for all,
            or ``{source: int}`` (sources left out: 1). Each repetition uses each of the
            source's sequences exactly once, in a new order.
        exhausted: what happens when a source with a share has used its repetitions:
            ``"stop"`` ends the pass with that step (made smaller so that the shares still
            hold); ``"renormalize"`` drops the source and scales the other shares up to
            sum to 1, and the pass ends when every source with a share has run out.
        interpolation: between two change points, shares hold the first point's values
            (``"constant"``) or move linearly to the next point's (``"linear"``).

    Raises:
        InvalidValueError: shares that are negative or do not sum to 1, change points
            that do not start at 0 or do not increase, a point that names a source the
            first one does not, or a ``max_repetition`` below 1.
    """

    def __init__(
        self,
        shares: Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]],
        *,
        max_repetition: int | Mapping[str, int] = 1,
        exhausted: Exhausted = "stop",
        interpolation: Interpolation = "constant",
    ) -> None:
        points = _as_points(shares)
        self._sources: tuple[str, ...] = tuple(points[0][1])
        self._points = tuple(point for point, _ in points)
        self._shares = np.array(
            [[_share_of(row, name) for name in self._sources] for _, row in points],
            dtype=np.float64,
        )
        self._shares.flags.writeable = False
        for point, row in points[1:]:
            unknown = [name for name in row if name not in self._sources]
            if unknown:
                raise InvalidValueError(
                    f"the share schedule names source {unknown[0]!r} at {point} tokens, which "
                    f"is not one of the sources {list(self._sources)} of its first point"
                )
        self._exhausted = cast(
            Exhausted, as_choice(exhausted, "exhausted", ("stop", "renormalize"))
        )
        self._interpolation = cast(
            Interpolation, as_choice(interpolation, "interpolation", ("constant", "linear"))
        )
        self._max_repetition = _as_repetitions(max_repetition, self._sources)
        self._schedule = _core.ShareSchedule(
            list(self._points),
            self._shares.reshape(-1).tolist(),
            len(self._sources),
            self._interpolation,
        )

    @property
    def sources(self) -> tuple[str, ...]:
        """Source names, in the order of the first change point."""
        return self._sources

    @property
    def points(self) -> tuple[int, ...]:
        """Change points of the shares, in consumed tokens (the first is 0)."""
        return self._points

    @property
    def max_repetition(self) -> dict[str, int]:
        """Repetitions a pass may make of every source."""
        return dict(zip(self._sources, self._max_repetition, strict=True))

    @property
    def exhausted(self) -> Exhausted:
        """What happens when a source has used its repetitions."""
        return self._exhausted

    @property
    def interpolation(self) -> Interpolation:
        """How shares move between change points."""
        return self._interpolation

    def shares_at(self, consumed_tokens: int) -> dict[str, float]:
        """Target shares after ``consumed_tokens`` tokens of the run."""
        values = self._schedule.at(as_int(consumed_tokens, "consumed_tokens", minimum=0))
        return {name: float(v) for name, v in zip(self._sources, values, strict=True)}

    def _arguments(self, order: Sequence[str]) -> tuple[_core.ShareSchedule, list[int]]:
        """The share schedule and repetition caps with the sources in ``order`` (a
        permutation of :attr:`sources`)."""
        columns = [self._sources.index(name) for name in order]
        shares = self._shares[:, columns]
        schedule = _core.ShareSchedule(
            list(self._points), shares.reshape(-1).tolist(), len(order), self._interpolation
        )
        return schedule, [self._max_repetition[c] for c in columns]

    def __repr__(self) -> str:
        points = [
            (point, dict(zip(self._sources, row.tolist(), strict=True)))
            for point, row in zip(self._points, self._shares, strict=True)
        ]
        shares: object = points[0][1] if len(points) == 1 else points
        return (
            f"Mixture({shares!r}, max_repetition={self.max_repetition!r}, "
            f"exhausted={self._exhausted!r}, interpolation={self._interpolation!r})"
        )


def _as_points(shares: object) -> list[tuple[int, Mapping[str, Any]]]:
    if isinstance(shares, Mapping):
        points: list[tuple[int, Mapping[str, Any]]] = [(0, shares)]
    elif isinstance(shares, Sequence) and not isinstance(shares, (str, bytes)):
        points = []
        for item in shares:
            if (
                not isinstance(item, Sequence)
                or isinstance(item, (str, bytes))
                or len(item) != 2
                or not isinstance(item[1], Mapping)
            ):
                raise InvalidTypeError(
                    "a share schedule is a list of (consumed_tokens, {source: share}) pairs, "
                    f"got {item!r}"
                )
            points.append((as_int(item[0], "change point", minimum=0), item[1]))
    else:
        raise InvalidTypeError(
            "shares must be a {source: share} mapping or a list of (consumed_tokens, "
            f"{{source: share}}) pairs, got {type(shares).__name__}"
        )
    if not points or not points[0][1]:
        raise InvalidValueError("a mixture needs at least one source with a share")
    for _, row in points:
        for name in row:
            as_str(name, "source name")
    return points


def _share_of(row: Mapping[str, Any], name: str) -> float:
    value = row.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidTypeError(f"the share of source {name!r} must be a number, got {value!r}")
    return float(value)


def _as_repetitions(value: object, sources: tuple[str, ...]) -> list[int]:
    if not isinstance(value, Mapping):
        cap = as_int(value, "max_repetition", minimum=1)
        return [cap] * len(sources)
    unknown = [name for name in value if name not in sources]
    if unknown:
        raise InvalidValueError(
            f"max_repetition names source {unknown[0]!r}, which is not one of {list(sources)}"
        )
    return [
        as_int(value.get(name, 1), f"max_repetition of source {name!r}", minimum=1)
        for name in sources
    ]


class MixturePlan:
    """One pass over a mixture, as the sampler plans it: the deal of its micro-batches and
    what every optimizer step takes from every source.

    Optimizer step ``k`` is micro-batches ``step_offsets[k]:step_offsets[k + 1]`` of every
    rank. Arrays are read-only. Made by
    :meth:`tokenbatch.torch.TokenBudgetBatchSampler.mixture_plan`.
    """

    def __init__(self, plan: _core.MixturePlan, sources: tuple[str, ...]) -> None:
        self._plan = plan
        self._sources = sources
        self._deal = EpochDeal(plan.deal)

    @property
    def sources(self) -> tuple[str, ...]:
        """Source names, in the order of the columns below (and of the global indices)."""
        return self._sources

    @property
    def deal(self) -> EpochDeal:
        """The micro-batches of every rank."""
        return self._deal

    @property
    def step_offsets(self) -> _I64:
        """``n_steps + 1`` offsets of the optimizer steps in micro-batches."""
        return self._plan.step_offsets

    @property
    def source_tokens(self) -> _I64:
        """``(n_steps, n_sources)`` real tokens every step takes from every source (all
        ranks)."""
        return self._plan.source_tokens

    @property
    def target_tokens(self) -> _F64:
        """``(n_steps, n_sources)`` tokens every step aimed at: share x budget, or all
        that was left of a source that ran out."""
        return self._plan.target_tokens

    @property
    def budgets(self) -> _I64:
        """The batch schedule's token budget of every step."""
        return self._plan.budgets

    @property
    def repetitions(self) -> dict[str, int]:
        """Repetitions the pass began of every source."""
        values = self._plan.repetitions.tolist()
        return dict(zip(self._sources, values, strict=True))

    @property
    def total_tokens(self) -> int:
        """Real tokens of the pass."""
        return self._plan.total_tokens

    def __len__(self) -> int:
        """Optimizer steps of the pass."""
        return len(self._plan.budgets)

    def shares(self) -> _F64:
        """``(n_steps, n_sources)`` share of every source in every step's real tokens."""
        tokens = self.source_tokens.astype(np.float64)
        shares: _F64 = tokens / np.maximum(tokens.sum(axis=1, keepdims=True), 1.0)
        return shares

    def target_shares(self) -> _F64:
        """``(n_steps, n_sources)`` share every step aimed at for every source."""
        targets = self.target_tokens
        shares: _F64 = targets / np.maximum(targets.sum(axis=1, keepdims=True), 1e-300)
        return shares

    def step_tokens(self, step: int) -> dict[str, int]:
        """Real tokens of optimizer step ``step`` per source (for logging)."""
        index = as_int(step, "step", minimum=0)
        if index >= len(self):
            raise InvalidValueError(f"step={index} is beyond the {len(self)} steps of the pass")
        row = self.source_tokens[index].tolist()
        return dict(zip(self._sources, row, strict=True))

    def __repr__(self) -> str:
        return (
            f"MixturePlan(sources={list(self._sources)}, n_steps={len(self)}, "
            f"total_tokens={self.total_tokens})"
        )
