"""Scaling laws for choosing the batch size instead of guessing it.

* :class:`ThreeTermLaw`: ``L(N, M, K) = E + A / N^alpha + B / M^beta + C / K^gamma`` with
  ``N`` parameters, ``M`` the batch in tokens and ``K`` optimizer steps (tokens
  ``D = M K``), fitted robustly to runs that include suboptimal batch sizes; it gives the
  loss-optimal batch for a token budget, the range of near-optimal batches, the critical
  batch and the fewest steps and tokens that reach a target loss.
* Published laws with their units and the range they were fitted on:
  :func:`deepseek_llm`, :func:`step_law`, :func:`kaplan_critical_batch`, and McCandlish
  et al.'s steps/tokens trade-off :func:`mccandlish_tradeoff`.
* :func:`recommend`: a batch size in tokens for a model and token budget, the steps it
  implies and a ramp suggestion, warning with :class:`ExtrapolationWarning` when the law
  is used outside the data it was fitted on.

Only numpy is needed: the fit is a Levenberg-Marquardt iteration on the Huber loss of
log-loss residuals (iteratively reweighted), started from several points.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.schedule import LinearRamp

__all__ = [
    "LAWS",
    "ExtrapolationWarning",
    "LawInfo",
    "Recommendation",
    "ThreeTermLaw",
    "deepseek_llm",
    "kaplan_critical_batch",
    "mccandlish_tradeoff",
    "recommend",
    "step_law",
]

_F64 = npt.NDArray[np.float64]
FloatArrayLike = Sequence[float] | npt.NDArray[Any]


class ExtrapolationWarning(UserWarning):
    """A published law is evaluated outside the range of data it was fitted on."""


@dataclass(frozen=True)
class LawInfo:
    """What a published law is, in which units, and where it was fitted."""

    name: str
    reference: str
    formula: str
    units: str
    validity: dict[str, tuple[float, float]]
    """Variable name -> (low, high) of the data the law was fitted on (approximate)."""

    def check(self, **values: float) -> list[str]:
        """Warn (:class:`ExtrapolationWarning`) for each value outside its fitted range.

        Returns the warning messages.
        """
        messages = []
        for name, value in values.items():
            low, high = self.validity[name]
            if not low <= value <= high:
                messages.append(
                    f"{self.name}: {name}={value:.3g} is outside the range the law was fitted "
                    f"on ({low:.3g} to {high:.3g}); the result is an extrapolation"
                )
        for message in messages:
            warnings.warn(message, ExtrapolationWarning, stacklevel=3)
        return messages


LAWS: dict[str, LawInfo] = {
    "deepseek": LawInfo(
        name="DeepSeek LLM (2024)",
        reference="Bi et al., DeepSeek LLM: Scaling Open-Source Language Models with "
        "Longtermism, arXiv:2401.02954",
        formula="B_opt = 0.2920 C^0.3271, lr_opt = 0.3118 C^-0.1250",
        units="C: compute in FLOPs, C = M D with M the non-embedding FLOPs per token "
        "(6 N plus attention) and D tokens; B_opt in tokens",
        validity={"compute": (1e17, 2e19)},
    ),
    "step": LawInfo(
        name="Step Law (2025)",
        reference="Li et al., Predictable Scale: Part I, Step Law - Optimal Hyperparameter "
        "Scaling Law in Large Language Model Pre-training, arXiv:2503.04715",
        formula="B_opt = 0.58 D^0.571, lr_opt = 1.79 N^-0.713 D^0.307",
        units="N: non-embedding parameters; D: training tokens; B_opt in tokens",
        validity={"n_params": (6e7, 1.1e9), "tokens": (2e9, 1.1e11)},
    ),
    "kaplan": LawInfo(
        name="Kaplan et al. (2020) critical batch",
        reference="Kaplan et al., Scaling Laws for Neural Language Models, arXiv:2001.08361",
        formula="B_crit(L) = B* / L^(1/alpha_B), B* = 2e8 tokens, alpha_B = 0.21",
        units="L: loss in nats per token (their WebText2 tokenizer); B_crit in tokens",
        validity={"loss": (2.5, 6.0)},
    ),
}
"""The published laws this module implements, with units and fitted ranges."""


def _positive_float(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidTypeError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise InvalidValueError(f"{name} must be a finite positive number, got {value!r}")
    return number


def deepseek_llm(compute: float) -> tuple[float, float]:
    """DeepSeek LLM's optimal ``(batch in tokens, learning rate)`` for ``compute`` FLOPs.

    ``B_opt = 0.2920 C^0.3271`` and ``lr_opt = 0.3118 C^-0.1250`` with ``C = M D``, ``M``
    the non-embedding FLOPs per token (about ``6 N`` plus attention) and ``D`` tokens.
    Warns (:class:`ExtrapolationWarning`) outside the compute range it was fitted on.
    """
    c = _positive_float(compute, "compute")
    LAWS["deepseek"].check(compute=c)
    return 0.2920 * c**0.3271, 0.3118 * c**-0.1250


def step_law(n_params: float, tokens: float) -> tuple[float, float]:
    """Step Law's optimal ``(batch in tokens, learning rate)``.

    ``B_opt = 0.58 D^0.571`` and ``lr_opt = 1.79 N^-0.713 D^0.307``, ``N`` non-embedding
    parameters, ``D`` training tokens. Warns outside the range it was fitted on.
    """
    n = _positive_float(n_params, "n_params")
    d = _positive_float(tokens, "tokens")
    LAWS["step"].check(n_params=n, tokens=d)
    return 0.58 * d**0.571, 1.79 * n**-0.713 * d**0.307


def kaplan_critical_batch(loss: float) -> float:
    """Kaplan et al.'s critical batch in tokens at ``loss`` (nats per token).

    ``B_crit(L) = B* / L^(1/alpha_B)`` with ``B* = 2e8`` tokens and ``alpha_B = 0.21``.
    """
    value = _positive_float(loss, "loss")
    LAWS["kaplan"].check(loss=value)
    return float(2e8 / value ** (1 / 0.21))


def mccandlish_tradeoff(batch: float, critical_batch: float) -> tuple[float, float]:
    """McCandlish et al.'s trade-off ``(S / S_min - 1)(E / E_min - 1) = 1``.

    Returns ``(S / S_min, E / E_min)``: how many more optimizer steps and how many more
    tokens than the minimum a run at ``batch`` needs to reach the same loss, with
    ``S / S_min = 1 + B_crit / B`` and ``E / E_min = 1 + B / B_crit``. At the critical
    batch both are 2.
    """
    b = _positive_float(batch, "batch")
    crit = _positive_float(critical_batch, "critical_batch")
    return 1.0 + crit / b, 1.0 + b / crit


# ---------------------------------------------------------------------------------------
# The three-term law
# ---------------------------------------------------------------------------------------

_PARAMS = ("E", "A", "alpha", "B", "beta", "C", "gamma")
_MIN_RUNS = 10


def _as_positive_array(values: Any, name: str) -> _F64:
    array = np.asarray(values)
    if array.dtype.kind not in "iuf" or array.dtype == np.bool_:
        raise InvalidTypeError(f"{name} must be numbers, got dtype {array.dtype}")
    result = np.asarray(array, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(result)) or np.any(result <= 0):
        position = int(np.argmax(~np.isfinite(result) | (result <= 0)))
        raise InvalidValueError(
            f"{name}[{position}] = {result[position]!r} is not a finite positive number"
        )
    return result


def _huber(residuals: _F64, delta: float) -> float:
    absolute = np.abs(residuals)
    quadratic = np.minimum(absolute, delta)
    return float(np.sum(0.5 * quadratic**2 + delta * (absolute - quadratic)))


def _log_prediction(theta: _F64, logs: _F64) -> tuple[_F64, _F64]:
    """Log of the predicted loss and its Jacobian for parameters ``theta``.

    ``theta = (log E, log A, alpha, log B, beta, log C, gamma)``; ``logs`` holds ln N,
    ln M and ln K as rows.
    """
    log_n, log_m, log_k = logs
    terms = np.stack(
        [
            np.full_like(log_n, theta[0]),
            theta[1] - theta[2] * log_n,
            theta[3] - theta[4] * log_m,
            theta[5] - theta[6] * log_k,
        ]
    )
    top = terms.max(axis=0)
    weights = np.exp(terms - top)
    total = weights.sum(axis=0)
    log_pred = top + np.log(total)
    share = weights / total
    jacobian = np.stack(
        [
            share[0],
            share[1],
            -share[1] * log_n,
            share[2],
            -share[2] * log_m,
            share[3],
            -share[3] * log_k,
        ],
        axis=1,
    )
    return log_pred, jacobian


def _levenberg_marquardt(
    theta: _F64, logs: _F64, log_loss: _F64, delta: float, max_iter: int
) -> tuple[_F64, float]:
    """Minimise the Huber loss of log residuals from ``theta`` (IRLS + damping)."""
    log_pred, jacobian = _log_prediction(theta, logs)
    residuals = log_pred - log_loss
    objective = _huber(residuals, delta)
    damping = 1e-3
    for _ in range(max_iter):
        absolute = np.abs(residuals)
        weights = np.where(absolute <= delta, 1.0, delta / np.maximum(absolute, 1e-300))
        gradient = jacobian.T @ (weights * residuals)
        hessian = jacobian.T @ (jacobian * weights[:, None])
        diagonal = np.diag(hessian).copy()
        improved = False
        while damping < 1e12:
            system = hessian + damping * np.diag(diagonal + 1e-12)
            try:
                step = np.linalg.solve(system, -gradient)
            except np.linalg.LinAlgError:
                damping *= 10
                continue
            candidate = theta + step
            candidate[[2, 4, 6]] = np.clip(candidate[[2, 4, 6]], 1e-4, 5.0)
            new_pred, new_jacobian = _log_prediction(candidate, logs)
            new_residuals = new_pred - log_loss
            new_objective = _huber(new_residuals, delta)
            if np.isfinite(new_objective) and new_objective < objective:
                decrease = objective - new_objective
                theta, jacobian, residuals = candidate, new_jacobian, new_residuals
                objective = new_objective
                damping = max(damping / 3, 1e-12)
                improved = True
                break
            damping *= 4
        if not improved or decrease <= 1e-14 * max(objective, 1e-300):
            break
    return theta, objective


@dataclass(frozen=True)
class ThreeTermLaw:
    """``L(N, M, K) = E + A / N^alpha + B / M^beta + C / K^gamma``.

    ``N``: parameters; ``M``: global batch in tokens; ``K``: optimizer steps; tokens
    ``D = M K``. At a fixed token budget a larger batch means fewer steps, so the loss
    has an optimal batch :meth:`optimal_batch`. Build one from known coefficients or fit
    it to runs with :meth:`fit`.
    """

    E: float
    A: float
    alpha: float
    B: float
    beta: float
    C: float
    gamma: float
    fit_loss: float | None = field(default=None, compare=False)
    """Huber objective at the fitted parameters (``None`` when not fitted)."""

    def __post_init__(self) -> None:
        for name in _PARAMS:
            _positive_float(getattr(self, name), name)

    # -- evaluation --------------------------------------------------------------------

    def loss(self, n_params: Any, batch_tokens: Any, steps: Any) -> Any:
        """Predicted loss (broadcasts over numpy arrays)."""
        n = np.asarray(n_params, dtype=np.float64)
        m = np.asarray(batch_tokens, dtype=np.float64)
        k = np.asarray(steps, dtype=np.float64)
        value = self.E + self.A / n**self.alpha + self.B / m**self.beta + self.C / k**self.gamma
        return float(value) if np.ndim(value) == 0 else value

    @property
    def batch_exponent(self) -> float:
        """Exponent of the optimal batch in tokens: ``gamma / (beta + gamma)``."""
        return self.gamma / (self.beta + self.gamma)

    def optimal_batch(self, tokens: float) -> float:
        """Loss-optimal batch in tokens for a budget of ``tokens`` tokens.

        ``M_opt = (beta B / (gamma C))^(1 / (beta + gamma)) D^(gamma / (beta + gamma))``,
        independent of the model size.
        """
        d = _positive_float(tokens, "tokens")
        ratio = self.beta * self.B / (self.gamma * self.C)
        return float(ratio ** (1 / (self.beta + self.gamma)) * d**self.batch_exponent)

    def _batch_and_steps_loss(self, batch: float, tokens: float) -> float:
        return float(self.B / batch**self.beta + self.C / (tokens / batch) ** self.gamma)

    def _tokens_to_reach(self, batch: float, reducible: float) -> float:
        """Tokens a run at ``batch`` needs to bring the batch+steps terms to ``reducible``."""
        left = reducible - self.B / batch**self.beta
        if left <= 0:
            return math.inf
        return float(batch * (self.C / left) ** (1 / self.gamma))

    def near_optimal_range(self, tokens: float, extra_compute: float = 0.05) -> tuple[float, float]:
        """Batches (in tokens) that reach the optimal loss for ``tokens`` with at most
        ``extra_compute`` (a fraction) more tokens than the optimal batch needs.

        At a fixed model, compute is proportional to tokens, so this is the batch range
        that costs at most ``1 + extra_compute`` times the compute of the optimum.
        """
        d = _positive_float(tokens, "tokens")
        extra = _positive_float(extra_compute, "extra_compute")
        best = self.optimal_batch(d)
        reducible = self._batch_and_steps_loss(best, d)
        budget = (1 + extra) * d

        def too_costly(log_batch: float) -> bool:
            return self._tokens_to_reach(math.exp(log_batch), reducible) > budget

        log_best = math.log(best)
        # Below the optimum: the batch term alone reaches `reducible` at this batch.
        floor = math.log((self.B / reducible) ** (1 / self.beta))
        low = _bisect(too_costly, floor, log_best)
        high_edge = log_best + 1.0
        while not too_costly(high_edge):
            high_edge += 1.0
            if high_edge > log_best + 200:
                break
        high = _bisect(too_costly, high_edge, log_best)
        return math.exp(low), math.exp(high)

    def _reducible(self, target_loss: float, n_params: float) -> float:
        loss = _positive_float(target_loss, "target_loss")
        n = _positive_float(n_params, "n_params")
        floor = self.E + self.A / n**self.alpha
        if loss <= floor:
            raise InvalidValueError(
                f"target_loss={loss:.6g} is not reachable with n_params={n:.4g}: the law "
                f"bottoms out at E + A/N^alpha = {floor:.6g}"
            )
        return float(loss - floor)

    def min_steps(self, target_loss: float, n_params: float) -> float:
        """Fewest optimizer steps that reach ``target_loss`` (infinite batch): ``S_min``."""
        reducible = self._reducible(target_loss, n_params)
        return float((self.C / reducible) ** (1 / self.gamma))

    def min_tokens_batch(self, target_loss: float, n_params: float) -> float:
        """The batch (in tokens) that reaches ``target_loss`` with the fewest tokens."""
        reducible = self._reducible(target_loss, n_params)
        share = (self.beta + self.gamma) / self.gamma
        return float((self.B * share / reducible) ** (1 / self.beta))

    def min_tokens(self, target_loss: float, n_params: float) -> float:
        """Fewest tokens that reach ``target_loss`` (at :meth:`min_tokens_batch`): ``E_min``."""
        reducible = self._reducible(target_loss, n_params)
        batch = self.min_tokens_batch(target_loss, n_params)
        return self._tokens_to_reach(batch, reducible)

    def critical_batch(self, target_loss: float, n_params: float) -> float:
        """Critical batch in tokens at ``target_loss``: ``E_min / S_min`` (McCandlish).

        Below it, doubling the batch nearly halves the steps; above it, returns diminish.
        For this law it equals ``min_tokens_batch x ((beta + gamma) / beta)^(1 / gamma)``.
        """
        return self.min_tokens(target_loss, n_params) / self.min_steps(target_loss, n_params)

    # -- fitting -----------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        n_params: FloatArrayLike,
        batch_tokens: FloatArrayLike,
        steps: FloatArrayLike,
        loss: FloatArrayLike,
        *,
        huber_delta: float = 1e-3,
        n_starts: int = 24,
        seed: int = 0,
        max_iter: int = 300,
    ) -> ThreeTermLaw:
        """Fit the law to runs ``(N, M, K) -> loss``.

        Minimises the Huber loss (``huber_delta``) of ``log(predicted) - log(loss)``, which
        keeps a few diverged or badly tuned runs from dragging the fit, with a damped
        Gauss-Newton (Levenberg-Marquardt) iteration from ``n_starts`` starting points
        (a deterministic spread, then ``seed``-ed random ones); the best fit wins.

        Needs at least 10 runs and at least 3 distinct values of each of ``N``, ``M`` and
        ``K`` (with fewer, an exponent is not determined by the data).
        """
        n = _as_positive_array(n_params, "n_params")
        m = _as_positive_array(batch_tokens, "batch_tokens")
        k = _as_positive_array(steps, "steps")
        observed = _as_positive_array(loss, "loss")
        sizes = {len(n), len(m), len(k), len(observed)}
        if len(sizes) != 1:
            raise InvalidValueError(
                f"n_params, batch_tokens, steps and loss must have the same length, got "
                f"{len(n)}, {len(m)}, {len(k)} and {len(observed)}"
            )
        if len(n) < _MIN_RUNS:
            raise InvalidValueError(
                f"fitting 7 coefficients needs at least {_MIN_RUNS} runs, got {len(n)}"
            )
        for name, values in (("n_params", n), ("batch_tokens", m), ("steps", k)):
            distinct = len(np.unique(values))
            if distinct < 3:
                raise InvalidValueError(
                    f"{name} takes {distinct} distinct value(s); at least 3 are needed to "
                    f"determine its exponent (the data is degenerate)"
                )
        delta = _positive_float(huber_delta, "huber_delta")
        starts_count = as_int(n_starts, "n_starts", minimum=1)
        iterations = as_int(max_iter, "max_iter", minimum=1)
        logs = np.log(np.stack([n, m, k]))
        log_loss = np.log(observed)
        best: tuple[float, _F64] | None = None
        for theta in _starting_points(observed, logs, starts_count, as_int(seed, "seed")):
            fitted, objective = _levenberg_marquardt(theta, logs, log_loss, delta, iterations)
            if np.all(np.isfinite(fitted)) and (best is None or objective < best[0]):
                best = (objective, fitted)
        if best is None:
            raise InvalidValueError("the fit did not converge from any starting point")
        objective, theta = best
        return cls(
            E=float(np.exp(theta[0])),
            A=float(np.exp(theta[1])),
            alpha=float(theta[2]),
            B=float(np.exp(theta[3])),
            beta=float(theta[4]),
            C=float(np.exp(theta[5])),
            gamma=float(theta[6]),
            fit_loss=objective,
        )


def _starting_points(observed: _F64, logs: _F64, count: int, seed: int) -> list[_F64]:
    """A deterministic spread of initial parameters, then random ones around it.

    Each term starts as a share of the smallest observed loss at the geometric middle of
    its variable, so the starts are on the right scale whatever the units.
    """
    floor = float(np.min(observed))
    middles = logs.mean(axis=1)
    points = []
    shares = [(0.7, 0.1, 0.1, 0.1), (0.4, 0.2, 0.2, 0.2), (0.85, 0.05, 0.05, 0.05)]
    exponents = [(0.3, 0.3, 0.3), (0.6, 0.2, 0.5), (0.2, 0.5, 0.2)]
    for share in shares:
        for exps in exponents:
            points.append(_theta_from(floor, share, exps, middles))
    rng = np.random.default_rng(seed)
    while len(points) < count:
        raw = rng.dirichlet(np.ones(4) * 2.0)
        drawn = tuple(float(x) for x in rng.uniform(0.05, 1.0, size=3))
        points.append(_theta_from(floor, tuple(float(x) for x in raw), drawn, middles))
    return points[:count]


def _theta_from(
    floor: float, share: tuple[float, ...], exps: tuple[float, ...], middles: _F64
) -> _F64:
    alpha, beta, gamma = exps
    return np.array(
        [
            math.log(floor * share[0]),
            math.log(floor * share[1]) + alpha * middles[0],
            alpha,
            math.log(floor * share[2]) + beta * middles[1],
            beta,
            math.log(floor * share[3]) + gamma * middles[2],
            gamma,
        ]
    )


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


# ---------------------------------------------------------------------------------------
# Recommendation
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recommendation:
    """A batch size chosen from a published law, and what it implies."""

    batch_tokens: int
    """Global batch in tokens, rounded to ``multiple_of`` (the law's value is ``raw``)."""
    raw_batch_tokens: float
    """The law's batch before rounding."""
    learning_rate: float
    """The law's learning rate at that batch."""
    steps: int
    """Optimizer steps for the token budget at ``batch_tokens`` (partial batch dropped)."""
    tokens: int
    n_params: float
    law: str
    formula: str
    validity: dict[str, tuple[float, float]]
    extrapolation: list[str]
    """Messages for each input outside the law's fitted range (empty when inside)."""
    ramp: LinearRamp | None
    """A suggested warm-up ramp in tokens (a heuristic, see :func:`recommend`)."""

    def summary(self) -> dict[str, Any]:
        """A flat dict for printing."""
        return {
            "law": self.law,
            "formula": self.formula,
            "n_params": self.n_params,
            "tokens": self.tokens,
            "batch_tokens": self.batch_tokens,
            "raw_batch_tokens": self.raw_batch_tokens,
            "learning_rate": self.learning_rate,
            "steps": self.steps,
            "ramp": repr(self.ramp) if self.ramp is not None else "none",
            "extrapolating": bool(self.extrapolation),
        }


def recommend(
    n_params: float,
    tokens: int,
    *,
    law: Literal["step", "deepseek"] = "step",
    multiple_of: int | None = None,
    ramp_fraction: float = 0.03,
    ramp_start_ratio: float = 0.2,
) -> Recommendation:
    """Recommend a global batch in tokens for ``n_params`` parameters and ``tokens`` tokens.

    ``law="step"`` uses :func:`step_law` (``N`` non-embedding parameters, ``D`` tokens);
    ``law="deepseek"`` uses :func:`deepseek_llm` with ``C = 6 N D`` (their ``M`` counts
    attention FLOPs too, so this slightly underestimates ``C``). The batch is rounded to
    the nearest multiple of ``multiple_of`` tokens (e.g. micro-batch tokens x DP), at
    least one multiple. Inputs outside the law's fitted range raise an
    :class:`ExtrapolationWarning` and are listed in ``extrapolation``.

    The ramp is a heuristic, not part of either law: start at ``ramp_start_ratio`` of the
    batch and reach it after ``ramp_fraction`` of the tokens, linear in tokens (DeepSeek-V3
    went from 1/5 of its batch over the first 3.2% of its tokens; GPT-3 from 1% over
    1.3-4%). No ramp is suggested when it would not change the batch.
    """
    n = _positive_float(n_params, "n_params")
    total = as_int(tokens, "tokens", minimum=1)
    grid = 1 if multiple_of is None else as_int(multiple_of, "multiple_of", minimum=1)
    fraction = _positive_float(ramp_fraction, "ramp_fraction")
    start_ratio = _positive_float(ramp_start_ratio, "ramp_start_ratio")
    if fraction >= 1 or start_ratio > 1:
        raise InvalidValueError("ramp_fraction must be < 1 and ramp_start_ratio <= 1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExtrapolationWarning)
        if law == "step":
            raw, lr = step_law(n, total)
        elif law == "deepseek":
            raw, lr = deepseek_llm(6.0 * n * total)
        else:
            raise InvalidValueError(f"law must be 'step' or 'deepseek', got {law!r}")
    messages = [str(w.message) for w in caught if issubclass(w.category, ExtrapolationWarning)]
    for message in messages:
        warnings.warn(message, ExtrapolationWarning, stacklevel=2)
    info = LAWS[law]
    batch = max(grid, round(raw / grid) * grid)
    steps = total // batch
    start = max(grid, int(batch * start_ratio) // grid * grid)
    ramp_tokens = int(total * fraction)
    ramp = None
    if start < batch and ramp_tokens > 0:
        ramp = LinearRamp(start, batch, ramp_tokens, unit="tokens", multiple_of=grid)
    return Recommendation(
        batch_tokens=batch,
        raw_batch_tokens=raw,
        learning_rate=lr,
        steps=steps,
        tokens=total,
        n_params=n,
        law=info.name,
        formula=info.formula,
        validity=dict(info.validity),
        extrapolation=messages,
        ramp=ramp,
    )
