"""The step-time model against measured runs (docs/gen_step_time_validation.py) and the
trends a pipeline must show.

Llama 3 405B (Dubey et al. 2024, "The Llama 3 Herd of Models", table 4): TP8 x PP16 at
a global batch of 16M tokens of 8,192, on 8,192 GPUs (DP64) at 430 TFLOP/s per GPU and
on 16,384 GPUs (DP128) at 400: half the micro-batches per pipeline, more bubble.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from script_module import load_script

from tokenbatch import ModelSpec, plan_layouts
from tokenbatch.memory import HARDWARE, PlannedLayout
from tokenbatch.memory.options import scalar_inputs
from tokenbatch.memory.steptime import TIME_PARTS, step_time
from tokenbatch.memory.steptime_fit import LAYER_PASS_OVERHEAD, MATMUL_EFFICIENCY

DOCS = Path(__file__).resolve().parent.parent / "docs"
LLAMA = ModelSpec.preset("llama-3.1-405b").replace(implementation="fused")


@pytest.fixture(scope="module")
def generator() -> Any:
    return load_script(DOCS / "gen_step_time_validation.py", "gen_step_time_validation")


@pytest.fixture(scope="module")
def rows(generator: Any) -> list[Any]:
    return list(generator.rows())


def test_predictions_match_the_published_runs(rows: list[Any]) -> None:
    assert len(rows) == 19
    assert {row.run.source for row in rows} == {"A", "B"}
    errors = np.abs([row.error() for row in rows])
    assert np.median(errors) <= 0.05, errors
    # One run is further off than the 15% aimed at (the 1.5B model of the H100 table,
    # whose planned micro-batch hides the data-parallel traffic: see docs/memory.md).
    assert (errors > 0.15).sum() <= 1, errors
    assert errors.max() < 0.25, errors


def test_the_table_is_the_generators(generator: Any) -> None:
    text = (DOCS / "memory.md").read_text(encoding="utf-8")
    table = generator.render()
    assert table in text, (
        "the step-time table is out of date: python docs/gen_step_time_validation.py"
    )
    body = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(body) == 1 + 19
    assert generator.main(["--check"]) == 0


def test_the_generator_times_the_planners_candidates(generator: Any, rows: list[Any]) -> None:
    # The fit evaluates the step-time model on the planned candidates directly: with the
    # stored constants it must give what the planner gives, for every run.
    for row in rows[::4]:
        columns = generator._columns(row.run.spec, row.run.candidates())
        ours = generator.predicted(row.run, columns, (MATMUL_EFFICIENCY, LAYER_PASS_OVERHEAD))
        assert ours == pytest.approx(row.predicted(), rel=1e-12)


def _llama(num_gpus: int, **options: Any) -> list[PlannedLayout]:
    layouts = plan_layouts(
        LLAMA,
        num_gpus=num_gpus,
        seq_len=8192,
        global_batch_tokens=16 * 2**20,
        hardware="h100",
        cp_comm="all_gather",
        grad_dtype="fp32",
        distinct=False,
        top=None,
        **options,
    )
    dp = num_gpus // 128
    return [x for x in layouts if (x.dp, x.tp, x.pp, x.cp) == (dp, 8, 16, 1)]


def test_throughput_per_gpu_falls_when_micro_batches_run_short() -> None:
    small, large = _llama(8192, recompute="full"), _llama(16_384, recompute="full")
    per_gpu_small = small[0].tokens_per_second / 8192
    per_gpu_large = large[0].tokens_per_second / 16_384
    # Measured: 430 to 400 TFLOP/s per GPU, a fall of 7%.
    assert 0.85 < per_gpu_large / per_gpu_small < 0.99

    # Every setting planned at both scales loses throughput per GPU at the larger one.
    def key(x: PlannedLayout) -> tuple[Any, ...]:
        return (x.micro_batch, x.vpp, x.zero, x.recompute)

    at_small = {key(x): x.tokens_per_second / 8192 for x in small}
    pairs = [(at_small[key(x)], x.tokens_per_second / 16_384) for x in large if key(x) in at_small]
    assert len(pairs) >= 4
    assert all(b < a for a, b in pairs)
    # The bubble's share of the step grows as the micro-batches per stage halve.
    share = {x.grad_accum_steps: x.time_parts["bubble"] / x.step_time for x in small + large}
    assert share[16] > share[32]


def test_explain_lists_every_part_with_its_share() -> None:
    layout = plan_layouts(
        ModelSpec.preset("llama-3.1-8b").replace(implementation="fused"),
        num_gpus=64,
        seq_len=8192,
        global_batch_tokens=8192 * 256,
        hardware="h100",
        top=1,
    )[0]
    text = layout.explain()
    for part in TIME_PARTS:
        line = next(line for line in text.splitlines() if line.strip().startswith(part))
        share = layout.time_parts[part] / layout.step_time
        assert f"{share:.1%}" in line
    for part in ("elementwise", "overhead", "optimizer"):
        assert layout.time_parts[part] > 0
    assert layout.step_time == pytest.approx(sum(layout.time_parts.values()))


def test_a_faster_memory_speeds_the_element_wise_parts() -> None:
    spec = ModelSpec.preset("llama-3.2-1b").replace(implementation="fused")
    kwargs: dict[str, Any] = {"num_gpus": 8, "seq_len": 4096, "global_batch_tokens": 4096 * 64}
    slow = plan_layouts(spec, hardware="h100", **kwargs)[0]
    fast = plan_layouts(spec, hardware="h200", **kwargs)[0]
    assert fast.time_parts["elementwise"] < slow.time_parts["elementwise"]
    assert fast.step_time < slow.step_time


@pytest.fixture(scope="module")
def small_run(generator: Any) -> tuple[Any, dict[str, Any]]:
    run = generator.runs()[1]
    return run, generator._columns(run.spec, run.candidates())


@settings(max_examples=30, deadline=None)
@given(
    efficiency=st.floats(0.2, 0.9),
    faster=st.floats(1.0, 1.5),
    overhead=st.floats(0.0, 1e-3),
    more=st.floats(0.0, 1e-3),
    tax=st.floats(0.0, 0.5),
)
def test_every_constant_moves_the_step_time_one_way(
    small_run: tuple[Any, dict[str, Any]],
    efficiency: float,
    faster: float,
    overhead: float,
    more: float,
    tax: float,
) -> None:
    run, columns = small_run

    def times(efficiency: float, overhead: float, tax: float) -> Any:
        parts = step_time(
            run.spec,
            columns,
            hw=HARDWARE[run.gpu],
            seq_len=run.seq_len,
            efficiency=efficiency,
            inputs=scalar_inputs(run.options()),
            layer_pass_overhead=overhead,
            overlap_tax=tax,
        )
        assert all((parts[part] >= 0).all() for part in TIME_PARTS)
        np.testing.assert_allclose(sum(parts[part] for part in TIME_PARTS), parts["total"])
        return parts["total"]

    base = times(efficiency, overhead, tax)
    assert (times(min(1.0, efficiency * faster), overhead, tax) <= base * (1 + 1e-12)).all()
    assert (times(efficiency, overhead + more, tax) >= base * (1 - 1e-12)).all()
    assert (times(efficiency, overhead, tax + 0.1) >= base * (1 - 1e-12)).all()
