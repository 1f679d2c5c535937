"""A batch size from Step Law or DeepSeek LLM's law, with a rule-of-thumb ramp."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidValueError
from tokenbatch.scaling.published import (
    LAWS,
    deepseek_llm,
    positive_float,
    recorded_extrapolation,
    step_law,
)
from tokenbatch.schedule import LinearRamp

__all__ = ["Recommendation", "recommend"]

_positive_float = positive_float


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
    if law not in ("step", "deepseek"):
        raise InvalidValueError(f"law must be 'step' or 'deepseek', got {law!r}")
    with recorded_extrapolation(stacklevel=2) as messages:
        if law == "step":
            raw, lr = step_law(n, total)
        else:
            raw, lr = deepseek_llm(6.0 * n * total)
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
