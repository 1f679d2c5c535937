"""Plots of packings, memory breakdowns, schedules and launch plans (the ``plot`` extra:
matplotlib).

Every function returns a ``matplotlib.figure.Figure`` and, given ``path``, also writes
it to that file (PNG, SVG, PDF... by extension). Figures are built with the
object-oriented API, without ``pyplot``, so plotting never touches the global backend
or opens a window::

    import tokenbatch as tb
    from tokenbatch.plot import plot_packing

    packing = tb.pack(tb.datasets.example_lengths("chat", 100_000), 4096)
    plot_packing(packing, path="packing.png")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from os import PathLike
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.memory import MemoryEstimate
from tokenbatch.packing import Packing
from tokenbatch.scaling.result import LaunchPlan
from tokenbatch.schedule import BatchSchedule, LRSchedule

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_launch_plan", "plot_memory", "plot_packing", "plot_schedule"]

PathLikeStr = str | PathLike[str]
_GIB = float(2**30)
_MEMORY_PARTS = (
    ("params", "parameters"),
    ("grads", "gradients"),
    ("optimizer", "optimizer states"),
    ("activations", "activations"),
    ("overhead", "overhead"),
)


def _figure(width: float, height: float, columns: int = 1) -> tuple[Figure, Any]:
    try:
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - the plot extra installs it
        raise ImportError(
            "tokenbatch.plot needs matplotlib: pip install 'tokenbatch[plot]'"
        ) from None
    figure = Figure(figsize=(width, height), layout="constrained")
    axes = figure.subplots(1, columns)
    return figure, axes


def _finish(figure: Figure, path: PathLikeStr | None) -> Figure:
    if path is not None:
        figure.savefig(path, dpi=120)
    return figure


def plot_packing(packing: Packing, *, path: PathLikeStr | None = None, bins: int = 50) -> Figure:
    """Two histograms: how full the bins are, and the lengths of the packed segments.

    The fill panel marks the packing's overall efficiency; a packing with most bins at
    100% and a thin tail of partial bins is a tight one.
    """
    if not isinstance(packing, Packing):
        raise InvalidTypeError(
            f"packing must be a tokenbatch.Packing, got {type(packing).__name__}"
        )
    buckets = as_int(bins, "bins", minimum=1)
    figure, (fill_axes, length_axes) = _figure(10, 3.6, columns=2)
    fill = packing.bin_tokens / packing.max_tokens if packing.n_bins else np.zeros(0)
    fill_axes.hist(100 * fill, bins=buckets, range=(0, 100), color="#4C72B0")
    fill_axes.axvline(100 * packing.efficiency, color="#C44E52", linestyle="--")
    fill_axes.set_xlabel("bin fill (% of max_tokens)")
    fill_axes.set_ylabel("bins")
    fill_axes.set_title(
        f"{packing.n_bins:,} bins, efficiency {100 * packing.efficiency:.2f}% "
        f"(lower bound {packing.lower_bound:,})",
        fontsize=10,
    )
    length_axes.hist(packing.lengths, bins=buckets, color="#55A868")
    length_axes.set_xlabel("segment length (tokens)")
    length_axes.set_ylabel("segments")
    length_axes.set_title(f"{packing.n_segments:,} segments of {packing.n_seqs:,} sequences")
    length_axes.title.set_fontsize(10)
    return _finish(figure, path)


def plot_memory(
    estimates: Mapping[str, MemoryEstimate] | Sequence[MemoryEstimate],
    *,
    gpu_memory: float | None = None,
    path: PathLikeStr | None = None,
) -> Figure:
    """The per-GPU memory breakdown of several layouts as stacked bars (GiB).

    Args:
        estimates: results of :func:`tokenbatch.estimate_memory`, as a mapping from a
            label to an estimate, or a sequence (labelled by their parallel layout).
        gpu_memory: bytes of one GPU; drawn as a horizontal line.
    """
    if isinstance(estimates, Mapping):
        items = list(estimates.items())
    elif isinstance(estimates, Sequence) and not isinstance(estimates, str):
        items = [(_layout_label(estimate), estimate) for estimate in estimates]
    else:
        raise InvalidTypeError(
            f"estimates must be a mapping or sequence of MemoryEstimate, got "
            f"{type(estimates).__name__}"
        )
    if not items:
        raise InvalidValueError("estimates is empty: nothing to plot")
    for label, estimate in items:
        if not isinstance(estimate, MemoryEstimate):
            raise InvalidTypeError(
                f"estimates[{label!r}] is a {type(estimate).__name__}, not a MemoryEstimate"
            )
    figure, axes = _figure(max(5.0, 1.1 * len(items) + 2.5), 4.2)
    positions = np.arange(len(items))
    bottom = np.zeros(len(items))
    for field, name in _MEMORY_PARTS:
        heights = np.array([getattr(estimate, field) for _, estimate in items]) / _GIB
        axes.bar(positions, heights, bottom=bottom, label=name, width=0.7)
        bottom += heights
    if gpu_memory is not None:
        axes.axhline(float(gpu_memory) / _GIB, color="black", linestyle="--", label="GPU memory")
    axes.set_xticks(positions, [label for label, _ in items], rotation=20, ha="right")
    axes.set_ylabel("GiB per GPU")
    axes.set_title("memory per GPU by layout", fontsize=10)
    axes.legend(fontsize=8)
    return _finish(figure, path)


def _layout_label(estimate: MemoryEstimate) -> str:
    options = estimate.options
    parts = [
        f"{key}{options[key]}" for key in ("dp", "tp", "pp", "cp", "ep") if options.get(key, 1) != 1
    ]
    if options.get("zero"):
        parts.append(f"zero{options['zero']}")
    if options.get("recompute", "none") != "none":
        parts.append(str(options["recompute"]))
    parts.append(f"mb{options.get('micro_batch', 1)}")
    return " ".join(parts)


def plot_schedule(
    schedule: BatchSchedule,
    total_tokens: int,
    *,
    lr: LRSchedule | None = None,
    micro_batch_tokens: int | None = None,
    dp: int = 1,
    path: PathLikeStr | None = None,
) -> Figure:
    """Batch size (tokens per optimizer step) against consumed tokens, and the learning
    rate on a second axis when ``lr`` is given.

    The curve is the schedule's :meth:`~tokenbatch.schedule.BatchSchedule.table`, step
    by step: ``micro_batch_tokens`` and ``dp`` must divide every batch (default: the
    schedule's sequence length, or one token, and one rank).
    """
    if not isinstance(schedule, BatchSchedule):
        raise InvalidTypeError(
            f"schedule must be a tokenbatch.schedule.BatchSchedule, got {type(schedule).__name__}"
        )
    if lr is not None and not isinstance(lr, LRSchedule):
        raise InvalidTypeError(
            f"lr must be a tokenbatch.schedule.LRSchedule, got {type(lr).__name__}"
        )
    total = as_int(total_tokens, "total_tokens", minimum=1)
    micro = micro_batch_tokens
    if micro is None:
        micro = schedule.seq_len if schedule.seq_len is not None else 1
    table = schedule.table(total, micro, dp)
    consumed = table["consumed_tokens"]
    if len(consumed) == 0:
        raise InvalidValueError(
            f"total_tokens={total:,} is less than the first batch: the schedule has no step"
        )
    before = np.concatenate([[0], consumed[:-1]])
    figure, axes = _figure(8, 4)
    axes.step(before, table["batch_tokens"], where="post", color="#4C72B0", label="batch tokens")
    axes.set_xlabel("consumed tokens")
    axes.set_ylabel("batch size (tokens per step)", color="#4C72B0")
    axes.set_title(f"{len(consumed):,} optimizer steps", fontsize=10)
    if lr is not None:
        rate_axes = axes.twinx()
        rate_axes.plot(before, lr.lr_at(before.astype(np.float64)), color="#C44E52")
        rate_axes.set_ylabel("learning rate", color="#C44E52")
    return _finish(figure, path)


def plot_launch_plan(plan: LaunchPlan, *, path: PathLikeStr | None = None) -> Figure:
    """Two panels: the plan's batch ramp, and the loss its law predicts around the batch.

    Left, against consumed tokens (log axes): each stage's batch in tokens per step, the
    law's critical batch along the run (a stage starts where that curve reaches its batch),
    the chosen batch for the whole budget with the range the shipped batch laws span, and
    each stage's learning rate on a second axis. Right, for batches from 1/8 to 8 times
    the optimum: the share of the token budget with which the optimal batch reaches the
    loss of that batch
    (:meth:`~tokenbatch.scaling.BatchLaw.token_fraction`); the 5%-suboptimal range is
    where it stays above 95%, shaded, with the optimum and the chosen batch marked.
    """
    if not isinstance(plan, LaunchPlan):
        raise InvalidTypeError(
            f"plan must be a tokenbatch.scaling.LaunchPlan, got {type(plan).__name__}"
        )
    figure, (ramp_axes, loss_axes) = _figure(11, 4.2, columns=2)
    law, tokens = plan.law, plan.tokens
    first = plan.stages[0].batch_tokens
    starts = [max(stage.start_tokens, first) for stage in plan.stages] + [plan.consumed_tokens]
    batches = [stage.batch_tokens for stage in plan.stages]
    ramp_axes.step(
        starts, [*batches, batches[-1]], where="post", color="#4C72B0", label="batch per step"
    )
    along = np.geomspace(first, tokens, 200)
    ramp_axes.plot(
        along,
        law.critical_batch_after(along),
        color="#C44E52",
        linestyle="--",
        label="critical batch of the loss reached",
    )
    ramp_axes.axhline(
        plan.optimal_batch_tokens, color="#55A868", linestyle=":", label="chosen batch for D"
    )
    spread = plan.batch_spread
    ramp_axes.axhspan(
        spread.low, spread.high, color="#55A868", alpha=0.1, label="range across the batch laws"
    )
    ramp_axes.set_xscale("log")
    ramp_axes.set_yscale("log")
    ramp_axes.set_ylim(min(first, spread.low) / 2, max(plan.batch_tokens, spread.high) * 4)
    ramp_axes.set_xlabel("consumed tokens")
    ramp_axes.set_ylabel("global batch (tokens per step)")
    ramp_axes.set_title(
        f"{len(plan.stages)} stages, {plan.steps:,} steps, {plan.model}", fontsize=10
    )
    rate_axes = ramp_axes.twinx()
    rates = [stage.learning_rate for stage in plan.stages]
    rate_axes.step(starts, [*rates, rates[-1]], where="post", color="#8172B2", alpha=0.6)
    rate_axes.set_ylabel("peak learning rate", color="#8172B2")
    rate_axes.set_ylim(0, max(rates) * 1.3)
    ramp_axes.legend(fontsize=8, loc="upper left")

    optimum = plan.optimal_batch_tokens
    around = optimum * np.geomspace(1 / 8, 8, 400)
    share = 100 * np.asarray(law.token_fraction(around, tokens))
    low, high = plan.near_optimal_range
    loss_axes.plot(around, share, color="#4C72B0")
    loss_axes.axvspan(low, high, color="#55A868", alpha=0.15, label="5%-suboptimal range")
    loss_axes.axhline(95, color="#55A868", linestyle=":")
    loss_axes.axvline(optimum, color="black", linestyle=":", label="optimum")
    loss_axes.plot(
        [plan.batch_tokens],
        [100 * plan.token_fraction],
        "o",
        color="#C44E52",
        label="chosen batch",
    )
    loss_axes.set_xscale("log")
    loss_axes.set_xlabel("global batch (tokens per step)")
    loss_axes.set_ylabel("tokens the optimum needs for this loss (% of D)")
    loss_axes.set_title(f"the law's loss around the optimum, D = {tokens:.3g} tokens", fontsize=10)
    loss_axes.legend(fontsize=8, loc="lower center")
    return _finish(figure, path)
