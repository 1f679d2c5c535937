"""Memory-estimate throughput: the Rust grid, broadcast and as a list of scattered
configurations of the same size, against a Python loop over estimate_memory; and the calls
users make one at a time: one estimate, the largest micro-batch, the layout planner on the
published Llama 3.1 405B and DeepSeek-V3 runs.

Run: pytest benches/bench_memory.py --benchmark-enable
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenbatch import (
    ModelSpec,
    estimate_memory,
    estimate_memory_grid,
    max_micro_batch_tokens,
    plan_layouts,
)

SPEC = ModelSpec.preset("llama-3.1-70b")


def _grid_params(cells: int) -> dict[str, Any]:
    """A realistic sweep: seq_len x micro_batch x dp x tp x pp x zero x recompute."""
    seq = np.array([1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072])
    micro = np.arange(1, cells // (8 * 8 * 4 * 5 * 4 * 3) + 2)
    return {
        "seq_len": seq[:, None, None, None, None, None, None],
        "micro_batch": micro[None, :, None, None, None, None, None],
        "dp": np.array([1, 2, 4, 8, 16, 32, 64, 128])[None, None, :, None, None, None, None],
        "tp": np.array([1, 2, 4, 8])[None, None, None, :, None, None, None],
        "pp": np.array([1, 2, 4, 5, 8])[None, None, None, None, :, None, None],
        "zero": np.arange(4)[None, None, None, None, None, :, None],
        "recompute": np.array(["none", "selective", "full"]),
        "sequence_parallel": True,
    }


def _scattered_params(cells: int) -> dict[str, Any]:
    """``cells`` independent candidate layouts: every input is its own column, each drawn
    from the values of the broadcast sweep, so a cell costs what a broadcast cell costs on
    average, but nothing repeats along an axis."""
    rng = np.random.default_rng(0)
    broadcast = _grid_params(cells)
    columns = {
        name: rng.choice(np.ravel(values), cells)
        for name, values in broadcast.items()
        if name != "sequence_parallel"
    }
    return {**columns, "sequence_parallel": rng.integers(0, 2, cells).astype(bool)}


def test_grid_one_million(benchmark: Any) -> None:
    params = _grid_params(1_000_000)
    grid = benchmark(estimate_memory_grid, SPEC, **params)
    assert grid.size >= 1_000_000
    assert grid.valid.any()


def test_grid_one_million_scattered(benchmark: Any) -> None:
    params = _scattered_params(1_013_760)
    grid = benchmark(estimate_memory_grid, SPEC, **params)
    assert grid.shape == (1_013_760,)
    assert grid.valid.any()


def test_grid_one_million_scattered_int32(benchmark: Any) -> None:
    # The same list with its integer columns in int32, read in place like int64 ones.
    params = {
        name: values.astype(np.int32) if values.dtype == np.int64 else values
        for name, values in _scattered_params(1_013_760).items()
    }
    grid = benchmark(estimate_memory_grid, SPEC, **params)
    assert grid.shape == (1_013_760,)
    assert grid.valid.any()


def test_python_loop_thousand(benchmark: Any) -> None:
    layouts = [
        {"seq_len": 4096 * (1 + i % 4), "dp": 8, "tp": 8, "pp": 1 + i % 2, "zero": i % 4}
        for i in range(1000)
    ]

    def loop() -> int:
        return sum(estimate_memory(SPEC, **layout).total for layout in layouts)

    assert benchmark(loop) > 0


def test_plan_512_gpus(benchmark: Any) -> None:
    layouts = benchmark(
        plan_layouts,
        SPEC,
        num_gpus=512,
        gpu_memory=80e9,
        seq_len=8192,
        global_batch_tokens=8192 * 1024,
    )
    assert layouts


def test_estimate_memory_one_call(benchmark: Any) -> None:
    estimate = benchmark(
        estimate_memory, SPEC, seq_len=8192, dp=8, tp=8, pp=4, zero=1, recompute="selective"
    )
    assert estimate.total > 0


def test_max_micro_batch_tokens(benchmark: Any) -> None:
    tokens = benchmark(max_micro_batch_tokens, SPEC, 80e9, dp=8, tp=8, pp=4, zero=1)
    assert tokens > 0


def test_plan_llama_405b_16384_h100(benchmark: Any) -> None:
    # Llama 3.1 405B's published conditions (Dubey et al. 2024, table 4).
    spec = ModelSpec.preset("llama-3.1-405b").replace(implementation="fused")
    layouts = benchmark(
        plan_layouts,
        spec,
        num_gpus=16_384,
        seq_len=8192,
        global_batch_tokens=16 * 2**20,
        hardware="h100",
        top=5,
        cp_comm="all_gather",
        grad_dtype="fp32",
    )
    assert layouts


def test_plan_deepseek_v3_2048_h800(benchmark: Any) -> None:
    # DeepSeek-V3's published conditions (DeepSeek-AI 2024, section 3).
    spec = ModelSpec.preset("deepseek-v3").replace(implementation="fused", mtp_layers=1)
    layouts = benchmark(
        plan_layouts,
        spec,
        num_gpus=2048,
        seq_len=4096,
        global_batch_tokens=15_360 * 4096,
        hardware="h800",
        fp8=True,
        optimizer_dtype="bf16",
        overlap_ep_comm=True,
        deduplicated_dispatch=True,
        top=5,
    )
    assert layouts
