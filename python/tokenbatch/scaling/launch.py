"""A launch plan: from a model, a token budget and a cluster to the batch per step, its
ramp, the parallel layout, the learning rate per stage and the launcher's arguments."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from os import PathLike
from typing import TYPE_CHECKING, Any, Literal, TextIO

import numpy as np
import numpy.typing as npt

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.megatron import to_step_batch_size_schedule
from tokenbatch.memory import ModelSpec, PlannedLayout, estimate_memory, max_micro_batch_tokens
from tokenbatch.memory import plan as plan_layouts
from tokenbatch.scaling.batch_law import BatchLaw
from tokenbatch.scaling.published import (
    LAWS,
    positive_float,
    recorded_extrapolation,
    step_law,
)
from tokenbatch.scaling.three_term import ThreeTermLaw
from tokenbatch.schedule import BatchScaledLR, LRSchedule, Piecewise, rescale_lr

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["LaunchPlan", "LaunchStage", "launch_plan"]

LRRule = Literal["sqrt", "linear"]
_PLAN_ONLY = (
    "gpus_per_node",
    "peak_flops",
    "compute_efficiency",
    "intra_node_bandwidth",
    "inter_node_bandwidth",
)
_GB = 1e9


@dataclass(frozen=True)
class LaunchStage:
    """One stage of the batch ramp: a constant global batch for ``steps`` optimizer steps."""

    start_tokens: int
    """Tokens consumed before the stage's first step (a step boundary)."""
    batch_tokens: int
    batch_sequences: int
    """Sequences of ``seq_len`` tokens per step (Megatron-LM's global batch size)."""
    grad_accum_steps: int
    """Micro-batches each data-parallel rank accumulates per step."""
    steps: int
    learning_rate: float
    """Peak learning rate for this stage's batch (the plan's rule applied to its batch)."""
    memory: int | None
    """Estimated bytes per GPU with this accumulation (``None`` without a ``ModelSpec``)."""

    @property
    def end_tokens(self) -> int:
        """Tokens consumed after the stage's last step."""
        return self.start_tokens + self.steps * self.batch_tokens


@dataclass(frozen=True)
class LaunchPlan:
    """What :func:`launch_plan` decided, with the numbers behind each decision.

    ``stages`` hold the batch per step from the first step to the last; every stage's
    ``batch_tokens`` is exactly ``micro_batch_tokens x dp x grad_accum_steps``. Export it
    with :attr:`schedule` (a ``schedule=`` for tokenbatch's sampler), :meth:`megatron_args`
    (Megatron-LM's launcher), :meth:`table`, :meth:`explanation` and :meth:`plot`.
    """

    model: str
    n_params: float
    tokens: int
    num_gpus: int
    gpu_memory: float | None
    seq_len: int
    law: BatchLaw
    law_name: str
    optimal_batch_tokens: float
    """The law's loss-optimal batch for ``tokens``, before rounding."""
    near_optimal_range: tuple[float, float]
    """Batches within 5% of the optimum (the paper's definition)."""
    batch_tokens: int
    """The final batch: the optimum rounded to whole rounds of micro-batches."""
    token_fraction: float
    """The optimum reaches the final batch's loss with this share of ``tokens``."""
    layout: PlannedLayout | None
    dp: int
    micro_batch_tokens: int
    """Tokens of one micro-batch per rank (``micro_batch`` sequences of ``seq_len``)."""
    max_micro_batch_tokens: int | None
    """The largest packed micro-batch (one row) that fits the layout's memory."""
    stages: tuple[LaunchStage, ...]
    peak_lr: float
    """Learning rate at the final batch."""
    lr_rule: LRRule
    lr_source: str
    usable_memory: float | None
    notes: tuple[str, ...] = field(default=())
    """Extrapolation warnings and caveats, in words."""

    @property
    def steps(self) -> int:
        """Optimizer steps of the whole run."""
        return sum(stage.steps for stage in self.stages)

    @property
    def consumed_tokens(self) -> int:
        """Tokens the steps consume (at most one final batch short of ``tokens``)."""
        return self.stages[-1].end_tokens

    @property
    def schedule(self) -> Piecewise:
        """The batch schedule, in sequences keyed by consumed tokens: ``schedule=`` for the
        sampler, or :func:`tokenbatch.megatron.to_step_batch_size_schedule`."""
        return Piecewise(
            [(stage.start_tokens, stage.batch_sequences) for stage in self.stages],
            unit="sequences",
            seq_len=self.seq_len,
        )

    def lr_schedule(self, base: LRSchedule) -> BatchScaledLR:
        """``base`` (tuned at the final batch) rescaled along the ramp by the plan's rule."""
        return BatchScaledLR(base, self.schedule, self.batch_tokens, rule=self.lr_rule)

    def megatron_args(self) -> str:
        """Megatron-LM arguments for the batch schedule, micro-batch, layout and peak rate."""
        micro = self.micro_batch_tokens // self.seq_len
        args = [
            f"--seq-length {self.seq_len}",
            f"--micro-batch-size {micro}",
            f'--step-batch-size-schedule "{to_step_batch_size_schedule(self.schedule)}"',
        ]
        if self.layout is not None:
            args += [
                f"--tensor-model-parallel-size {self.layout.tp}",
                f"--pipeline-model-parallel-size {self.layout.pp}",
                f"--context-parallel-size {self.layout.cp}",
            ]
        args.append(f"--lr {self.peak_lr:.3g}")
        return " ".join(args)

    def table(self) -> dict[str, npt.NDArray[Any]]:
        """One row per stage, as numpy arrays (memory in bytes, -1 when not estimated)."""
        columns: dict[str, list[Any]] = {
            name: []
            for name in (
                "start_tokens",
                "batch_tokens",
                "batch_sequences",
                "grad_accum_steps",
                "steps",
                "learning_rate",
                "memory",
            )
        }
        for stage in self.stages:
            for name, values in columns.items():
                value = getattr(stage, name)
                values.append(-1 if value is None else value)
        return {
            name: np.asarray(values, dtype=np.float64 if name == "learning_rate" else np.int64)
            for name, values in columns.items()
        }

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data (JSON-ready): the decisions, the stages, the arguments."""
        layout = None if self.layout is None else self.layout.layout()
        return {
            "model": self.model,
            "n_params": self.n_params,
            "tokens": self.tokens,
            "num_gpus": self.num_gpus,
            "gpu_memory": self.gpu_memory,
            "seq_len": self.seq_len,
            "law": self.law_name,
            "optimal_batch_tokens": self.optimal_batch_tokens,
            "near_optimal_range": list(self.near_optimal_range),
            "batch_tokens": self.batch_tokens,
            "token_fraction": self.token_fraction,
            "layout": layout,
            "dp": self.dp,
            "micro_batch_tokens": self.micro_batch_tokens,
            "max_micro_batch_tokens": self.max_micro_batch_tokens,
            "stages": [
                {
                    "start_tokens": stage.start_tokens,
                    "batch_tokens": stage.batch_tokens,
                    "batch_sequences": stage.batch_sequences,
                    "grad_accum_steps": stage.grad_accum_steps,
                    "steps": stage.steps,
                    "learning_rate": stage.learning_rate,
                    "memory": stage.memory,
                }
                for stage in self.stages
            ],
            "steps": self.steps,
            "consumed_tokens": self.consumed_tokens,
            "peak_lr": self.peak_lr,
            "lr_rule": self.lr_rule,
            "lr_source": self.lr_source,
            "megatron_args": self.megatron_args(),
            "notes": list(self.notes),
        }

    def explanation(self) -> str:
        """The plan as text: each decision, its numbers and where they come from."""
        return _explain(self)

    def explain(self, file: TextIO | None = None) -> None:
        """Print :meth:`explanation` (to ``file``, default standard output)."""
        print(self.explanation(), file=sys.stdout if file is None else file)

    def plot(self, *, path: str | PathLike[str] | None = None) -> Figure:
        """The ramp, and the loss around the chosen batch: see
        :func:`tokenbatch.plot.plot_launch_plan` (needs the ``plot`` extra)."""
        from tokenbatch.plot import plot_launch_plan  # plot imports this module's types

        return plot_launch_plan(self, path=path)


def _resolve_law(law: BatchLaw | ThreeTermLaw | str) -> tuple[BatchLaw, str]:
    if isinstance(law, str):
        batch_law = BatchLaw.published(law)
    elif isinstance(law, ThreeTermLaw):
        return law.batch_law, "the given three-term law"
    elif isinstance(law, BatchLaw):
        batch_law = law
    else:
        raise InvalidTypeError(
            f"law must be a BatchLaw, a ThreeTermLaw or a published law's name, got "
            f"{type(law).__name__}"
        )
    name = "the given batch law" if batch_law.info is None else batch_law.info.name
    return batch_law, name


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
    law: BatchLaw | ThreeTermLaw | str = "schaipp-2026",
    peak_lr: float | None = None,
    lr_rule: LRRule = "sqrt",
    ramp: bool = True,
    layout: PlannedLayout | None = None,
    usable_fraction: float = 0.9,
    **options: Any,
) -> LaunchPlan:
    """Plan a training run: the batch per step, its ramp, the layout and learning rates.

    For ``model`` (a :class:`~tokenbatch.ModelSpec`, or a parameter count) trained on
    ``tokens`` tokens of ``seq_len``-token sequences on ``num_gpus`` GPUs of ``gpu_memory``
    bytes:

    1. **Batch.** ``law`` (default: Schaipp's published three-term law, or your own fitted
       :class:`~tokenbatch.scaling.ThreeTermLaw`) gives the loss-optimal batch for
       ``tokens`` and the batches within 5% of it (the paper's definition).
    2. **Layout.** :func:`tokenbatch.plan` picks the fastest layout that fits
       ``usable_fraction`` of ``gpu_memory`` at the batch nearest the optimum that whole
       micro-batches on every rank can make (trying batches divisible by large divisors
       of ``num_gpus`` first, inside the 5% range first); pass ``layout`` to impose one.
       :func:`tokenbatch.max_micro_batch_tokens` says how large a packed micro-batch that
       layout could hold. With a parameter count instead of a ``ModelSpec`` nothing is
       checked against memory: one sequence per micro-batch on ``num_gpus`` data-parallel
       ranks.
    3. **Ramp** (``ramp=True``). Stages double the accumulation from one micro-batch per
       rank up to the final batch; each starts once its batch is no larger than the law's
       critical batch for the loss a run at that batch has reached
       (:meth:`~tokenbatch.scaling.BatchLaw.critical_tokens`), rounded up to a step
       boundary. Early in training the loss is high and the critical batch small, so
       larger batches would buy little but tokens; the law says how fast that passes.
    4. **Learning rate.** ``peak_lr`` is the rate at the final batch (default: Step Law's
       ``1.79 N^-0.713 D^0.307`` at its own optimal batch, moved to the final batch by the
       rule); each stage gets ``rescale_lr(peak_lr, final batch, stage batch, lr_rule)``:
       ``"sqrt"`` for Adam-type optimizers, ``"linear"`` for SGD.

    Memory is estimated for every stage's accumulation. ``options`` go to
    :func:`tokenbatch.plan` (``peak_flops``, ``gpus_per_node``, bandwidths...) and to the
    memory estimates (``optimizer``, dtypes, ``activation_model``...). Inputs outside a
    law's fitted range warn (:class:`~tokenbatch.scaling.ExtrapolationWarning`) and are
    listed in ``notes``.
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
    batch_law, law_name = _resolve_law(law)
    memory_options = {k: v for k, v in options.items() if k not in _PLAN_ONLY}

    with recorded_extrapolation(stacklevel=2) as notes:
        optimum = batch_law.optimal_batch(total)
        band = batch_law.near_optimal_range(total)
        if batch_law.info is not None and "n_params" in batch_law.info.validity:
            batch_law.info.check(n_params=n_params)
        if peak_lr is None:
            step_batch, step_lr = step_law(n_params, total)
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
                f"{memory / _GB:.1f} GB at any batch near the optimum ({optimum:,.0f} tokens)"
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
    if peak_lr is None:
        rate = rescale_lr(step_lr, step_batch, batch, rule=lr_rule)
        lr_source = (
            f"Step Law ({LAWS['step'].formula.split(', ')[1]}) at its optimal batch "
            f"({step_batch:,.0f} tokens), rescaled to the final batch by the {lr_rule} rule"
        )
    else:
        rate = positive_float(peak_lr, "peak_lr")
        lr_source = "given (tuned at the final batch)"

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
                    f"{stage.memory / _GB:.1f} GB per GPU, more than the "
                    f"{usable_memory / _GB:.1f} GB usable"
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
        notes=tuple(notes),
    )


def _explain(plan: LaunchPlan) -> str:
    memory = "" if plan.gpu_memory is None else f" x {plan.gpu_memory / _GB:.0f} GB"
    low, high = plan.near_optimal_range
    lines = [
        f"Launch plan: {plan.model} ({plan.n_params / 1e9:.2f}B parameters), "
        f"{plan.tokens:,} tokens, {plan.num_gpus} GPUs{memory}, seq_len {plan.seq_len:,}",
        "",
        f"Batch: {plan.law_name}",
        f"  optimal batch for {plan.tokens:.3g} tokens: {plan.optimal_batch_tokens:,.0f} tokens; "
        f"5%-suboptimal range {low:,.0f} to {high:,.0f}",
        f"  final batch: {plan.batch_tokens:,} tokens = {plan.batch_tokens // plan.seq_len:,} "
        f"sequences; the optimum reaches its loss with {plan.token_fraction:.2%} of the tokens",
    ]
    layout = plan.layout
    lines.append("")
    if layout is None:
        lines.append(
            f"Layout: not planned (no ModelSpec): dp={plan.dp}, one sequence per micro-batch, "
            "memory not checked"
        )
    else:
        lines += [
            f"Layout (tokenbatch.plan, fastest that fits): dp={layout.dp} tp={layout.tp} "
            f"pp={layout.pp} cp={layout.cp} ep={layout.ep} zero={layout.zero} "
            f"recompute={layout.recompute}",
            f"  micro-batch {layout.micro_batch} x {plan.seq_len:,} = "
            f"{plan.micro_batch_tokens:,} tokens per rank; final step "
            f"{layout.step_time:.2f} s, MFU {layout.mfu:.0%} (the planner's model)",
        ]
        if plan.max_micro_batch_tokens is not None:
            lines.append(
                f"  the largest packed micro-batch this layout fits: "
                f"{plan.max_micro_batch_tokens:,} tokens (sampler max_tokens up to that)"
            )
    lines += [
        "",
        "Stages (a stage starts when its batch is no longer above the law's critical batch):",
    ]
    header = f"  {'from tokens':>18} {'batch tokens':>13} {'seqs':>6} {'accum':>5} "
    header += f"{'steps':>9} {'lr':>9}"
    if plan.usable_memory is not None:
        header += f" {'GB/GPU':>7}"
    lines.append(header)
    for stage in plan.stages:
        row = (
            f"  {stage.start_tokens:>18,} {stage.batch_tokens:>13,} {stage.batch_sequences:>6,} "
            f"{stage.grad_accum_steps:>5} {stage.steps:>9,} {stage.learning_rate:>9.3g}"
        )
        if stage.memory is not None:
            row += f" {stage.memory / _GB:>7.1f}"
        lines.append(row)
    lines += [
        f"  {plan.steps:,} steps, {plan.consumed_tokens:,} tokens "
        f"({plan.tokens - plan.consumed_tokens:,} left over, less than one batch)",
        "",
        f"Learning rate: {plan.peak_lr:.3g} at the final batch: {plan.lr_source}; "
        f"stages scaled by the {plan.lr_rule} of their batch ratio",
    ]
    estimates = [stage.memory for stage in plan.stages if stage.memory is not None]
    if plan.usable_memory is not None and estimates:
        verdict = "fits" if max(estimates) <= plan.usable_memory else "does NOT fit"
        lines.append(
            f"Memory: the busiest stage needs {max(estimates) / _GB:.1f} GB per GPU: {verdict} "
            f"in the {plan.usable_memory / _GB:.1f} GB usable"
        )
    lines += ["", "Megatron-LM: " + plan.megatron_args()]
    if plan.notes:
        lines += ["", "Notes:"] + [f"  - {note}" for note in plan.notes]
    return "\n".join(lines)
