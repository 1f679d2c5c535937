"""Hold the planner's step-time model against published training throughput.

    python docs/gen_step_time_validation.py          # rewrite the table in docs/memory.md
    python docs/gen_step_time_validation.py --check  # exit 1 if the table is out of date
    python docs/gen_step_time_validation.py --fit    # refit the constants, rewrite them

Every run of ``step_time_runs.csv`` is planned as a user would plan it (its model, GPUs,
sequence length, global batch and recomputation) and the planner's fastest candidate of
the published (dp, tp, pp, cp) is compared with the measured tokens per second per GPU:
the source's TFLOP/s per GPU over the source's own FLOPs per token, so the FLOP
convention cancels. The tests check the error and that the table is current.
"""

from __future__ import annotations

import csv
import itertools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from generated import replace_block, write_or_check

from tokenbatch import ModelSpec, _core, plan_layouts
from tokenbatch.memory import HARDWARE, PlannedLayout
from tokenbatch.memory.options import scalar_inputs
from tokenbatch.memory.steptime import step_time
from tokenbatch.memory.steptime_fit import LAYER_PASS_OVERHEAD, MATMUL_EFFICIENCY

DOCS = Path(__file__).resolve().parent
RUNS = DOCS / "step_time_runs.csv"
GUIDE = DOCS / "memory.md"
FIT = DOCS.parent / "python" / "tokenbatch" / "memory" / "steptime_fit.py"
BEGIN = "<!-- step-time validation: begin (python docs/gen_step_time_validation.py) -->"
END = "<!-- step-time validation: end -->"
SOURCES = {"A": "Narayanan et al. 2021, table 1", "B": "Megatron-Core README, H100"}
_COLUMNS = [
    "source",
    "hidden_size",
    "num_layers",
    "num_heads",
    "ffn_size",
    "vocab_size",
    "seq_len",
    "gpu",
    "num_gpus",
    "tp",
    "pp",
    "virtual_stages",
    "dp",
    "global_batch_sequences",
    "micro_batch",
    "recompute",
    "measured_tflops_per_gpu",
    "source_flops_per_token",
]


@dataclass(frozen=True)
class Run:
    """One published run: its model, layout and measured throughput."""

    source: str
    spec: ModelSpec
    seq_len: int
    gpu: str
    num_gpus: int
    dp: int
    tp: int
    pp: int
    global_batch: int
    recompute: str
    measured_tflops: float
    flops_convention: str

    def flops_per_token(self) -> float:
        """The source's own FLOPs per token (Narayanan et al. 2021, eq. 3, counting the
        recomputed forward; or Megatron-LM's model FLOPs)."""
        h, layers, s = self.spec.hidden_size, self.spec.num_layers, self.seq_len
        vocab = self.spec.vocab_size
        if self.flops_convention == "ptdp96":
            return 96.0 * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))
        return 72.0 * layers * h * h * (1 + s / (6 * h) + vocab / (12 * layers * h))

    def measured(self) -> float:
        """Measured tokens per second per GPU."""
        return self.measured_tflops * 1e12 / self.flops_per_token()

    def options(self) -> dict[str, Any]:
        """The memory options the source states: 2021's Megatron-LM ran eager attention
        (its fused softmax over the whole score matrix)."""
        return {"attention": "eager"} if self.source == "A" else {}

    def candidates(self) -> list[PlannedLayout]:
        """Every candidate of the published layout that fits, fastest first."""
        modes = [self.recompute] if self.recompute != "unknown" else ["none", "selective", "full"]
        layouts = plan_layouts(
            self.spec,
            num_gpus=self.num_gpus,
            seq_len=self.seq_len,
            global_batch_tokens=self.global_batch * self.seq_len,
            hardware=self.gpu,
            recompute=modes,
            distinct=False,
            top=None,
            **self.options(),
        )
        return [x for x in layouts if (x.dp, x.tp, x.pp, x.cp) == (self.dp, self.tp, self.pp, 1)]


def runs() -> list[Run]:
    """The runs of ``step_time_runs.csv``: GPT models (FFN 4h, GeLU, LayerNorm, biases,
    tied embeddings; learned positions in the 2021 runs)."""
    lines = [line for line in RUNS.read_text().splitlines() if not line.startswith("#")]
    result = []
    for row in csv.DictReader(lines, fieldnames=_COLUMNS):
        seq_len = int(row["seq_len"])
        spec = ModelSpec(
            hidden_size=int(row["hidden_size"]),
            num_layers=int(row["num_layers"]),
            num_heads=int(row["num_heads"]),
            ffn_size=int(row["ffn_size"]),
            vocab_size=int(row["vocab_size"]),
            ffn_type="gelu",
            norm="layernorm",
            tied_embeddings=True,
            linear_bias=True,
            learned_positions=seq_len if row["source"] == "A" else 0,
            implementation="fused",
        )
        result.append(
            Run(
                source=row["source"],
                spec=spec,
                seq_len=seq_len,
                gpu=row["gpu"],
                num_gpus=int(row["num_gpus"]),
                dp=int(row["dp"]),
                tp=int(row["tp"]),
                pp=int(row["pp"]),
                global_batch=int(row["global_batch_sequences"]),
                recompute=row["recompute"],
                measured_tflops=float(row["measured_tflops_per_gpu"]),
                flops_convention=row["source_flops_per_token"],
            )
        )
    return result


def _columns(spec: ModelSpec, layouts: list[PlannedLayout]) -> dict[str, np.ndarray]:
    """The step-time model's columns for planned layouts."""
    c: dict[str, list[float]] = {}
    for x in layouts:
        row = {
            "dp": x.dp,
            "tp": x.tp,
            "pp": x.pp,
            "cp": x.cp,
            "ep": x.ep,
            "vpp": x.vpp,
            "zero": x.zero,
            "recompute": _core.memory_option_code("recompute", x.recompute),
            "micro_batch": x.micro_batch,
            "grad_accum_steps": x.grad_accum_steps,
            "first_layers": x.stage_layers[0],
            "middle_layers": max(x.stage_layers),
            "last_layers": x.stage_layers[-1],
        }
        for k, v in row.items():
            c.setdefault(k, []).append(float(v))
    return {k: np.asarray(v) for k, v in c.items()}


Constants = tuple[float, float]
"""Matmul efficiency and seconds of overhead per layer pass."""


def predicted(run: Run, columns: dict[str, np.ndarray], constants: Constants) -> float:
    """Tokens per second per GPU of the fastest candidate in ``columns`` (from
    :func:`_columns`) under the constants given."""
    efficiency, overhead = constants
    times = step_time(
        run.spec,
        columns,
        hw=HARDWARE[run.gpu],
        seq_len=run.seq_len,
        efficiency=efficiency,
        inputs=scalar_inputs(run.options()),
        layer_pass_overhead=overhead,
    )
    tokens = run.global_batch * run.seq_len
    return float(tokens / times["total"].min() / run.num_gpus)


def fit() -> Constants:
    """The constants that minimize the squared relative error of every run's prediction:
    a grid over both, then finer grids around the best point. The candidates that
    fit in memory do not depend on the constants, so each run's are planned once."""
    cases = [(run, _columns(run.spec, run.candidates())) for run in runs()]

    def loss(constants: Constants) -> float:
        errors = [predicted(r, c, constants) / r.measured() - 1 for r, c in cases]
        return float(np.sum(np.square(errors)))

    best: Constants = (MATMUL_EFFICIENCY, LAYER_PASS_OVERHEAD)
    for steps in ((0.04, 40e-6), (0.01, 10e-6), (0.002, 2e-6)):
        axes = [[v for v in best[i] + steps[i] * np.arange(-4, 5) if v >= 0] for i in range(2)]
        grid = [(float(e), float(o)) for e, o in itertools.product(*axes) if 0 < e <= 1]
        best = min(grid, key=loss)
    return round(best[0], 3), round(best[1], 7)


@dataclass(frozen=True)
class Row:
    """One run beside the planner's prediction for it."""

    run: Run
    layout: PlannedLayout

    def predicted(self) -> float:
        return self.layout.tokens_per_second / self.run.num_gpus

    def error(self) -> float:
        return self.predicted() / self.run.measured() - 1


def rows() -> list[Row]:
    """Every run with the planner's fastest candidate of its published layout."""
    return [Row(run, run.candidates()[0]) for run in runs()]


def render() -> str:
    """The table, between its markers, as the guide holds it."""
    lines = [
        BEGIN,
        "",
        "| source | model (h, layers) | GPUs | dp x tp x pp | batch | planned: micro-batch x "
        "steps, vpp, ZeRO, recompute | measured tokens/s/GPU | predicted | error |",
        "|---|---|---:|---|---:|---|---:|---:|---:|",
    ]
    table = rows()
    for row in table:
        run, x = row.run, row.layout
        lines.append(
            f"| {SOURCES[run.source]} | {run.spec.num_params() / 1e9:.1f}B "
            f"({run.spec.hidden_size}, {run.spec.num_layers}) | "
            f"{run.num_gpus:,} {run.gpu.upper()} | "
            f"{run.dp} x {run.tp} x {run.pp} | {run.global_batch:,} x {run.seq_len:,} | "
            f"{x.micro_batch} x {x.grad_accum_steps}, {x.vpp}, {x.zero}, {x.recompute} | "
            f"{run.measured():,.0f} | {row.predicted():,.0f} | {row.error():+.1%} |"
        )
    errors = np.abs([row.error() for row in table])
    lines += [
        "",
        f"Median absolute error {np.median(errors):.1%}, largest {errors.max():.1%} "
        f"(fitted: matmul efficiency {MATMUL_EFFICIENCY}, {LAYER_PASS_OVERHEAD * 1e6:g} us per "
        f"layer pass).",
        "",
        END,
    ]
    return "\n".join(lines)


def _write_fit(constants: Constants) -> None:
    text = FIT.read_text(encoding="utf-8")
    for name, value in zip(("MATMUL_EFFICIENCY", "LAYER_PASS_OVERHEAD"), constants, strict=True):
        text = re.sub(rf"^{name} = .*$", f"{name} = {value!r}", text, flags=re.MULTILINE)
    FIT.write_text(text, encoding="utf-8")


def main(argv: list[str]) -> int:
    if "--fit" in argv:
        constants = fit()
        print("matmul efficiency {}, overhead per layer pass {} s".format(*constants))
        _write_fit(constants)
        return 0
    updated = replace_block(GUIDE.read_text(encoding="utf-8"), BEGIN, END, render())
    return write_or_check(GUIDE, updated, argv, "python docs/gen_step_time_validation.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
