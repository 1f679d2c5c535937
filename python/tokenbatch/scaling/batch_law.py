"""The batch and step terms of the three-term law, ``B / M^beta + C / K^gamma``: the
optimal batch, near-optimal ranges and the critical batch."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from tokenbatch.errors import InvalidValueError
from tokenbatch.scaling.published import LAWS, LawInfo, positive_float

__all__ = ["BatchLaw", "RangeDefinition", "check_positive"]

RangeDefinition = Literal["paper", "extra_tokens"]
"""How :meth:`BatchLaw.near_optimal_range` reads its tolerance (see there)."""
_positive_float = positive_float


def check_positive(law: object, names: Sequence[str]) -> None:
    """Each attribute of ``law`` named in ``names`` is a finite positive float."""
    for name in names:
        _positive_float(getattr(law, name), name)


def _edge(outside: Callable[[float], bool], inside: float, direction: float) -> float:
    """Where ``outside`` starts, walking from ``inside`` (log batch) in ``direction``."""
    step = 1.0
    probe = inside + direction * step
    while not outside(probe):
        inside, step = probe, step * 2
        probe = inside + direction * step
        if step > 2**12:
            return math.copysign(math.inf, direction)
    return _bisect(outside, probe, inside)


@dataclass(frozen=True)
class BatchLaw:
    """The batch and step terms of the three-term law, ``B / M^beta + C / K^gamma``.

    At a fixed model these two terms are all that the batch size changes, so this is the
    law a batch-size choice needs: ``M`` the global batch in tokens, ``K`` optimizer steps,
    ``D = M K`` tokens. Its value at ``(M, D)`` is the *reducible loss* ``R`` (the loss
    minus ``E + A / N^alpha``); methods taking ``reducible`` take such a value.

    Build one from a fitted :class:`ThreeTermLaw` (``law.batch_law``), from a published
    optimal-batch law with :meth:`from_optimal_batch`, or by name with :meth:`published`.
    A law built from an optimal batch fixes only ratios, so it is normalised to ``B = 1``
    and its loss values are relative: what it says about batch sizes (optimum, ranges,
    :meth:`token_fraction`, critical batch for its own losses, ramp) does not depend on it.
    """

    B: float
    beta: float
    C: float
    gamma: float
    info: LawInfo | None = field(default=None, compare=False)
    """The published law this one comes from (checked for extrapolation), if any."""

    def __post_init__(self) -> None:
        check_positive(self, ("B", "beta", "C", "gamma"))

    @classmethod
    def from_optimal_batch(
        cls,
        coefficient: float,
        exponent: float,
        beta_plus_gamma: float,
        *,
        info: LawInfo | None = None,
    ) -> BatchLaw:
        """The law whose optimal batch is ``coefficient x D^exponent`` tokens.

        ``exponent = gamma / (beta + gamma)`` and ``beta_plus_gamma`` split the sum of the
        exponents; ``B = 1`` and ``C = beta / (gamma coefficient^(beta + gamma))``.
        """
        k = _positive_float(coefficient, "coefficient")
        r = _positive_float(exponent, "exponent")
        s = _positive_float(beta_plus_gamma, "beta_plus_gamma")
        if r >= 1:
            raise InvalidValueError(f"exponent must be below 1 (gamma / (beta + gamma)), got {r}")
        beta, gamma = (1 - r) * s, r * s
        return cls(B=1.0, beta=beta, C=beta / (gamma * k**s), gamma=gamma, info=info)

    @classmethod
    def published(cls, name: str = "schaipp-2026") -> BatchLaw:
        """A published law by its name in :data:`~tokenbatch.scaling.LAWS` (three-term laws).

        ``"schaipp-2026"``: Schaipp's three-term law, ``M* = 0.667 D^0.566`` tokens; see
        its :class:`LawInfo` for the source, what could be checked and the fitted range.
        """
        info = LAWS.get(name)
        if info is None or "beta_plus_gamma" not in info.coefficients:
            known = [key for key, law in LAWS.items() if "beta_plus_gamma" in law.coefficients]
            raise InvalidValueError(f"no published three-term law {name!r}; known: {known}")
        k = info.coefficients
        return cls.from_optimal_batch(
            k["batch_coefficient"], k["batch_exponent"], k["beta_plus_gamma"], info=info
        )

    # -- the batch at a token budget ---------------------------------------------------

    def loss(self, batch_tokens: Any, tokens: Any) -> Any:
        """Reducible loss ``B / M^beta + C / (D / M)^gamma`` (broadcasts over arrays)."""
        m = np.asarray(batch_tokens, dtype=np.float64)
        d = np.asarray(tokens, dtype=np.float64)
        value = self.B / m**self.beta + self.C / (d / m) ** self.gamma
        return float(value) if np.ndim(value) == 0 else value

    @property
    def batch_exponent(self) -> float:
        """Exponent of the optimal batch in tokens: ``gamma / (beta + gamma)``."""
        return self.gamma / (self.beta + self.gamma)

    def _optimal(self, tokens: Any) -> Any:
        ratio = self.beta * self.B / (self.gamma * self.C)
        value = ratio ** (1 / (self.beta + self.gamma)) * np.asarray(tokens, dtype=np.float64) ** (
            self.batch_exponent
        )
        return float(value) if np.ndim(value) == 0 else value

    def _optimal_loss(self, tokens: float) -> float:
        return float(self.loss(self._optimal(tokens), tokens))

    def _tokens(self, tokens: float) -> float:
        d = _positive_float(tokens, "tokens")
        if self.info is not None:
            self.info.check(tokens=d)
        return d

    def optimal_batch(self, tokens: float) -> float:
        """Loss-optimal batch in tokens for a budget of ``tokens`` tokens.

        ``M* = (beta B / (gamma C))^(1 / (beta + gamma)) D^(gamma / (beta + gamma))``,
        independent of the model size. Warns (:class:`ExtrapolationWarning`) outside the
        token range of a published law.
        """
        return float(self._optimal(self._tokens(tokens)))

    def token_fraction(self, batch_tokens: Any, tokens: float) -> Any:
        """The fraction ``phi`` of ``tokens`` with which the optimal batch matches the loss
        of ``batch_tokens``: ``L(M, D) = L(M*, phi D)``.

        1 at the optimum, below it elsewhere; a batch is ``eps``-suboptimal in the paper's
        sense when ``phi >= 1 - eps``. Scale-free: the same for any ``B`` and ``C`` with
        the same ratio. Broadcasts over ``batch_tokens``.
        """
        d = _positive_float(tokens, "tokens")
        # L(M*(D), D) falls as D^(-beta gamma / (beta + gamma)).
        decay = self.beta * self.gamma / (self.beta + self.gamma)
        ratio = np.asarray(self.loss(batch_tokens, d)) / self._optimal_loss(d)
        value = ratio ** (-1 / decay)
        return float(value) if np.ndim(value) == 0 else value

    def near_optimal_range(
        self,
        tokens: float,
        tolerance: float = 0.05,
        *,
        definition: RangeDefinition = "paper",
    ) -> tuple[float, float]:
        """The batches (in tokens) within ``tolerance`` of the optimum for ``tokens``.

        ``definition="paper"`` (Schaipp 2026): a batch is ``tolerance``-suboptimal when its
        loss with ``D`` tokens is no worse than the optimal batch's with
        ``(1 - tolerance) D`` tokens (:meth:`token_fraction` at least ``1 - tolerance``);
        the range depends only on ``beta``, ``gamma`` and ``tolerance``, about 4x wide at
        5% for the published exponents.

        ``definition="extra_tokens"``: the batches that reach the optimal batch's loss for
        ``D`` with at most ``(1 + tolerance) D`` tokens (compute, at a fixed model). A
        slightly different question: at 5% its ends differ from the paper's by 1-5%.
        """
        d = self._tokens(tokens)
        eps = _positive_float(tolerance, "tolerance")
        best = self._optimal(d)
        outside: Callable[[float], bool]
        if definition == "paper":
            if eps >= 1:
                raise InvalidValueError(f"tolerance must be below 1, got {eps}")
            worst = self._optimal_loss((1 - eps) * d)

            def outside(log_batch: float) -> bool:
                return bool(self.loss(math.exp(log_batch), d) > worst)

        elif definition == "extra_tokens":
            reducible = self._optimal_loss(d)
            budget = (1 + eps) * d

            def outside(log_batch: float) -> bool:
                return self.tokens_to_reach(math.exp(log_batch), reducible) > budget

        else:
            raise InvalidValueError(
                f"definition must be 'paper' or 'extra_tokens', got {definition!r}"
            )
        log_best = math.log(best)
        return math.exp(_edge(outside, log_best, -1.0)), math.exp(_edge(outside, log_best, 1.0))

    # -- steps and tokens to reach a loss ----------------------------------------------

    def tokens_to_reach(self, batch_tokens: float, reducible: float) -> float:
        """Tokens a run at ``batch_tokens`` needs to bring the reducible loss to ``reducible``
        (infinite when the batch term alone is above it)."""
        batch = _positive_float(batch_tokens, "batch_tokens")
        left = _positive_float(reducible, "reducible") - self.B / batch**self.beta
        if left <= 0:
            return math.inf
        return float(batch * (self.C / left) ** (1 / self.gamma))

    def min_steps(self, reducible: float) -> float:
        """Fewest optimizer steps that reach ``reducible`` (an infinite batch): ``S_min``."""
        return float((self.C / _positive_float(reducible, "reducible")) ** (1 / self.gamma))

    def min_tokens_batch(self, reducible: float) -> float:
        """The batch reaching ``reducible`` with the fewest tokens: there, 1% more batch
        saves 1% of the steps. It is the loss-optimal batch of the budget it needs."""
        share = (self.beta + self.gamma) / self.gamma
        return float((self.B * share / _positive_float(reducible, "reducible")) ** (1 / self.beta))

    def min_tokens(self, reducible: float) -> float:
        """Fewest tokens that reach ``reducible`` (at :meth:`min_tokens_batch`): ``E_min``."""
        return self.tokens_to_reach(self.min_tokens_batch(reducible), reducible)

    def critical_batch(self, reducible: float) -> float:
        """The critical batch for ``reducible``, on this law's own steps-tokens trade-off.

        Reaching a loss at a larger batch takes fewer steps and more tokens. The critical
        batch is where that trade is even: 1% more batch saves 0.5% of the steps and costs
        0.5% more tokens (``d ln K / d ln M = -1/2``), which is also the batch needing the
        smallest product steps x tokens (time x compute). Below it each step saved costs
        less than a step's worth of tokens; above it, more. Closed form:
        ``(B (2 beta + gamma) / (gamma R))^(1 / beta)``,
        ``((2 beta + gamma) / (beta + gamma))^(1 / beta)`` times :meth:`min_tokens_batch`.

        On McCandlish et al.'s hyperbolic trade-off this is their critical batch (there,
        steps and tokens are both twice their minimum); this law's trade-off is not that
        curve, see :meth:`mccandlish_critical_batch`.
        """
        share = (2 * self.beta + self.gamma) / self.gamma
        return float((self.B * share / _positive_float(reducible, "reducible")) ** (1 / self.beta))

    def mccandlish_critical_batch(self, reducible: float) -> float:
        """McCandlish et al.'s critical batch ``E_min / S_min`` for ``reducible``.

        Their definition assumes the hyperbola ``(S / S_min - 1)(E / E_min - 1) = 1``. On
        this law steps fall towards ``S_min`` only slowly (``S_min`` needs an infinite
        batch), so at ``E_min / S_min`` a run needs several times the minimum steps *and*
        tokens; kept for comparison with work that uses it.
        """
        return self.min_tokens(reducible) / self.min_steps(reducible)

    def critical_tokens(self, batch_tokens: float) -> float:
        """Tokens after which ``batch_tokens`` is no longer above the critical batch.

        The loss a run at batch ``b`` has reached after ``T`` tokens falls as ``T`` grows,
        and the critical batch of that loss grows; from
        ``T = b (gamma C b^beta / (2 beta B))^(1 / gamma)`` on it is at least ``b``. That is
        ``2^(-1/gamma)`` of the tokens for which ``b`` is the optimal batch (about 1/300
        for the published exponents). A ramp that starts each batch there never trains
        above the critical batch.
        """
        b = _positive_float(batch_tokens, "batch_tokens")
        steps = (self.gamma * self.C * b**self.beta / (2 * self.beta * self.B)) ** (1 / self.gamma)
        return float(b * steps)

    def critical_batch_after(self, tokens: Any) -> Any:
        """The largest batch that is not above the critical batch after ``tokens`` tokens,
        the inverse of :meth:`critical_tokens`: what a ramp shaped by the law may use then.

        It is the optimal batch for ``2^(1/gamma)`` times ``tokens`` (about 300 times, for
        the published exponents). Broadcasts over ``tokens``.
        """
        return self._optimal(np.asarray(tokens, dtype=np.float64) * 2 ** (1 / self.gamma))


def _bisect(too_costly: Any, outside: float, inside: float, rounds: int = 200) -> float:
    """Boundary between ``outside`` (too costly) and ``inside`` (affordable), in log space."""
    for _ in range(rounds):
        middle = 0.5 * (outside + inside)
        if too_costly(middle):
            outside = middle
        else:
            inside = middle
        if abs(outside - inside) < 1e-12:
            break
    return inside
