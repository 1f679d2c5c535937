"""What :func:`~tokenbatch.scaling.launch_plan` decided: the stages of the batch ramp, the
laws behind the batch and learning rate, and the plan as text, data and launcher args."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import numpy as np
import numpy.typing as npt

from tokenbatch.megatron import to_step_batch_size_schedule
from tokenbatch.memory import PlannedLayout
from tokenbatch.scaling.batch_law import BatchLaw
from tokenbatch.scaling.spread import Spread
from tokenbatch.schedule import BatchScaledLR, LRSchedule, Piecewise

__all__ = ["LRRule", "LaunchPlan", "LaunchStage"]

LRRule = Literal["sqrt", "linear"]
GB = 1e9


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
    ``batch_tokens`` is exactly ``micro_batch_tokens x dp x grad_accum_steps``.
    ``batch_spread`` and ``lr_spread`` hold every shipped law's value for this run, each
    marked inside or outside its fitted range, and why the plan's value was chosen. Export
    it with :attr:`schedule` (a ``schedule=`` for tokenbatch's sampler), :meth:`megatron_args`
    (Megatron-LM's launcher), :meth:`table`, :meth:`laws_table`, :meth:`explanation` and
    :func:`tokenbatch.plot.plot_launch_plan`.
    """

    model: str
    n_params: float
    tokens: int
    num_gpus: int
    gpu_memory: float | None
    seq_len: int
    law: BatchLaw
    """The batch terms the ramp and the near-optimal range come from, with their optimum
    at the chosen batch."""
    law_name: str
    optimal_batch_tokens: float
    """The chosen batch for ``tokens``, before rounding."""
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
    batch_spread: Spread
    """Every shipped batch law for this run and the choice among them."""
    lr_spread: Spread
    """Every shipped learning-rate law for this run (at the final batch) and the choice."""
    notes: tuple[str, ...] = field(default=())
    """Extrapolations, safety warnings and caveats, in words."""

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
        names = (
            "start_tokens",
            "batch_tokens",
            "batch_sequences",
            "grad_accum_steps",
            "steps",
            "learning_rate",
            "memory",
        )
        columns: dict[str, list[Any]] = {name: [] for name in names}
        for stage in self.stages:
            for name, values in columns.items():
                value = getattr(stage, name)
                values.append(-1 if value is None else value)
        return {
            name: np.asarray(values, dtype=np.float64 if name == "learning_rate" else np.int64)
            for name, values in columns.items()
        }

    def laws_table(self) -> dict[str, npt.NDArray[Any]]:
        """One row per law and quantity (``"batch"`` in tokens, ``"lr"`` at the final
        batch), as numpy arrays: ``quantity``, ``law``, ``value``, ``inside`` (its fitted
        range covers the run) and ``chosen``."""
        rows = [
            (spread.quantity, item.law, item.value, item.inside, item.law == spread.chosen)
            for spread in (self.batch_spread, self.lr_spread)
            for item in spread.estimates
        ]
        quantity, law, value, inside, chosen = zip(*rows, strict=True)
        return {
            "quantity": np.asarray(quantity, dtype=np.str_),
            "law": np.asarray(law, dtype=np.str_),
            "value": np.asarray(value, dtype=np.float64),
            "inside": np.asarray(inside, dtype=np.bool_),
            "chosen": np.asarray(chosen, dtype=np.bool_),
        }

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data (JSON-ready): the decisions, the laws, the stages, the
        arguments."""
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
            "laws": {spread.quantity: _spread_dict(spread) for spread in self._spreads},
            "megatron_args": self.megatron_args(),
            "notes": list(self.notes),
        }

    @property
    def _spreads(self) -> tuple[Spread, Spread]:
        return self.batch_spread, self.lr_spread

    def explanation(self) -> str:
        """The plan as text: each decision, its numbers and where they come from."""
        return _explain(self)

    def explain(self, file: TextIO | None = None) -> None:
        """Print :meth:`explanation` (to ``file``, default standard output)."""
        print(self.explanation(), file=sys.stdout if file is None else file)


def _spread_dict(spread: Spread) -> dict[str, Any]:
    return {
        "chosen": spread.chosen,
        "value": spread.value,
        "reason": spread.reason,
        "low": spread.low,
        "high": spread.high,
        "laws": [
            {
                "law": item.law,
                "name": item.name,
                "value": item.value,
                "inside": item.inside,
                "outside": list(item.outside),
            }
            for item in spread.estimates
        ],
        "evidence": [run.name for run in spread.evidence],
    }


def _spread_lines(spread: Spread, title: str, unit: str) -> list[str]:
    def show(value: float) -> str:
        return f"{value:,.0f}" if spread.quantity == "batch" else f"{value:.3g}"

    lines = [f"  {title}: {show(spread.value)} {unit}".rstrip()]
    for item in spread.estimates:
        mark = "*" if item.law == spread.chosen else " "
        where = "inside its fitted range" if item.inside else "outside: " + ", ".join(item.outside)
        lines.append(f"   {mark} {item.name:<34} {show(item.value):>12}  {where}")
    lines += [
        f"    range across laws: {show(spread.low)} to {show(spread.high)} "
        f"({spread.high / spread.low:.1f}x)",
        f"    {_chosen_text(spread)}",
    ]
    return lines


def _chosen_text(spread: Spread) -> str:
    if spread.chosen is None:
        return f"the value was {spread.reason}"
    chosen = next(item for item in spread.estimates if item.law == spread.chosen)
    return f"chosen: {chosen.name}, {spread.reason}"


def _explain(plan: LaunchPlan) -> str:
    memory = "" if plan.gpu_memory is None else f" x {plan.gpu_memory / GB:.0f} GB"
    low, high = plan.near_optimal_range
    lines = [
        f"Launch plan: {plan.model} ({plan.n_params / 1e9:.2f}B parameters), "
        f"{plan.tokens:,} tokens, {plan.num_gpus} GPUs{memory}, seq_len {plan.seq_len:,}",
        "",
        "Laws (* chosen; learning rates at the final batch):",
        *_spread_lines(plan.batch_spread, "batch", "tokens"),
        *_spread_lines(plan.lr_spread, "peak learning rate", ""),
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
            f"Layout (tokenbatch.plan_layouts, fastest that fits): dp={layout.dp} tp={layout.tp} "
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
            row += f" {stage.memory / GB:>7.1f}"
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
            f"Memory: the busiest stage needs {max(estimates) / GB:.1f} GB per GPU: {verdict} "
            f"in the {plan.usable_memory / GB:.1f} GB usable"
        )
    lines += ["", "Megatron-LM: " + plan.megatron_args()]
    if plan.notes:
        lines += ["", "Notes:"] + [f"  - {note}" for note in plan.notes]
    return "\n".join(lines)
