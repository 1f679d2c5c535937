"""Every shipped law evaluated for one run, the spread between them, and the default
choice: a law fitted on runs of this size, else the one that agrees best with the
published runs nearest in scale."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tokenbatch.errors import InvalidValueError
from tokenbatch.scaling.published import LAWS, law_values, positive_float
from tokenbatch.scaling.runs import PUBLISHED_RUNS, PublishedRun, nearest_runs

if TYPE_CHECKING:
    from tokenbatch.memory import ModelSpec

__all__ = [
    "BATCH_LAWS",
    "LR_LAWS",
    "LawEstimate",
    "RunScale",
    "Spread",
    "choose",
    "comparable_runs",
    "estimate",
    "given",
    "lr_safety_note",
]

Quantity = Literal["batch", "lr"]
BATCH_LAWS = ("schaipp-2026", "step", "deepseek", "porian", "kaplan")
"""The shipped laws that give a batch size, in the order they are listed."""
LR_LAWS = ("step", "deepseek", "porian")
"""The shipped laws that give a learning rate."""
EVIDENCE_RUNS = 4
"""Published runs of the same kind, nearest in scale, a law's agreement is measured on."""
SAFETY_FACTOR = 2.0
"""A learning rate more than this many times every comparable published run's is flagged."""


@dataclass(frozen=True)
class RunScale:
    """What the laws need to know of a run."""

    n_params: float
    """Non-embedding parameters (activated per token, for a mixture of experts)."""
    tokens: float
    flops_per_token: float
    """Non-embedding training FLOPs per token, DeepSeek LLM's ``M``."""
    mixture_of_experts: bool = False

    @property
    def compute(self) -> float:
        """Training compute ``M D`` in FLOPs."""
        return self.flops_per_token * self.tokens

    @classmethod
    def from_count(
        cls, n_params: float, tokens: float, *, mixture_of_experts: bool = False
    ) -> RunScale:
        """A run known by its parameter count: ``M = 6 N`` (attention not counted)."""
        n = positive_float(n_params, "n_params")
        return cls(n, positive_float(tokens, "tokens"), 6 * n, mixture_of_experts)

    @classmethod
    def from_spec(cls, spec: ModelSpec, tokens: float, seq_len: int) -> RunScale:
        """A run of ``spec``: its activated parameters less the embedding and output
        matrices, and ``M = 6 N + 6 layers x seq_len x attention width``."""
        vocabulary = spec.vocab_size * spec.hidden_size * (1 if spec.tied_embeddings else 2)
        positions = spec.learned_positions * spec.hidden_size
        n = float(spec.num_active_params() - vocabulary - positions)
        attention = 6.0 * spec.num_layers * seq_len * spec.num_heads * spec.head_size
        return cls(n, positive_float(tokens, "tokens"), 6 * n + attention, spec.is_moe)

    @classmethod
    def of_run(cls, run: PublishedRun) -> RunScale:
        """A published run, known by its parameter count."""
        return cls.from_count(run.law_params, run.tokens, mixture_of_experts=run.mixture_of_experts)


@dataclass(frozen=True)
class LawEstimate:
    """One law's value for one run, and whether the run lies where the law was fitted."""

    law: str
    """The law's key in :data:`~tokenbatch.scaling.LAWS`."""
    quantity: Quantity
    value: float
    """The batch in tokens, or the learning rate at ``at_batch``."""
    law_batch: float
    """The law's own batch for this run (its learning rate belongs to that batch)."""
    at_batch: float
    """The batch ``value`` is a learning rate for (``law_batch`` unless rescaled)."""
    outside: tuple[str, ...]
    """Why the run is outside what the law was fitted on (each variable with its fitted
    range); empty when inside."""

    @property
    def inside(self) -> bool:
        """Whether the run lies inside the law's fitted range."""
        return not self.outside

    @property
    def name(self) -> str:
        """The law's name."""
        return LAWS[self.law].name


def estimate(
    law: str, quantity: Quantity, scale: RunScale, *, at_batch: float | None = None
) -> LawEstimate:
    """``law``'s batch or learning rate for ``scale``, without warnings.

    A learning rate belongs to the law's own batch; with ``at_batch`` it is moved to that
    batch by the square-root rule (Adam-type optimizers). A run of a mixture of experts is
    outside every law not fitted or checked on one.
    """
    info = LAWS[law]
    point = law_values(law, n_params=scale.n_params, tokens=scale.tokens, compute=scale.compute)
    outside = [
        f"{name}={value:.3g} (fitted on {low:.3g} to {high:.3g})"
        for name, value, low, high in info.out_of_range(**point.inputs)
    ]
    if scale.mixture_of_experts and not info.mixture_of_experts:
        outside.append("fitted on dense models, not on mixtures of experts")
    if quantity == "batch":
        return LawEstimate(law, quantity, point.batch, point.batch, point.batch, tuple(outside))
    target = point.batch if at_batch is None else at_batch
    rate = point.rate() * math.sqrt(target / point.batch)
    return LawEstimate(law, quantity, rate, point.batch, target, tuple(outside))


def _observed(run: PublishedRun, quantity: Quantity) -> float:
    value = run.batch_tokens if quantity == "batch" else run.peak_lr
    if value is None:
        raise InvalidValueError(f"{run.name} has no published {quantity}")
    return value


def _ratio(law: str, quantity: Quantity, run: PublishedRun) -> float:
    """``law``'s value for ``run`` over the run's own (a learning rate at the run's batch)."""
    value = estimate(law, quantity, RunScale.of_run(run), at_batch=run.batch_tokens).value
    return value / _observed(run, quantity)


@dataclass(frozen=True)
class Spread:
    """Every shipped law's value for one quantity of a run, and the one chosen."""

    quantity: Quantity
    estimates: tuple[LawEstimate, ...]
    chosen: str | None
    """The chosen law's key; ``None`` when the value was given."""
    value: float
    """The chosen value (before the plan rounds a batch to whole micro-batches)."""
    reason: str
    """Why this value, in words."""
    evidence: tuple[PublishedRun, ...] = ()
    """The published runs the laws' agreement was measured on."""

    @property
    def low(self) -> float:
        """The smallest value any law gives."""
        return min(item.value for item in self.estimates)

    @property
    def high(self) -> float:
        """The largest value any law gives."""
        return max(item.value for item in self.estimates)

    def agreement(self, law: str) -> float:
        """Geometric mean of ``law``'s ratio to the evidence runs, as a factor (1: exact)."""
        errors = [abs(math.log(_ratio(law, self.quantity, run))) for run in self.evidence]
        return math.exp(sum(errors) / len(errors)) if errors else math.nan


def choose(
    quantity: Quantity,
    scale: RunScale,
    *,
    law: str | None = None,
    at_batch: float | None = None,
    runs: tuple[PublishedRun, ...] = PUBLISHED_RUNS,
) -> Spread:
    """Every shipped law for ``quantity`` at ``scale``, and the default (or ``law``).

    The default prefers a law whose fitted range covers the run; with none (or several),
    the one whose values for the :data:`EVIDENCE_RUNS` published runs of the same kind
    (dense or mixture of experts) nearest in log parameters and log tokens are closest to
    what those runs used (geometric mean of the ratios). Learning rates are compared at
    each run's own batch, and reported at ``at_batch``.
    """
    names = BATCH_LAWS if quantity == "batch" else LR_LAWS
    estimates = tuple(estimate(name, quantity, scale, at_batch=at_batch) for name in names)
    evidence = tuple(
        nearest_runs(
            scale.n_params,
            scale.tokens,
            mixture_of_experts=scale.mixture_of_experts,
            quantity=quantity,
            count=EVIDENCE_RUNS,
            runs=runs,
        )
    )
    spread = Spread(quantity, estimates, None, math.nan, "", evidence)
    if law is not None:
        if law not in names:
            what = "batch" if quantity == "batch" else "learning-rate"
            raise InvalidValueError(f"no published {what} law {law!r}; known: {list(names)}")
        picked = next(item for item in estimates if item.law == law)
        return Spread(quantity, estimates, law, picked.value, "chosen by the caller", evidence)
    inside = [item for item in estimates if item.inside]
    pool = inside or list(estimates)
    scores = {item.law: spread.agreement(item.law) for item in pool}
    best = min(pool, key=lambda item: (scores[item.law], names.index(item.law)))
    kind = "mixture-of-experts" if scale.mixture_of_experts else "dense"
    if len(inside) == 1:
        reason = "the only law whose fitted range covers this run"
    else:
        listed = ", ".join(f"{run.name} {_ratio(best.law, quantity, run):.2f}" for run in evidence)
        lead = (
            "of the laws whose fitted range covers this run, "
            if inside
            else "no law was fitted on runs like this one; "
        )
        reason = (
            f"{lead}it agrees best with the {len(evidence)} published {kind} runs nearest in "
            f"scale (law / run: {listed}; {scores[best.law]:.2f}x off on average)"
        )
    return Spread(quantity, estimates, best.law, best.value, reason, evidence)


def given(quantity: Quantity, scale: RunScale, value: float, at_batch: float | None) -> Spread:
    """The spread of the laws beside a value the caller gave."""
    names = BATCH_LAWS if quantity == "batch" else LR_LAWS
    estimates = tuple(estimate(name, quantity, scale, at_batch=at_batch) for name in names)
    return Spread(quantity, estimates, None, value, "given")


def comparable_runs(
    scale: RunScale, runs: tuple[PublishedRun, ...] = PUBLISHED_RUNS
) -> list[PublishedRun]:
    """Published runs of the same kind that report a learning rate and have within 2x the
    parameters of ``scale``; the three nearest in parameters when none has."""
    same = [
        run
        for run in runs
        if run.mixture_of_experts == scale.mixture_of_experts and run.peak_lr is not None
    ]
    close = [run for run in same if abs(math.log(run.law_params / scale.n_params)) <= math.log(2)]
    if close:
        return close
    return sorted(same, key=lambda run: abs(math.log(run.law_params / scale.n_params)))[:3]


def lr_safety_note(peak_lr: float, scale: RunScale) -> str | None:
    """A note when ``peak_lr`` is more than :data:`SAFETY_FACTOR` times the learning rate
    of every published run of comparable size (:func:`comparable_runs`), naming the three
    of them nearest in scale; ``None`` otherwise."""
    runs = comparable_runs(scale)
    rates = [run.peak_lr for run in runs if run.peak_lr is not None]
    if not rates or peak_lr <= SAFETY_FACTOR * max(rates):
        return None
    kind = "mixture-of-experts" if scale.mixture_of_experts else "dense"
    nearest = nearest_runs(
        scale.n_params,
        scale.tokens,
        mixture_of_experts=scale.mixture_of_experts,
        quantity="lr",
        count=3,
        runs=runs,
    )
    listed = "; ".join(
        f"{run.name}: {run.peak_lr:.2g} at {run.tokens:.3g} tokens" for run in nearest
    )
    return (
        f"the peak learning rate {peak_lr:.3g} is more than {SAFETY_FACTOR:g}x that of every "
        f"published {kind} run of comparable size (the nearest: {listed}); many teams would "
        "expect a run this far above them to diverge"
    )
