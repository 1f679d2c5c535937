"""A launch plan: from a model, a token budget and a cluster to the batch per step, its
ramp, the parallel layout, the learning rate per stage and the launcher's arguments."""

from __future__ import annotations

import math
import warnings
from typing import Any

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.memory import (
    ModelSpec,
    PlannedLayout,
    estimate_memory,
    max_micro_batch_tokens,
    plan_layouts,
)
from tokenbatch.scaling.batch_law import BatchLaw
from tokenbatch.scaling.published import (
    LAWS,
    ExtrapolationWarning,
    positive_float,
    recorded_extrapolation,
)
from tokenbatch.scaling.result import GB, LaunchPlan, LaunchStage, LRRule
from tokenbatch.scaling.spread import (
    RunScale,
    Spread,
    choose,
    given,
    lr_safety_note,
)
from tokenbatch.scaling.three_term import ThreeTermLaw
from tokenbatch.schedule import rescale_lr

__all__ = ["launch_plan"]

_PLAN_ONLY = (
    "gpus_per_node",
    "peak_flops",
    "compute_efficiency",
    "intra_node_bandwidth",
    "inter_node_bandwidth",
)


def _shaped(optimum: float, tokens: float) -> BatchLaw:
    """Schaipp's three-term batch terms moved so that their optimum for ``tokens`` is
    ``optimum``: the shape of the ramp and of the near-optimal range around any batch."""
    k = LAWS["schaipp-2026"].coefficients
    exponent = k["batch_exponent"]
    return BatchLaw.from_optimal_batch(optimum / tokens**exponent, exponent, k["beta_plus_gamma"])


def _batch_choice(
    law: BatchLaw | ThreeTermLaw | str | None,
    batch_tokens: int | None,
    scale: RunScale,
    total: int,
) -> tuple[BatchLaw, str, Spread, float]:
    """The batch terms of the plan, their name, the spread of the shipped batch laws and
    the chosen batch (the optimum of those batch terms)."""
    if batch_tokens is not None:
        if law is not None:
            raise InvalidValueError("give either law or batch_tokens, not both")
        value = as_int(batch_tokens, "batch_tokens", minimum=1)
        return _shaped(value, total), "given batch", given("batch", scale, value, None), value
    if law is None or isinstance(law, str):
        spread = choose("batch", scale, law=law)
        name = LAWS[spread.chosen].name if spread.chosen is not None else spread.reason
        return _shaped(spread.value, total), name, spread, spread.value
    if isinstance(law, ThreeTermLaw):
        batch_law, name = law.batch_law, "the given three-term law"
    elif isinstance(law, BatchLaw):
        batch_law = law
        name = "the given batch law" if law.info is None else law.info.name
        if law.info is not None and "n_params" in law.info.validity:
            law.info.check(n_params=scale.n_params)
    else:
        raise InvalidTypeError(
            f"law must be a BatchLaw, a ThreeTermLaw or a published law's name, got "
            f"{type(law).__name__}"
        )
    optimum = batch_law.optimal_batch(total)
    return batch_law, name, given("batch", scale, optimum, None), optimum


def _lr_choice(
    lr_law: str | None, peak_lr: float | None, scale: RunScale, batch: int
) -> tuple[float, str, Spread]:
    """The peak rate at the final batch, where it comes from, and the spread of the laws."""
    if peak_lr is not None:
        if lr_law is not None:
            raise InvalidValueError("give either lr_law or peak_lr, not both")
        rate = positive_float(peak_lr, "peak_lr")
        return rate, "given (tuned at the final batch)", given("lr", scale, rate, batch)
    spread = choose("lr", scale, law=lr_law, at_batch=batch)
    chosen = next(item for item in spread.estimates if item.law == spread.chosen)
    info = LAWS[chosen.law]
    source = (
        f"{info.name} at its own batch ({chosen.law_batch:,.0f} tokens), moved to the final "
        "batch by the square root of the batch ratio"
    )
    return spread.value, source, spread


def _extrapolation_notes(spreads: tuple[Spread, ...]) -> list[str]:
    notes = []
    for spread in spreads:
        chosen = next((item for item in spread.estimates if item.law == spread.chosen), None)
        if chosen is not None and chosen.outside:
            what = "batch" if spread.quantity == "batch" else "learning-rate"
            reasons = ", ".join(chosen.outside)
            notes.append(f"the {what} law, {chosen.name}, is extrapolated: {reasons}")
    return notes


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _candidate_batches(
    optimum: float, seq_len: int, num_gpus: int, band: tuple[float, float]
) -> list[int]:
    """Batches near the optimum, whole numbers of sequences, in order of preference.

    A multiple of ``g`` sequences lets every data-parallel size dividing ``g`` split it, so
    batches divisible by large divisors of the GPU count come first, among those inside
    the near-optimal band, then the others.
    """
    ranked: list[tuple[bool, int, int]] = []
    for g in _divisors(num_gpus):
        sequences = max(g, round(optimum / (seq_len * g)) * g)
        batch = sequences * seq_len
        inside = band[0] <= batch <= band[1]
        ranked.append((not inside, -g, batch))
    ordered: list[int] = []
    for _, _, batch in sorted(ranked):
        if batch not in ordered:
            ordered.append(batch)
    return ordered


def _ramp_accumulations(final: int) -> list[int]:
    """1, 2, 4, ... below ``final``, then ``final``: doublings of the smallest batch."""
    steps = [1 << k for k in range(final.bit_length()) if 1 << k < final]
    return [*steps, final]


def launch_plan(
    model: ModelSpec | float,
    tokens: int,
    *,
    num_gpus: int,
    seq_len: int,
    gpu_memory: float | None = None,
    law: BatchLaw | ThreeTermLaw | str | None = None,
    batch_tokens: int | None = None,
    lr_law: str | None = None,
    peak_lr: float | None = None,
    lr_rule: LRRule = "sqrt",
    ramp: bool = True,
    layout: PlannedLayout | None = None,
    usable_fraction: float = 0.9,
    **options: Any,
) -> LaunchPlan:
    """Plan a training run: the batch per step, its ramp, the layout and learning rates.

    For ``model`` (a :class:`~tokenbatch.ModelSpec`, or a dense model's parameter count)
    trained on ``tokens`` tokens of ``seq_len``-token sequences on ``num_gpus`` GPUs of
    ``gpu_memory`` bytes:

    1. **Laws.** Every shipped batch law (Schaipp's three-term law, Step Law, DeepSeek
       LLM's, Porian et al.'s, Kaplan et al.'s critical batch) and learning-rate law (Step
       Law, DeepSeek LLM, Porian et al.) is evaluated for the run, each marked inside or
       outside the range it was fitted on (:attr:`LaunchPlan.batch_spread`,
       :attr:`LaunchPlan.lr_spread`). The laws see non-embedding parameters (activated
       ones for a mixture of experts) and DeepSeek LLM's compute ``M D``.
    2. **Batch.** By default, the law whose fitted range covers the run; with none, the
       one whose values for the four published runs of the same kind (dense or mixture of
       experts, :data:`~tokenbatch.scaling.PUBLISHED_RUNS`) nearest in scale come closest
       to what those runs used. ``law`` names one instead (or is your own fitted
       :class:`~tokenbatch.scaling.ThreeTermLaw` or a
       :class:`~tokenbatch.scaling.BatchLaw`); ``batch_tokens`` gives the batch outright.
       The ramp and the range of batches within 5% of the optimum keep the three-term
       law's shape around the chosen batch (your own law's, when given).
    3. **Layout.** :func:`tokenbatch.plan_layouts` picks the fastest layout that fits
       ``usable_fraction`` of ``gpu_memory`` at the batch nearest the optimum that whole
       micro-batches on every rank can make (trying batches divisible by large divisors
       of ``num_gpus`` first, inside the 5% range first); pass ``layout`` to impose one.
       :func:`tokenbatch.max_micro_batch_tokens` says how large a packed micro-batch that
       layout could hold. With a parameter count instead of a ``ModelSpec`` nothing is
       checked against memory: one sequence per micro-batch on ``num_gpus`` data-parallel
       ranks.
    4. **Ramp** (``ramp=True``). Stages double the accumulation from one micro-batch per
       rank up to the final batch; each starts once its batch is no larger than the law's
       critical batch for the loss a run at that batch has reached
       (:meth:`~tokenbatch.scaling.BatchLaw.critical_tokens`), rounded up to a step
       boundary.
    5. **Learning rate.** ``peak_lr`` is the rate at the final batch; by default the
       learning-rate law chosen as in 2 (or ``lr_law``), at its own batch, moved to the
       final batch by the square root of the batch ratio. Each stage gets
       ``rescale_lr(peak_lr, final batch, stage batch, lr_rule)``: ``"sqrt"`` for Adam-type
       optimizers, ``"linear"`` for SGD. A peak rate more than twice that of every
       published run of comparable size is flagged in ``notes``.

    Memory is estimated for every stage's accumulation. ``options`` go to
    :func:`tokenbatch.plan_layouts` (``peak_flops``, ``gpus_per_node``, bandwidths...) and to the
    memory estimates (``optimizer``, dtypes, ``activation_model``...). When a chosen law
    is evaluated outside its fitted range, the plan warns once
    (:class:`~tokenbatch.scaling.ExtrapolationWarning`) and says so in ``notes``.
    """
    spec = model if isinstance(model, ModelSpec) else None
    if spec is not None:
        n_params = float(spec.num_params())
        if gpu_memory is None:
            raise InvalidValueError("gpu_memory (bytes per GPU) is needed to plan a layout")
    else:
        n_params = positive_float(model, "model (a ModelSpec or a parameter count)")
        if layout is not None:
            raise InvalidValueError("layout needs model to be a ModelSpec")
    total = as_int(tokens, "tokens", minimum=1)
    gpus = as_int(num_gpus, "num_gpus", minimum=1)
    seq = as_int(seq_len, "seq_len", minimum=1)
    usable = positive_float(usable_fraction, "usable_fraction")
    memory = None if gpu_memory is None else positive_float(gpu_memory, "gpu_memory")
    if lr_rule not in ("sqrt", "linear"):
        raise InvalidValueError(f"lr_rule must be 'sqrt' or 'linear', got {lr_rule!r}")
    if layout is not None and not isinstance(layout, PlannedLayout):
        raise InvalidTypeError(f"layout must be a PlannedLayout, got {type(layout).__name__}")
    scale = (
        RunScale.from_spec(spec, total, seq)
        if spec is not None
        else RunScale.from_count(n_params, total)
    )
    memory_options = {k: v for k, v in options.items() if k not in _PLAN_ONLY}
    with recorded_extrapolation(stacklevel=2) as notes:
        batch_law, law_name, batch_spread, optimum = _batch_choice(law, batch_tokens, scale, total)
        band = batch_law.near_optimal_range(total)
    usable_memory = None if memory is None else usable * memory

    # -- the final batch and the layout ------------------------------------------------
    chosen: PlannedLayout | None = layout
    if layout is not None:
        round_tokens = layout.micro_batch * seq * layout.dp
        batch = max(round_tokens, round(optimum / round_tokens) * round_tokens)
    elif spec is not None and memory is not None:
        batch = 0
        for candidate in _candidate_batches(optimum, seq, gpus, band):
            found = plan_layouts(
                spec,
                num_gpus=gpus,
                gpu_memory=memory,
                seq_len=seq,
                global_batch_tokens=candidate,
                usable_fraction=usable,
                top=1,
                **options,
            )
            if found:
                chosen, batch = found[0], candidate
                break
        if chosen is None:
            raise InvalidValueError(
                f"no layout of {gpus} GPUs fits {spec.name} in {usable:.0%} of "
                f"{memory / GB:.1f} GB at any batch near the optimum ({optimum:,.0f} tokens)"
            )
    if chosen is not None:
        dp, micro_tokens = chosen.dp, chosen.micro_batch * seq
    else:
        dp, micro_tokens = gpus, seq
        round_tokens = micro_tokens * dp
        batch = max(round_tokens, round(optimum / round_tokens) * round_tokens)
    round_tokens = micro_tokens * dp
    final_accum = batch // round_tokens
    if not band[0] <= batch <= band[1]:
        notes.append(
            f"the batch of {batch:,} tokens (whole rounds of {round_tokens:,}-token micro-batch "
            f"x dp) is outside the 5%-suboptimal range ({band[0]:,.0f} to {band[1]:,.0f})"
        )

    headroom = None
    if spec is not None and chosen is not None and usable_memory is not None:
        options_of_layout = {k: v for k, v in chosen.layout().items() if k != "micro_batch"}
        headroom = max_micro_batch_tokens(
            spec, usable_memory, multiple_of=seq, **options_of_layout, **memory_options
        )

    # -- the learning rate ---------------------------------------------------------------
    rate, lr_source, lr_spread = _lr_choice(lr_law, peak_lr, scale, batch)
    extrapolated = _extrapolation_notes((batch_spread, lr_spread))
    if extrapolated:
        warnings.warn("; ".join(extrapolated), ExtrapolationWarning, stacklevel=2)
    notes.extend(extrapolated)
    safety = lr_safety_note(rate, scale)
    if safety is not None:
        notes.append(safety)

    # -- the ramp --------------------------------------------------------------------------
    accumulations = _ramp_accumulations(final_accum) if ramp else [final_accum]
    stages: list[LaunchStage] = []
    start = 0
    for position, accum in enumerate(accumulations):
        stage_batch = accum * round_tokens
        affordable = (total - start) // stage_batch
        if position + 1 < len(accumulations):
            next_start = batch_law.critical_tokens(accumulations[position + 1] * round_tokens)
            steps = min(affordable, max(0, math.ceil((next_start - start) / stage_batch)))
        else:
            steps = affordable
        if steps == 0:
            continue
        stage_memory = None
        if spec is not None and chosen is not None:
            stage_layout = {**chosen.layout(), "grad_accum_steps": accum}
            stage_memory = estimate_memory(
                spec, seq_len=seq, **stage_layout, **memory_options
            ).total
        stages.append(
            LaunchStage(
                start_tokens=start,
                batch_tokens=stage_batch,
                batch_sequences=stage_batch // seq,
                grad_accum_steps=accum,
                steps=steps,
                learning_rate=rescale_lr(rate, batch, stage_batch, rule=lr_rule),
                memory=stage_memory,
            )
        )
        start += steps * stage_batch
    if not stages:
        raise InvalidValueError(
            f"tokens={total:,} is less than one step of {round_tokens:,} tokens "
            f"({micro_tokens:,} per micro-batch x dp={dp})"
        )
    if usable_memory is not None:
        for stage in stages:
            if stage.memory is not None and stage.memory > usable_memory:
                notes.append(
                    f"the stage from {stage.start_tokens:,} tokens needs "
                    f"{stage.memory / GB:.1f} GB per GPU, more than the "
                    f"{usable_memory / GB:.1f} GB usable"
                )
    first = stages[0]
    if ramp and first.batch_tokens < batch:
        above = batch_law.critical_tokens(first.batch_tokens)
        if above > 0:
            notes.append(
                f"the first stage ({first.batch_tokens:,} tokens, one micro-batch per rank, the "
                f"smallest batch of this layout) is above the law's critical batch for its "
                f"first {above:,.0f} tokens"
            )
    return LaunchPlan(
        model=spec.name if spec is not None else f"{n_params:.3g} parameters",
        n_params=n_params,
        tokens=total,
        num_gpus=gpus,
        gpu_memory=memory,
        seq_len=seq,
        law=batch_law,
        law_name=law_name,
        optimal_batch_tokens=optimum,
        near_optimal_range=band,
        batch_tokens=batch,
        token_fraction=float(batch_law.token_fraction(batch, total)),
        layout=chosen,
        dp=dp,
        micro_batch_tokens=micro_tokens,
        max_micro_batch_tokens=headroom,
        stages=tuple(stages),
        peak_lr=rate,
        lr_rule=lr_rule,
        lr_source=lr_source,
        usable_memory=usable_memory,
        batch_spread=batch_spread,
        lr_spread=lr_spread,
        notes=tuple(notes),
    )
