"""Write the table of published runs in docs/scaling.md: for each run of
``tokenbatch.scaling.PUBLISHED_RUNS``, what it used, what every shipped law gives for it
and what the launch plan's default would have chosen.

    python docs/gen_published_runs.py          # rewrite the table in docs/scaling.md
    python docs/gen_published_runs.py --check  # exit 1 if the table is out of date

The tests compare the guide's table with :func:`render` and check the defaults against
the runs with :func:`rows`.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from generated import replace_block, write_or_check

from tokenbatch.scaling import PUBLISHED_RUNS, ExtrapolationWarning, PublishedRun, launch_plan
from tokenbatch.scaling.spread import RunScale, Spread, choose

GUIDE = Path(__file__).resolve().parent / "scaling.md"
BEGIN = "<!-- published runs: begin (python docs/gen_published_runs.py) -->"
END = "<!-- published runs: end -->"
PLAN_GPUS = 8
"""A plan from a parameter count rounds its batch to ``PLAN_GPUS`` sequences."""


@dataclass(frozen=True)
class Row:
    """One published run beside the default plan for it."""

    run: PublishedRun
    batch: Spread
    lr: Spread
    default_batch: float
    """The plan's final batch (dense runs) or the chosen law's batch (mixtures of experts)."""
    default_lr: float
    """The plan's peak learning rate, or the chosen law's rate at ``default_batch``."""

    def batch_ratio(self) -> float | None:
        """The default batch over the run's (``None`` when the run's is not published)."""
        used = self.run.batch_tokens
        return None if used is None else self.default_batch / used

    def lr_ratio(self) -> float | None:
        """The default peak learning rate over the run's."""
        used = self.run.peak_lr
        return None if used is None else self.default_lr / used


def rows() -> list[Row]:
    """Every published run with the default plan's batch and learning rate for it.

    A dense run is planned as a user would plan it, ``launch_plan`` with its parameter
    count, tokens and sequence length; a mixture of experts (which a parameter count
    cannot describe) gets the same choice of laws, unrounded.
    """
    result = []
    for run in PUBLISHED_RUNS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExtrapolationWarning)
            if run.mixture_of_experts:
                scale = RunScale.of_run(run)
                batch = choose("batch", scale)
                lr = choose("lr", scale, at_batch=batch.value)
                result.append(Row(run, batch, lr, batch.value, lr.value))
                continue
            plan = launch_plan(
                run.n_params, int(run.tokens), num_gpus=PLAN_GPUS, seq_len=run.seq_len
            )
        result.append(Row(run, plan.batch_spread, plan.lr_spread, plan.batch_tokens, plan.peak_lr))
    return result


def _batch(value: float) -> str:
    return f"{value / 1e6:.1f}M"


def _rate(value: float) -> str:
    return f"{value:.2g}"


def _laws(spread: Spread) -> str:
    text = []
    for item in spread.estimates:
        value = _batch(item.value) if spread.quantity == "batch" else _rate(item.value)
        text.append(f"**{value}**" if item.law == spread.chosen else value)
    return " / ".join(text)


def _used(value: float | None, ratio: float | None, shown: str) -> str:
    if value is None or ratio is None:
        return f"not published; {shown}"
    flag = "" if 0.5 <= ratio <= 2 else " (!)"
    return f"{shown} ({ratio:.2f}x){flag}"


def render() -> str:
    """The table, between its markers, as the guide holds it."""
    lines = [
        BEGIN,
        "",
        "| run | parameters | tokens | batch used | default batch | batch laws: Schaipp / "
        "Step / DeepSeek / Porian / Kaplan | peak LR used | default LR | LR laws: Step / "
        "DeepSeek / Porian |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows():
        run = row.run
        params = f"{run.n_params / 1e9:.3g}B"
        if run.active_params is not None:
            params += f" ({run.active_params / 1e9:.3g}B active)"
        used_batch = "not published" if run.batch_tokens is None else _batch(run.batch_tokens)
        used_lr = "not published" if run.peak_lr is None else _rate(run.peak_lr)
        lines.append(
            f"| {run.name} | {params} | {run.tokens / 1e12:.3g}T | {used_batch} | "
            f"{_used(run.batch_tokens, row.batch_ratio(), _batch(row.default_batch))} | "
            f"{_laws(row.batch)} | {used_lr} | "
            f"{_used(run.peak_lr, row.lr_ratio(), _rate(row.default_lr))} | "
            f"{_laws(row.lr)} |"
        )
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    updated = replace_block(GUIDE.read_text(encoding="utf-8"), BEGIN, END, render())
    return write_or_check(GUIDE, updated, argv, "python docs/gen_published_runs.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
