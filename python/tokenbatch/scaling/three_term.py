"""The three-term law ``L(N, M, K) = E + A/N^alpha + B/M^beta + C/K^gamma`` and its robust
fit (Levenberg-Marquardt on the Huber loss of log-loss residuals)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.scaling.batch_law import BatchLaw, RangeDefinition, check_positive
from tokenbatch.scaling.published import positive_float

__all__ = ["ThreeTermLaw"]

_F64 = npt.NDArray[np.float64]
FloatArrayLike = Sequence[float] | npt.NDArray[Any]
_positive_float = positive_float


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
    it to runs with :meth:`fit`. Everything about the batch size is in its batch terms,
    :attr:`batch_law`; the methods here take a target loss and a model size instead of a
    reducible loss.
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
        check_positive(self, _PARAMS)

    # -- evaluation --------------------------------------------------------------------

    def loss(self, n_params: Any, batch_tokens: Any, steps: Any) -> Any:
        """Predicted loss (broadcasts over numpy arrays)."""
        n = np.asarray(n_params, dtype=np.float64)
        m = np.asarray(batch_tokens, dtype=np.float64)
        k = np.asarray(steps, dtype=np.float64)
        value = self.E + self.A / n**self.alpha + self.B / m**self.beta + self.C / k**self.gamma
        return float(value) if np.ndim(value) == 0 else value

    @property
    def batch_law(self) -> BatchLaw:
        """The batch and step terms ``B / M^beta + C / K^gamma`` as a :class:`BatchLaw`."""
        return BatchLaw(B=self.B, beta=self.beta, C=self.C, gamma=self.gamma)

    @property
    def batch_exponent(self) -> float:
        """Exponent of the optimal batch in tokens: ``gamma / (beta + gamma)``."""
        return self.batch_law.batch_exponent

    def optimal_batch(self, tokens: float) -> float:
        """Loss-optimal batch in tokens for ``tokens`` tokens (:meth:`BatchLaw.optimal_batch`)."""
        return self.batch_law.optimal_batch(tokens)

    def near_optimal_range(
        self,
        tokens: float,
        tolerance: float = 0.05,
        *,
        definition: RangeDefinition = "paper",
    ) -> tuple[float, float]:
        """Batches within ``tolerance`` of the optimum; see :meth:`BatchLaw.near_optimal_range`
        for the two definitions (the paper's by default)."""
        return self.batch_law.near_optimal_range(tokens, tolerance, definition=definition)

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
        return self.batch_law.min_steps(self._reducible(target_loss, n_params))

    def min_tokens_batch(self, target_loss: float, n_params: float) -> float:
        """The batch (in tokens) that reaches ``target_loss`` with the fewest tokens."""
        return self.batch_law.min_tokens_batch(self._reducible(target_loss, n_params))

    def min_tokens(self, target_loss: float, n_params: float) -> float:
        """Fewest tokens that reach ``target_loss`` (at :meth:`min_tokens_batch`): ``E_min``."""
        return self.batch_law.min_tokens(self._reducible(target_loss, n_params))

    def critical_batch(self, target_loss: float, n_params: float) -> float:
        """Critical batch for ``target_loss`` on this law's steps-tokens trade-off: where 1%
        more batch saves 0.5% of the steps for 0.5% more tokens (:meth:`BatchLaw.critical_batch`).
        """
        return self.batch_law.critical_batch(self._reducible(target_loss, n_params))

    def mccandlish_critical_batch(self, target_loss: float, n_params: float) -> float:
        """McCandlish et al.'s ``E_min / S_min`` (:meth:`BatchLaw.mccandlish_critical_batch`)."""
        return self.batch_law.mccandlish_critical_batch(self._reducible(target_loss, n_params))

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
