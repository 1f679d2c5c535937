"""Published scaling laws for the batch size, as data: coefficients, units, fitted ranges."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from tokenbatch.errors import InvalidTypeError, InvalidValueError

__all__ = [
    "LAWS",
    "ExtrapolationWarning",
    "LawInfo",
    "deepseek_llm",
    "kaplan_critical_batch",
    "mccandlish_tradeoff",
    "step_law",
]


class ExtrapolationWarning(UserWarning):
    """A published law is evaluated outside the range of data it was fitted on."""


@dataclass(frozen=True)
class LawInfo:
    """A published law: its coefficients, the units of its variables and where it was fitted."""

    name: str
    reference: str
    formula: str
    coefficients: dict[str, float]
    """The fitted constants by name (the formula's symbols)."""
    units: dict[str, str]
    """What each variable of the formula counts."""
    validity: dict[str, tuple[float, float]]
    """Variable -> (low, high) of the data the law was fitted on (``inf`` when not stated)."""
    runs: int | None = None
    """Training runs the law was fitted on, when the source says."""
    source: str = ""
    """Where the numbers come from, and what could not be checked."""
    derived: dict[str, str] = field(default_factory=dict)
    """Coefficients that are not read from the source but derived, and how."""

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
    "schaipp-2026": LawInfo(
        name="Schaipp (2026) three-term law",
        reference="Schaipp, How to Allocate Your Tokens? Scaling Laws with Training Steps and "
        "Batch Size, arXiv:2607.01487",
        formula="L = E + A/N^alpha + B/M^beta + C/K^gamma; optimal batch M* = 0.667 D^0.566",
        coefficients={
            "batch_coefficient": 0.667,
            "batch_exponent": 0.566,
            "beta_plus_gamma": 0.21372,
        },
        units={
            "N": "parameters",
            "M": "global batch in tokens",
            "K": "optimizer steps",
            "D": "training tokens, D = M K",
        },
        validity={"n_params": (5e7, 1e9), "tokens": (2e9, math.inf)},
        runs=246,
        source="As summarized from the paper: the optimal batch M* = 0.667 D^0.566 tokens, "
        "independent of the model size, fitted on 246 runs of about 0.05B to 1B parameters "
        "from 2e9 tokens, and 5%-suboptimal batches spanning about 4x. The paper's title, "
        "author and abstract were checked; its tables could not be, so the constants are "
        "unverified, and the upper end of its token range is not stated.",
        derived={
            "beta_plus_gamma": "solved so that the 5%-suboptimal range (the paper's "
            "definition) is 4.00x wide with gamma / (beta + gamma) = 0.566: beta = 0.0927, "
            "gamma = 0.1210 (the ramp and critical batch depend on them, M* does not)",
        },
    ),
    "step": LawInfo(
        name="Step Law (2025)",
        reference="Li et al., Predictable Scale: Part I, Step Law - Optimal Hyperparameter "
        "Scaling Law in Large Language Model Pre-training, arXiv:2503.04715",
        formula="B_opt = 0.58 D^0.571, lr_opt = 1.79 N^-0.713 D^0.307",
        coefficients={
            "batch_coefficient": 0.58,
            "batch_exponent": 0.571,
            "lr_coefficient": 1.79,
            "lr_n_exponent": -0.713,
            "lr_d_exponent": 0.307,
        },
        units={
            "N": "non-embedding parameters",
            "D": "training tokens",
            "B_opt": "global batch in tokens",
        },
        validity={"n_params": (6e7, 1.1e9), "tokens": (2e9, 1.1e11)},
    ),
    "deepseek": LawInfo(
        name="DeepSeek LLM (2024)",
        reference="Bi et al., DeepSeek LLM: Scaling Open-Source Language Models with "
        "Longtermism, arXiv:2401.02954",
        formula="B_opt = 0.2920 C^0.3271, lr_opt = 0.3118 C^-0.1250",
        coefficients={
            "batch_coefficient": 0.2920,
            "batch_exponent": 0.3271,
            "lr_coefficient": 0.3118,
            "lr_exponent": -0.1250,
        },
        units={
            "C": "compute in FLOPs, C = M D",
            "M": "non-embedding FLOPs per token (6 N plus attention)",
            "D": "training tokens",
            "B_opt": "global batch in tokens",
        },
        validity={"compute": (1e17, 2e19)},
    ),
    "kaplan": LawInfo(
        name="Kaplan et al. (2020) critical batch",
        reference="Kaplan et al., Scaling Laws for Neural Language Models, arXiv:2001.08361",
        formula="B_crit(L) = B* / L^(1/alpha_B)",
        coefficients={"B_star": 2e8, "alpha_B": 0.21},
        units={
            "L": "loss in nats per token (their WebText2 tokenizer)",
            "B_crit": "global batch in tokens",
        },
        validity={"loss": (2.5, 6.0)},
    ),
}
"""The published laws this module implements, by name."""


@contextmanager
def recorded_extrapolation(stacklevel: int) -> Iterator[list[str]]:
    """Collect the :class:`ExtrapolationWarning` messages raised inside, then warn them again,
    so a result can list them while users still see each one. ``stacklevel`` counts as in
    ``warnings.warn`` called by the function using this context (2: that function's caller)."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExtrapolationWarning)
        yield messages
    for warning in caught:
        if issubclass(warning.category, ExtrapolationWarning):
            messages.append(str(warning.message))
        warnings.warn(warning.message, warning.category, stacklevel=stacklevel + 2)


def positive_float(value: object, name: str) -> float:
    """``value`` as a finite positive float, or an error naming ``name``."""
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
    c = positive_float(compute, "compute")
    info = LAWS["deepseek"]
    info.check(compute=c)
    k = info.coefficients
    return k["batch_coefficient"] * c ** k["batch_exponent"], k["lr_coefficient"] * c ** k[
        "lr_exponent"
    ]


def step_law(n_params: float, tokens: float) -> tuple[float, float]:
    """Step Law's optimal ``(batch in tokens, learning rate)``.

    ``B_opt = 0.58 D^0.571`` and ``lr_opt = 1.79 N^-0.713 D^0.307``, ``N`` non-embedding
    parameters, ``D`` training tokens. Warns outside the range it was fitted on.
    """
    n = positive_float(n_params, "n_params")
    d = positive_float(tokens, "tokens")
    info = LAWS["step"]
    info.check(n_params=n, tokens=d)
    k = info.coefficients
    batch = k["batch_coefficient"] * d ** k["batch_exponent"]
    rate = k["lr_coefficient"] * n ** k["lr_n_exponent"] * d ** k["lr_d_exponent"]
    return batch, rate


def kaplan_critical_batch(loss: float) -> float:
    """Kaplan et al.'s critical batch in tokens at ``loss`` (nats per token).

    ``B_crit(L) = B* / L^(1/alpha_B)`` with ``B* = 2e8`` tokens and ``alpha_B = 0.21``.
    """
    value = positive_float(loss, "loss")
    info = LAWS["kaplan"]
    info.check(loss=value)
    return float(info.coefficients["B_star"] / value ** (1 / info.coefficients["alpha_B"]))


def mccandlish_tradeoff(batch: float, critical_batch: float) -> tuple[float, float]:
    """McCandlish et al.'s trade-off ``(S / S_min - 1)(E / E_min - 1) = 1``.

    Returns ``(S / S_min, E / E_min)``: how many more optimizer steps and how many more
    tokens than the minimum a run at ``batch`` needs to reach the same loss, with
    ``S / S_min = 1 + B_crit / B`` and ``E / E_min = 1 + B / B_crit``. At the critical
    batch both are 2.
    """
    b = positive_float(batch, "batch")
    crit = positive_float(critical_batch, "critical_batch")
    return 1.0 + crit / b, 1.0 + b / crit
