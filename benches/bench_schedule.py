"""Schedule arithmetic: per-step tables, vectorized batch_at, grouping, law fitting,
Megatron-LM export and launch plans.

Baselines are the straightforward pure-Python / numpy versions of the same computation.
Run: ``pytest benches/bench_schedule.py --benchmark-only``.
"""

from __future__ import annotations

import warnings

import numpy as np
import numpy.typing as npt
import pytest

import tokenbatch as tb
from tokenbatch.megatron import from_step_batch_size_schedule, to_step_batch_size_schedule
from tokenbatch.scaling import ExtrapolationWarning, ThreeTermLaw, launch_plan
from tokenbatch.schedule import LinearRamp, MegatronRampup, gpt3_ramp, group_into_steps

# DeepSeek-V3's ramp in tokens, micro-batch 4,096 tokens, dp=16: ~1M steps for 62.5T tokens.
RAMP = LinearRamp(3072 * 4096, 15360 * 4096, 469_000_000_000, multiple_of=4096 * 16)
TOTAL_1M_STEPS = 62_500_000_000_000


def python_table(
    schedule: LinearRamp, total_tokens: int, micro_batch_tokens: int, dp: int
) -> dict[str, list[int]]:
    """The table as a plain Python loop over the same ramp formula."""
    start, end, ramp, grid = (
        schedule.start,
        schedule.end,
        schedule.ramp_tokens,
        schedule.multiple_of,
    )
    round_tokens = micro_batch_tokens * dp
    consumed = 0
    rows: dict[str, list[int]] = {"batch_tokens": [], "grad_accum_steps": [], "consumed_tokens": []}
    while True:
        if consumed >= ramp:
            batch = end
        else:
            batch = max(start, (start + (end - start) * consumed // ramp) // grid * grid)
        if consumed + batch > total_tokens:
            break
        consumed += batch
        rows["batch_tokens"].append(batch)
        rows["grad_accum_steps"].append(batch // round_tokens)
        rows["consumed_tokens"].append(consumed)
    return rows


def test_table_1m_steps(benchmark: pytest.FixtureRequest) -> None:
    table = benchmark(RAMP.table, TOTAL_1M_STEPS, 4096, 16)
    assert 990_000 < len(table["batch_tokens"]) < 1_010_000


def test_table_python_loop_1m_steps(benchmark: pytest.FixtureRequest) -> None:
    rows = benchmark(python_table, RAMP, TOTAL_1M_STEPS, 4096, 16)
    assert rows["batch_tokens"] == RAMP.table(TOTAL_1M_STEPS, 4096, 16)["batch_tokens"].tolist()


CONSUMED = np.sort(np.random.default_rng(0).integers(0, 10**12, size=10_000_000))


def numpy_batch_at(tokens: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The linear ramp in numpy (float64: exact only while the products fit 53 bits)."""
    start, end, ramp, grid = RAMP.start, RAMP.end, RAMP.ramp_tokens, RAMP.multiple_of
    fraction = np.minimum(tokens, ramp) / ramp
    raw = np.floor(start + (end - start) * fraction).astype(np.int64)
    return np.maximum(start, raw // grid * grid)


def test_batch_at_10m_points(benchmark: pytest.FixtureRequest) -> None:
    batches = benchmark(RAMP.batch_at, CONSUMED)
    assert batches.shape == CONSUMED.shape


def test_batch_at_10m_points_numpy(benchmark: pytest.FixtureRequest) -> None:
    batches = benchmark(numpy_batch_at, CONSUMED)
    assert batches.shape == CONSUMED.shape


MICRO_BATCHES = np.random.default_rng(1).integers(7000, 8193, size=1_000_000)


def test_group_into_steps_1m_micro_batches(benchmark: pytest.FixtureRequest) -> None:
    ramp = LinearRamp(2**20, 2**23, 2 * 10**9)
    offsets = benchmark(group_into_steps, MICRO_BATCHES, ramp, 8)
    assert offsets[-1] == MICRO_BATCHES.size // 8


def test_megatron_train_iters(benchmark: pytest.FixtureRequest) -> None:
    ramp = MegatronRampup(32, 32, 200_000_000, 4096)
    iters = benchmark(ramp.train_iters, 1_000_000_000)
    assert iters > 0


def test_fit_three_term_law_128_runs(benchmark: pytest.FixtureRequest) -> None:
    law = ThreeTermLaw(E=1.8, A=300.0, alpha=0.33, B=40.0, beta=0.3, C=25.0, gamma=0.4)
    n, m, k = (
        a.ravel()
        for a in np.meshgrid(
            [5e7, 1.5e8, 5e8, 1.5e9], 2.0 ** np.arange(15, 23), [500, 2000, 8000, 32000]
        )
    )
    loss = law.loss(n, m, k) * np.exp(np.random.default_rng(2).normal(0, 0.002, n.size))
    fit = benchmark(ThreeTermLaw.fit, n, m, k, loss)
    assert fit.batch_exponent == pytest.approx(law.batch_exponent, rel=0.05)


# GPT-3's ramp: 16 -> 1,536 sequences of 2,048 over 4B tokens, 95 changes in 1.95M samples.
GPT3 = gpt3_ramp()


def every_sample_entries(schedule: LinearRamp) -> str:
    """The exact export written the direct way: the batch at every sample of the ramp, in
    one vectorized call, keeping the samples where it changes."""
    assert schedule.seq_len is not None
    samples = np.arange(-(-schedule.ramp_tokens // schedule.seq_len) + 1, dtype=np.int64)
    batches = schedule.batch_tokens_at(samples * schedule.seq_len) // schedule.seq_len
    changes = np.flatnonzero(np.diff(batches)) + 1
    starts = np.concatenate([[0], changes])
    return " ".join(f"{int(c) * schedule.seq_len}:{int(batches[c])}" for c in starts)


def test_megatron_export_gpt3_ramp(benchmark: pytest.FixtureRequest) -> None:
    text = benchmark(to_step_batch_size_schedule, GPT3)
    assert from_step_batch_size_schedule(text, seq_length=2048).pieces == [
        (int(t) // 2048, int(b))
        for t, b in (entry.split(":") for entry in every_sample_entries(GPT3).split())
    ]


def test_megatron_export_gpt3_ramp_every_sample(benchmark: pytest.FixtureRequest) -> None:
    text = benchmark(every_sample_entries, GPT3)
    assert text.count(":") == 96


def test_megatron_parse_deepseek_v3_ramp(benchmark: pytest.FixtureRequest) -> None:
    text = to_step_batch_size_schedule(tb.schedule.deepseek_v3_ramp())
    schedule = benchmark(from_step_batch_size_schedule, text, seq_length=4096)
    assert len(schedule.pieces) == 12_289


def _quiet_launch_plan(spec: tb.ModelSpec, tokens: int, **options: object) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        return launch_plan(spec, tokens, gpu_memory=80e9, **options)  # type: ignore[arg-type]


def test_launch_plan_7b_2t_tokens_256_gpus(benchmark: pytest.FixtureRequest) -> None:
    spec = tb.ModelSpec.preset("mistral-7b")
    result = benchmark(_quiet_launch_plan, spec, 2 * 10**12, num_gpus=256, seq_len=4096)
    assert result is not None


def test_launch_plan_8b_15t_tokens_512_gpus(benchmark: pytest.FixtureRequest) -> None:
    spec = tb.ModelSpec.preset("llama-3.1-8b")
    result = benchmark(_quiet_launch_plan, spec, 15 * 10**12, num_gpus=512, seq_len=8192)
    assert result is not None
