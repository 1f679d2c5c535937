"""``tokenbatch schedule``: tabulate a batch-size schedule, or print a scaling law's launch plan."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenbatch.cli.memory_command import add_gpu_memory, load_spec
from tokenbatch.cli.output import atomic_output
from tokenbatch.cli.table import format_table, format_value
from tokenbatch.cli.units import (
    BYTES_HELP,
    COUNT_HELP,
    count,
    non_negative_real,
    output_file,
    parse_count,
    positive_real,
)
from tokenbatch.errors import InvalidValueError
from tokenbatch.memory import ModelSpec
from tokenbatch.plot import plot_launch_plan
from tokenbatch.scaling import ExtrapolationWarning, Recommendation, launch_plan, recommend
from tokenbatch.scaling.spread import BATCH_LAWS, LR_LAWS
from tokenbatch.schedule import (
    PRESETS,
    BatchSchedule,
    ConstantLR,
    CosineLR,
    LinearRamp,
    LRSchedule,
    MegatronRampup,
    Piecewise,
    WarmupStableDecayLR,
    deepseek_v3_ramp,
    gpt3_ramp,
)

_PRESET_TOKENS = {
    "deepseek-v3": 14_800_000_000_000,
    "gpt3-175b": 300_000_000_000,
    "llama3-405b": 15_600_000_000_000,
}


def _piece(text: str) -> tuple[int, int]:
    left, sep, right = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected FROM_TOKENS:BATCH, got {text!r}")
    return parse_count(left), parse_count(right)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "schedule",
        help="tabulate a batch-size schedule (ramp, preset or scaling-law recommendation)",
        description=(
            "Print the per-optimizer-step table, or a summary, of a batch-size schedule: "
            "a Megatron-LM ramp, a linear ramp, piecewise batches, a published preset, or "
            f"the batch a scaling law recommends. {COUNT_HELP} {BYTES_HELP}"
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", choices=sorted(PRESETS), help="a published schedule")
    source.add_argument(
        "--megatron",
        nargs=4,
        type=parse_count,
        metavar=("START", "INCREMENT", "RAMP_SAMPLES", "GLOBAL_BATCH"),
        help="Megatron-LM --rampup-batch-size START INCREMENT RAMP_SAMPLES and "
        "--global-batch-size GLOBAL_BATCH (sequences; needs --seq-len)",
    )
    source.add_argument(
        "--linear",
        nargs=3,
        type=parse_count,
        metavar=("START", "END", "RAMP_TOKENS"),
        help="linear ramp from START to END (in --unit) over RAMP_TOKENS tokens",
    )
    source.add_argument(
        "--piecewise",
        nargs="+",
        type=_piece,
        metavar="FROM:BATCH",
        help="batch BATCH (in --unit) from FROM consumed tokens on, e.g. 0:4Mi 252M:8Mi",
    )
    source.add_argument(
        "--recommend",
        metavar="MODEL",
        help="a launch plan for MODEL: a model preset, a config.json or a parameter count "
        "(7B); with --law step or deepseek, one law's batch size and a ramp heuristic",
    )
    parser.add_argument(
        "--law",
        choices=["plan", "step", "deepseek"],
        default="plan",
        help="plan: a launch plan, every law evaluated and one chosen for batch and learning "
        "rate; step or deepseek: that law's batch alone",
    )
    parser.add_argument(
        "--batch-law",
        choices=BATCH_LAWS,
        default=None,
        help="the batch law of the launch plan (default: chosen from the published runs)",
    )
    parser.add_argument(
        "--lr-law",
        choices=LR_LAWS,
        default=None,
        help="the learning-rate law of the launch plan (default: chosen from the published runs)",
    )
    parser.add_argument(
        "--batch-tokens",
        type=count(),
        default=None,
        help="the launch plan's batch in tokens, given outright",
    )
    parser.add_argument("--gpus", type=count(), default=None, help="GPUs (default: --dp)")
    add_gpu_memory(parser)
    parser.add_argument("--unit", choices=["tokens", "sequences"], default="tokens")
    parser.add_argument("--seq-len", type=count(), default=None, help="tokens per sequence")
    parser.add_argument("--by", choices=["tokens", "steps"], default="tokens", help="ramp shape")
    parser.add_argument(
        "--multiple-of",
        type=count(),
        default=None,
        help="round ramp batches down to a multiple of this (in --unit; default: one round of "
        "micro-batches, micro-batch tokens x dp)",
    )
    parser.add_argument("--total-tokens", type=count(), default=None, help="token budget")
    parser.add_argument(
        "--micro-batch-tokens",
        type=count(),
        default=None,
        help="tokens per micro-batch per rank (default: --seq-len, else 4096)",
    )
    parser.add_argument("--dp", type=count(), default=1, help="data-parallel size")
    lr = parser.add_argument_group("learning rate (keyed to tokens)")
    lr.add_argument("--lr", type=positive_real, default=None, help="peak learning rate")
    lr.add_argument("--lr-schedule", choices=["constant", "cosine", "wsd"], default="cosine")
    lr.add_argument("--warmup-tokens", type=parse_count, default=0)
    lr.add_argument("--min-lr", type=non_negative_real, default=0.0)
    out = parser.add_argument_group("output")
    out.add_argument("--steps", action="store_true", help="print every step (see --every)")
    out.add_argument("--every", type=count(), default=1, help="with --steps, every N-th step")
    out.add_argument(
        "--rows", type=count(minimum=2), default=12, help="checkpoints in the summary table"
    )
    out.add_argument("--json", action="store_true", help="print the summary as JSON")
    out.add_argument(
        "--output", type=output_file(".npz", ".csv"), help="write the full table to .npz or .csv"
    )
    out.add_argument(
        "--plot", type=output_file(), help="plot batch and learning rate (needs matplotlib)"
    )
    parser.set_defaults(handler=run)


def build_schedule(args: argparse.Namespace) -> tuple[BatchSchedule, str, Recommendation | None]:
    """The schedule the arguments describe, a one-line description, the recommendation."""
    if args.preset is not None:
        schedule: BatchSchedule
        if args.multiple_of is None:
            schedule = PRESETS[args.preset]()
        elif args.preset == "deepseek-v3":
            schedule = deepseek_v3_ramp(multiple_of=args.multiple_of)
        elif args.preset == "gpt3-175b":
            schedule = gpt3_ramp(multiple_of=args.multiple_of)
        else:
            raise InvalidValueError(f"--multiple-of does not apply to preset {args.preset}")
        return schedule, f"preset {args.preset}: {schedule!r}", None
    if args.megatron is not None:
        start, increment, ramp, global_batch = args.megatron
        schedule = MegatronRampup(start, increment, ramp, global_batch, seq_len=args.seq_len)
        return schedule, repr(schedule), None
    multiple = args.multiple_of
    if multiple is None:
        # Round ramps to whole rounds of micro-batches by default.
        multiple = _micro_batch_tokens(args, None) * args.dp
        if args.unit == "sequences":
            multiple = multiple // args.seq_len if args.seq_len else 1
    if args.linear is not None:
        start, end, ramp = args.linear
        schedule = LinearRamp(
            start,
            end,
            ramp,
            unit=args.unit,
            seq_len=args.seq_len,
            by=args.by,
            multiple_of=multiple,
        )
        return schedule, repr(schedule), None
    if args.piecewise is not None:
        schedule = Piecewise(args.piecewise, unit=args.unit, seq_len=args.seq_len)
        return schedule, repr(schedule), None
    if args.total_tokens is None:
        raise InvalidValueError("--recommend needs --total-tokens")
    try:
        n_params = parse_count(args.recommend)
    except argparse.ArgumentTypeError as exc:
        raise InvalidValueError(f"--recommend with --law {args.law} takes a count: {exc}") from None
    grid = args.multiple_of
    if grid is None:
        grid = _micro_batch_tokens(args, None) * args.dp
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExtrapolationWarning)
        advice = recommend(n_params, args.total_tokens, law=args.law, multiple_of=grid)
    for warning in caught:
        print(f"tokenbatch: warning: {warning.message}", file=sys.stderr)
    constant = Piecewise([(0, advice.batch_tokens)])
    schedule = advice.ramp if advice.ramp is not None else constant
    return schedule, f"{advice.law}: {advice.formula}", advice


def _micro_batch_tokens(args: argparse.Namespace, schedule: BatchSchedule | None) -> int:
    if args.micro_batch_tokens is not None:
        return int(args.micro_batch_tokens)
    if schedule is not None and schedule.seq_len is not None:
        return schedule.seq_len
    return int(args.seq_len) if args.seq_len is not None else 4096


def _lr_schedule(args: argparse.Namespace, total: int) -> LRSchedule | None:
    if args.lr is None:
        return None
    if args.lr_schedule == "constant":
        return ConstantLR(args.lr, warmup_tokens=args.warmup_tokens)
    if args.lr_schedule == "cosine":
        return CosineLR(args.lr, total, warmup_tokens=args.warmup_tokens, min_lr=args.min_lr)
    return WarmupStableDecayLR(args.lr, total, warmup_tokens=args.warmup_tokens, min_lr=args.min_lr)


def _model(text: str) -> ModelSpec | int:
    """A parameter count (``7B``), or a model preset or config.json for a full plan."""
    try:
        return parse_count(text)
    except argparse.ArgumentTypeError as not_a_count:
        try:
            return load_spec(text)
        except InvalidValueError as not_a_model:
            raise InvalidValueError(
                f"--recommend {text!r} is neither a parameter count ({not_a_count}) nor a "
                f"model ({not_a_model})"
            ) from None


def run_launch_plan(args: argparse.Namespace) -> int:
    """``--recommend MODEL`` (``--law plan``): print the launch plan.

    Extrapolation warnings are not printed: the plan lists every law inside or outside its
    fitted range, and its notes say when a chosen law extrapolates.
    """
    if args.total_tokens is None:
        raise InvalidValueError("--recommend needs --total-tokens")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        plan = launch_plan(
            _model(args.recommend),
            args.total_tokens,
            num_gpus=args.gpus if args.gpus is not None else args.dp,
            seq_len=args.seq_len if args.seq_len is not None else 4096,
            gpu_memory=args.gpu_memory,
            law=args.batch_law,
            batch_tokens=args.batch_tokens,
            lr_law=args.lr_law,
            peak_lr=args.lr,
        )
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(plan.explanation())
    if args.output is not None:
        table = plan.schedule.table(plan.tokens, plan.micro_batch_tokens, plan.dp)
        base = _lr_schedule(args, plan.tokens)
        if base is None:
            base = CosineLR(plan.peak_lr, plan.tokens, warmup_tokens=args.warmup_tokens)
        rates = plan.lr_schedule(base).lr_at(table["consumed_tokens"])
        with atomic_output(args.output) as partial:
            save_table(table, rates, partial)
        print(f"wrote {args.output}", file=sys.stderr)
    if args.plot is not None:
        with atomic_output(args.plot) as partial:
            plot_launch_plan(plan, path=str(partial))
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.recommend is not None and args.law == "plan":
        return run_launch_plan(args)
    schedule, description, advice = build_schedule(args)
    total = args.total_tokens
    if total is None:
        if args.preset is None:
            raise InvalidValueError("--total-tokens is required (e.g. --total-tokens 1T)")
        total = _PRESET_TOKENS[args.preset]
    micro = _micro_batch_tokens(args, schedule)
    table = schedule.table(total, micro, args.dp)
    lr_schedule = _lr_schedule(args, total)
    if advice is not None and lr_schedule is None:
        lr_schedule = CosineLR(advice.learning_rate, total, warmup_tokens=args.warmup_tokens)
    lr = None if lr_schedule is None else lr_schedule.lr_at(table["consumed_tokens"])
    summary = summarize(table, total)
    notes: dict[str, Any] = {}
    if advice is not None:
        notes = {"ramp": repr(advice.ramp) if advice.ramp is not None else "none"}
        summary = {
            "n_params": advice.n_params,
            "recommended_batch_tokens": advice.batch_tokens,
            "law_batch_tokens": advice.raw_batch_tokens,
            "law_learning_rate": advice.learning_rate,
            "steps_at_constant_batch": advice.steps,
            "extrapolating": bool(advice.extrapolation),
            **summary,
        }
    if args.json:
        print(json.dumps({"schedule": description, **notes, **summary}, indent=2))
    else:
        print(f"tokenbatch schedule: {description}")
        for key, value in notes.items():
            print(f"{key}: {value}")
        print(f"micro_batch_tokens={micro:,}, dp={args.dp}, total_tokens={total:,}")
        rows = [[k, format_value(v, ".6g")] for k, v in summary.items()]
        print(format_table(["quantity", "value"], rows))
        print()
        rows = _row_indices(table, args)
        print(format_table(*_step_rows(table, lr, rows)))
    if args.output is not None:
        with atomic_output(args.output) as partial:
            save_table(table, lr, partial)
        print(f"wrote {args.output}", file=sys.stderr)
    if args.plot is not None:
        with atomic_output(args.plot) as partial:
            plot_schedule(table, lr, partial, title=description)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def summarize(table: dict[str, npt.NDArray[np.int64]], total_tokens: int) -> dict[str, Any]:
    """Totals of a step table: steps, tokens, first and last batch, ramp length."""
    batch = table["batch_tokens"]
    consumed = table["consumed_tokens"]
    steps = len(batch)
    if steps == 0:
        return {"steps": 0, "consumed_tokens": 0, "leftover_tokens": total_tokens}
    final = int(batch[-1])
    below = np.flatnonzero(batch < final)
    ramp_steps = int(below[-1]) + 1 if below.size else 0
    return {
        "steps": steps,
        "consumed_tokens": int(consumed[-1]),
        "leftover_tokens": total_tokens - int(consumed[-1]),
        "first_batch_tokens": int(batch[0]),
        "final_batch_tokens": final,
        "final_grad_accum_steps": int(table["grad_accum_steps"][-1]),
        "steps_before_final_batch": ramp_steps,
        "tokens_before_final_batch": int(consumed[ramp_steps - 1]) if ramp_steps else 0,
        "distinct_batch_sizes": int(np.unique(batch).size),
    }


def _row_indices(table: dict[str, npt.NDArray[np.int64]], args: argparse.Namespace) -> Any:
    steps = len(table["batch_tokens"])
    if args.steps:
        return np.arange(0, steps, max(1, args.every))
    if steps == 0:
        return np.arange(0)
    # Evenly spaced checkpoints over the ramp (steps before the final batch) and after it.
    batch = table["batch_tokens"]
    below = np.flatnonzero(batch < batch[-1])
    ramp_end = int(below[-1]) + 1 if below.size else 0
    count = max(args.rows, 2)
    if ramp_end == 0:
        picks = np.linspace(0, steps - 1, num=min(count, steps))
    else:
        picks = np.concatenate(
            [
                np.linspace(0, ramp_end, num=min(count // 2, ramp_end + 1)),
                np.linspace(ramp_end, steps - 1, num=min(count - count // 2, steps - ramp_end)),
            ]
        )
    picks = picks.round().astype(np.int64)
    return np.unique(picks)


def _step_rows(
    table: dict[str, npt.NDArray[np.int64]], lr: Any, rows: Any
) -> tuple[list[str], list[list[str]]]:
    header = ["step", "consumed_tokens", "batch_tokens", "batch_sequences", "grad_accum_steps"]
    if lr is not None:
        header.append("lr")
    out = []
    for i in rows.tolist():
        row = [
            f"{i:,}",
            f"{int(table['consumed_tokens'][i]):,}",
            f"{int(table['batch_tokens'][i]):,}",
            f"{int(table['batch_sequences'][i]):,}",
            f"{int(table['grad_accum_steps'][i]):,}",
        ]
        if lr is not None:
            row.append(f"{float(lr[i]):.4e}")
        out.append(row)
    return header, out


def save_table(table: dict[str, npt.NDArray[np.int64]], lr: Any, path: Path) -> None:
    """Write the full table to ``.npz`` (arrays) or ``.csv`` (one row per step)."""
    columns: dict[str, Any] = dict(table)
    if lr is not None:
        columns["lr"] = lr
    if path.suffix == ".csv":
        names = list(columns)
        stacked = np.column_stack([np.asarray(columns[name], dtype=np.float64) for name in names])
        formats = ["%d"] * len(table) + (["%.6e"] if lr is not None else [])
        np.savetxt(path, stacked, fmt=formats, delimiter=",", header=",".join(names), comments="")
    elif path.suffix == ".npz":
        np.savez(path, **columns)
    else:
        raise InvalidValueError(f"--output must end in .npz or .csv, got {str(path)!r}")


def plot_schedule(
    table: dict[str, npt.NDArray[np.int64]], lr: Any, path: Path, *, title: str = ""
) -> None:
    """Plot batch size (and learning rate) against consumed tokens into ``path``."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        raise InvalidValueError(
            "plotting needs matplotlib: pip install 'tokenbatch[plot]'"
        ) from None
    consumed = table["consumed_tokens"]
    figure, batch_axis = plt.subplots(figsize=(8, 4.5))
    batch_axis.step(consumed, table["batch_tokens"], where="pre", color="tab:blue")
    batch_axis.set_xlabel("consumed tokens")
    batch_axis.set_ylabel("global batch (tokens)", color="tab:blue")
    if lr is not None:
        lr_axis = batch_axis.twinx()
        lr_axis.plot(consumed, lr, color="tab:orange")
        lr_axis.set_ylabel("learning rate", color="tab:orange")
    if title:
        batch_axis.set_title(title[:100], fontsize=9)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
