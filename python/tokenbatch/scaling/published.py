"""Published scaling laws for the batch size and learning rate, as data: coefficients,
units, fitted ranges and sources."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tokenbatch.errors import InvalidTypeError, InvalidValueError

__all__ = [
    "LAWS",
    "ExtrapolationWarning",
    "LawInfo",
    "LawPoint",
    "deepseek_llm",
    "kaplan_critical_batch",
    "kaplan_loss",
    "law_values",
    "mccandlish_tradeoff",
    "porian_law",
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
    mixture_of_experts: bool = False
    """Whether the source fitted or checked the law on mixture-of-experts models too."""

    def out_of_range(self, **values: float) -> list[tuple[str, float, float, float]]:
        """``(variable, value, low, high)`` for each value outside its fitted range."""
        ranges = ((name, value, *self.validity[name]) for name, value in values.items())
        return [item for item in ranges if not item[2] <= item[1] <= item[3]]

    def outside(self, **values: float) -> list[str]:
        """One message for each value outside the range the law was fitted on."""
        return [
            f"{self.name}: {name}={value:.3g} is outside the range the law was fitted on "
            f"({low:.3g} to {high:.3g}); the result is an extrapolation"
            for name, value, low, high in self.out_of_range(**values)
        ]

    def check(self, **values: float) -> list[str]:
        """Warn (:class:`ExtrapolationWarning`) for each value outside its fitted range.

        Returns the warning messages (those of :meth:`outside`).
        """
        messages = self.outside(**values)
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
        runs=3700,
        source="Eq. 8 of the paper (arXiv:2503.04715v7): grid searches over learning rate and "
        "batch for about 3,700 runs of 60M to 1B non-embedding parameters; the abstract "
        "reports that the law holds for mixture-of-experts models and other data recipes.",
        mixture_of_experts=True,
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
        source="Eq. 1 of the paper (section 3.1): fitted on runs with compute budgets of 1e17 "
        "to 2e19 FLOPs (near-optimal runs within 0.25% of the best loss), validated at 1e20.",
    ),
    "porian": LawInfo(
        name="Porian et al. (2024)",
        reference="Porian et al., Resolving Discrepancies in Compute-Optimal Scaling of "
        "Language Models, arXiv:2406.19146",
        formula="B_opt = 0.7576 N^0.703, lr_opt = 3.7 N^-0.36",
        coefficients={
            "batch_coefficient": 0.7576,
            "batch_exponent": 0.703,
            "lr_coefficient": 3.7,
            "lr_exponent": -0.36,
        },
        units={"N": "parameters (the paper counts the output layer)", "B_opt": "tokens"},
        validity={"n_params": (5e6, 9.01e8)},
        source="As tabulated in the Step Law paper (arXiv:2503.04715, Table 1), which quotes "
        "the batch as 0.00037 N^0.703 sequences of 2,048 tokens; the paper's runs span 5M to "
        "901M parameters on compute-optimal budgets (about 20 tokens per parameter), so a run "
        "with many more tokens per parameter is an extrapolation even inside that range.",
    ),
    "kaplan": LawInfo(
        name="Kaplan et al. (2020) critical batch",
        reference="Kaplan et al., Scaling Laws for Neural Language Models, arXiv:2001.08361",
        formula="B_crit(L) = B* / L^(1/alpha_B), L(N, D) = ((N_c/N)^(alpha_N/alpha_D) + "
        "D_c/D)^alpha_D",
        coefficients={
            "B_star": 2e8,
            "alpha_B": 0.21,
            "alpha_N": 0.076,
            "alpha_D": 0.103,
            "N_c": 6.4e13,
            "D_c": 1.8e13,
        },
        units={
            "L": "loss in nats per token (their WebText2 tokenizer)",
            "N": "non-embedding parameters",
            "D": "training tokens",
            "B_crit": "global batch in tokens",
        },
        validity={"loss": (2.5, 6.0), "n_params": (768.0, 1.5e9), "tokens": (2.2e7, 2.3e10)},
        source="Eq. 5.3 (B* about 2e8 tokens, alpha_B about 0.21), evaluated at the loss of "
        "Eq. 1.5 with Table 2's fit (alpha_N 0.076, alpha_D 0.103, N_c 6.4e13, D_c 1.8e13), "
        "fitted on 768 to 1.5e9 non-embedding parameters and 2.2e7 to 2.3e10 tokens. It is "
        "the batch beyond which larger batches buy little, not a loss-optimal batch.",
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


class LawPoint(NamedTuple):
    """A published law at one scale (see :func:`law_values`)."""

    inputs: dict[str, float]
    """The variables of the law's fitted range (keys of its ``validity``) at that scale."""
    batch: float
    """The law's batch in tokens."""
    lr: float | None
    """Its learning rate at that batch, ``None`` for a law of the batch alone."""

    def rate(self) -> float:
        """The learning rate, or an error for a law of the batch alone."""
        if self.lr is None:
            raise InvalidValueError("this law gives no learning rate")
        return self.lr


def law_values(name: str, *, n_params: float, tokens: float, compute: float) -> LawPoint:
    """A published law at one scale, without range checks.

    Every law gives a batch in tokens; Step Law, DeepSeek LLM's and Porian et al.'s also a
    learning rate at that batch. ``n_params`` counts non-embedding
    parameters, ``compute`` is ``M D`` (DeepSeek LLM's non-embedding FLOPs per token
    times tokens).
    """
    if name not in LAWS:
        raise InvalidValueError(f"no published law {name!r}; known: {sorted(LAWS)}")
    k = LAWS[name].coefficients
    n, d = n_params, tokens
    if name == "schaipp-2026":
        return LawPoint(
            {"n_params": n, "tokens": d}, k["batch_coefficient"] * d ** k["batch_exponent"], None
        )
    if name == "step":
        batch = k["batch_coefficient"] * d ** k["batch_exponent"]
        rate = k["lr_coefficient"] * n ** k["lr_n_exponent"] * d ** k["lr_d_exponent"]
        return LawPoint({"n_params": n, "tokens": d}, batch, rate)
    if name == "deepseek":
        batch = k["batch_coefficient"] * compute ** k["batch_exponent"]
        return LawPoint(
            {"compute": compute}, batch, k["lr_coefficient"] * compute ** k["lr_exponent"]
        )
    if name == "porian":
        batch = k["batch_coefficient"] * n ** k["batch_exponent"]
        return LawPoint({"n_params": n}, batch, k["lr_coefficient"] * n ** k["lr_exponent"])
    if name == "kaplan":
        loss = ((k["N_c"] / n) ** (k["alpha_N"] / k["alpha_D"]) + k["D_c"] / d) ** k["alpha_D"]
        batch = k["B_star"] / loss ** (1 / k["alpha_B"])
        return LawPoint({"n_params": n, "tokens": d, "loss": loss}, batch, None)
    raise InvalidValueError(f"{name!r} has no formula here")


def deepseek_llm(compute: float) -> tuple[float, float]:
    """DeepSeek LLM's optimal ``(batch in tokens, learning rate)`` for ``compute`` FLOPs.

    ``B_opt = 0.2920 C^0.3271`` and ``lr_opt = 0.3118 C^-0.1250`` with ``C = M D``, ``M``
    the non-embedding FLOPs per token (about ``6 N`` plus attention) and ``D`` tokens.
    Warns (:class:`ExtrapolationWarning`) outside the compute range it was fitted on.
    """
    c = positive_float(compute, "compute")
    LAWS["deepseek"].check(compute=c)
    point = law_values("deepseek", n_params=1.0, tokens=1.0, compute=c)
    return point.batch, point.rate()


def step_law(n_params: float, tokens: float) -> tuple[float, float]:
    """Step Law's optimal ``(batch in tokens, learning rate)``.

    ``B_opt = 0.58 D^0.571`` and ``lr_opt = 1.79 N^-0.713 D^0.307``, ``N`` non-embedding
    parameters, ``D`` training tokens. Warns outside the range it was fitted on.
    """
    n = positive_float(n_params, "n_params")
    d = positive_float(tokens, "tokens")
    LAWS["step"].check(n_params=n, tokens=d)
    point = law_values("step", n_params=n, tokens=d, compute=6 * n * d)
    return point.batch, point.rate()


def porian_law(n_params: float) -> tuple[float, float]:
    """Porian et al.'s optimal ``(batch in tokens, learning rate)`` for ``n_params``.

    ``B_opt = 0.7576 N^0.703`` tokens and ``lr_opt = 3.7 N^-0.36``, fitted along
    compute-optimal budgets. Warns outside the model sizes it was fitted on.
    """
    n = positive_float(n_params, "n_params")
    LAWS["porian"].check(n_params=n)
    point = law_values("porian", n_params=n, tokens=1.0, compute=1.0)
    return point.batch, point.rate()


def kaplan_loss(n_params: float, tokens: float) -> float:
    """Kaplan et al.'s loss ``L(N, D)`` in nats per token (Eq. 1.5, Table 2).

    ``((N_c / N)^(alpha_N / alpha_D) + D_c / D)^alpha_D``, ``N`` non-embedding
    parameters, ``D`` tokens; in their tokenizer's nats, so only the input of their own
    critical batch (:func:`kaplan_critical_batch`). Warns outside the data it was fitted on.
    """
    n = positive_float(n_params, "n_params")
    d = positive_float(tokens, "tokens")
    LAWS["kaplan"].check(n_params=n, tokens=d)
    return law_values("kaplan", n_params=n, tokens=d, compute=6 * n * d).inputs["loss"]


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
