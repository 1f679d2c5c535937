"""Scaling laws: the three-term law, its fit, published laws and recommendations."""

from __future__ import annotations

import math
import warnings

import numpy as np
import numpy.typing as npt
import pytest

import tokenbatch
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.megatron import from_step_batch_size_schedule
from tokenbatch.scaling import (
    LAWS,
    BatchLaw,
    ExtrapolationWarning,
    LaunchPlan,
    ThreeTermLaw,
    deepseek_llm,
    kaplan_critical_batch,
    launch_plan,
    mccandlish_tradeoff,
    recommend,
    step_law,
)
from tokenbatch.schedule import ConstantLR, LinearRamp

TRUE = ThreeTermLaw(E=1.8, A=300.0, alpha=0.33, B=40.0, beta=0.3, C=25.0, gamma=0.4)
PUBLISHED = BatchLaw.published("schaipp-2026")

_F = npt.NDArray[np.float64]


def _grid() -> tuple[_F, _F, _F]:
    """Runs at 4 model sizes x 8 batch sizes (most of them suboptimal) x 4 step counts."""
    n, m, k = np.meshgrid(
        [5e7, 1.5e8, 5e8, 1.5e9], 2.0 ** np.arange(15, 23), [500, 2000, 8000, 32000], indexing="ij"
    )
    return n.ravel(), m.ravel(), k.ravel()


def test_optimal_batch_formula_and_optimality() -> None:
    tokens = 1e11
    best = TRUE.optimal_batch(tokens)
    expected = (0.3 * 40 / (0.4 * 25)) ** (1 / 0.7) * tokens ** (0.4 / 0.7)
    assert best == pytest.approx(expected)
    # It minimises the loss over batch sizes at a fixed token budget.
    batches = best * np.exp(np.linspace(-2, 2, 401))
    losses = TRUE.loss(1e9, batches, tokens / batches)
    assert batches[np.argmin(losses)] == pytest.approx(best, rel=0.011)


def test_extra_tokens_range_costs_exactly_the_extra_tokens() -> None:
    tokens = 1e11
    low, high = TRUE.near_optimal_range(tokens, 0.05, definition="extra_tokens")
    best = TRUE.optimal_batch(tokens)
    assert low < best < high
    target = TRUE.loss(1e9, best, tokens / best)
    floor = TRUE.E + TRUE.A / 1e9**TRUE.alpha
    for batch in (low, high):
        # Tokens a run at this batch needs to reach the optimal loss: 5% more.
        steps = (TRUE.C / (target - floor - TRUE.B / batch**TRUE.beta)) ** (1 / TRUE.gamma)
        assert batch * steps == pytest.approx(1.05 * tokens, rel=1e-6)
    wider = TRUE.near_optimal_range(tokens, 0.2, definition="extra_tokens")
    assert wider[0] < low
    assert wider[1] > high


@pytest.mark.parametrize("law", [TRUE.batch_law, PUBLISHED], ids=["synthetic", "schaipp-2026"])
def test_paper_range_ends_satisfy_the_definition(law: BatchLaw) -> None:
    for tokens in (3e9, 1e11, 2e12):
        low, high = law.near_optimal_range(tokens, 0.05)
        best = law.optimal_batch(tokens)
        assert low < best < high
        # Loss with D tokens at each end == the optimum's loss with 0.95 D tokens.
        worst = law.loss(law.optimal_batch(0.95 * tokens), 0.95 * tokens)
        for end in (low, high):
            assert law.loss(end, tokens) == pytest.approx(worst, rel=1e-9)
            assert law.token_fraction(end, tokens) == pytest.approx(0.95, rel=1e-8)
        # Just inside the range the batch is better than that, just outside worse.
        assert law.loss(low * 1.001, tokens) < worst < law.loss(low * 0.999, tokens)
        assert law.loss(high * 0.999, tokens) < worst < law.loss(high * 1.001, tokens)


def test_published_exponents_give_a_4x_range_and_387x_in_extra_tokens() -> None:
    widths = set()
    for tokens in (3e9, 1e11, 2e12):
        low, high = PUBLISHED.near_optimal_range(tokens, 0.05)
        widths.add(round(high / low, 6))
        assert high / low == pytest.approx(4.0, rel=1e-3)
        # The range in extra tokens is narrower (3.87x) and its ends move by 1% to 5%.
        other_low, other_high = PUBLISHED.near_optimal_range(
            tokens, 0.05, definition="extra_tokens"
        )
        assert other_high / other_low == pytest.approx(3.87, abs=0.01)
        assert 0.01 < other_low / low - 1 < 0.05
        assert 0.005 < other_high / high - 1 < 0.05
    assert len(widths) == 1  # the width does not depend on the budget
    # Nor on the scale of B and C: only the exponents matter.
    scaled = BatchLaw(
        B=7 * PUBLISHED.B, beta=PUBLISHED.beta, C=7 * PUBLISHED.C, gamma=PUBLISHED.gamma
    )
    assert scaled.near_optimal_range(1e11) == pytest.approx(PUBLISHED.near_optimal_range(1e11))


def test_critical_batch_is_where_steps_and_tokens_trade_evenly() -> None:
    law = TRUE.batch_law
    reducible = law.loss(law.optimal_batch(1e11), 1e11)
    crit = law.critical_batch(reducible)

    def log_steps(batch: float) -> float:
        return math.log(law.tokens_to_reach(batch, reducible) / batch)

    # d ln K / d ln M = -1/2: 1% more batch saves 0.5% of the steps for 0.5% more tokens.
    h = 1e-5
    slope = (log_steps(crit * math.exp(h)) - log_steps(crit * math.exp(-h))) / (2 * h)
    assert slope == pytest.approx(-0.5, abs=1e-6)
    # It is the batch with the smallest steps x tokens.
    batches = crit * np.exp(np.linspace(-1, 1, 2001))
    products = [law.tokens_to_reach(b, reducible) ** 2 / b for b in batches]
    assert batches[int(np.argmin(products))] == pytest.approx(crit, rel=2e-3)
    ratio = ((2 * law.beta + law.gamma) / (law.beta + law.gamma)) ** (1 / law.beta)
    assert crit == pytest.approx(ratio * law.min_tokens_batch(reducible))
    # On McCandlish's hyperbola the same definition gives his critical batch.
    grid = 2.0 ** np.linspace(10, 30, 2001)
    mccandlish = [math.prod(mccandlish_tradeoff(b, 2**20)) for b in grid]
    assert grid[int(np.argmin(mccandlish))] == pytest.approx(2**20, rel=0.01)


def test_mccandlish_critical_batch_and_minimum_steps_and_tokens() -> None:
    n, tokens = 1e9, 1e11
    best = TRUE.optimal_batch(tokens)
    target = TRUE.loss(n, best, tokens / best)
    reducible = target - TRUE.E - TRUE.A / n**TRUE.alpha
    # The token-optimal batch for the loss reached at D is the loss-optimal batch at D.
    assert TRUE.min_tokens(target, n) == pytest.approx(tokens, rel=1e-9)
    assert TRUE.min_tokens_batch(target, n) == pytest.approx(best, rel=1e-9)
    s_min = TRUE.min_steps(target, n)
    crit = TRUE.mccandlish_critical_batch(target, n)
    assert crit == pytest.approx(tokens / s_min)
    assert crit == pytest.approx(best * ((0.3 + 0.4) / 0.3) ** (1 / 0.4))
    assert TRUE.critical_batch(target, n) == pytest.approx(TRUE.batch_law.critical_batch(reducible))
    # This law is not McCandlish's hyperbola: at his critical batch, steps and tokens are
    # both well above twice their minimum (2.46x here, 18.7x for the published exponents).
    for law, expected in ((TRUE.batch_law, 2.4627), (PUBLISHED, 18.7295)):
        r = law.loss(law.optimal_batch(tokens), tokens)
        mccandlish = law.mccandlish_critical_batch(r)
        needed = law.tokens_to_reach(mccandlish, r)
        assert needed / law.min_tokens(r) == pytest.approx(expected, rel=1e-4)
        assert needed / mccandlish / law.min_steps(r) == pytest.approx(expected, rel=1e-4)
    # Steps needed fall towards S_min as the batch grows.
    huge = 1e13
    steps_needed = (TRUE.C / (target - TRUE.loss(n, huge, 1e300))) ** (1 / TRUE.gamma)
    assert steps_needed == pytest.approx(s_min, rel=0.05)
    with pytest.raises(InvalidValueError, match=r"not reachable"):
        TRUE.min_steps(1.5, n)


@pytest.mark.parametrize("law", [TRUE.batch_law, PUBLISHED], ids=["synthetic", "schaipp-2026"])
def test_critical_tokens_start_a_batch_at_its_critical_point(law: BatchLaw) -> None:
    for batch in (2.0**20, 2.0**23):
        start = law.critical_tokens(batch)
        assert law.critical_batch(law.loss(batch, start)) == pytest.approx(batch, rel=1e-9)
        assert law.critical_batch(law.loss(batch, start * 1.01)) > batch
        # A 2^(-1/gamma) share of the budget for which this batch is optimal.
        optimal_for = 1e10 * (batch / law.optimal_batch(1e10)) ** (1 / law.batch_exponent)
        assert start == pytest.approx(optimal_for * 2 ** (-1 / law.gamma), rel=1e-9)
        assert law.critical_batch_after(start) == pytest.approx(batch, rel=1e-9)
    assert law.critical_batch_after(np.array([1e9, 1e10])).shape == (2,)


def test_published_three_term_law_reproduces_its_optimal_batch_law() -> None:
    info = LAWS["schaipp-2026"]
    assert PUBLISHED.info is info
    assert "2607.01487" in info.reference
    assert info.runs == 246
    assert info.validity == {"n_params": (5e7, 1e9), "tokens": (2e9, math.inf)}
    assert "beta_plus_gamma" in info.derived
    for tokens in (2e9, 1e10, 3e11, 1e12, 1.5e13):
        assert PUBLISHED.optimal_batch(tokens) == pytest.approx(0.667 * tokens**0.566, rel=1e-12)
    assert PUBLISHED.batch_exponent == pytest.approx(0.566, rel=1e-12)
    assert PUBLISHED.beta + PUBLISHED.gamma == pytest.approx(0.21372)
    assert PUBLISHED.token_fraction(PUBLISHED.optimal_batch(1e11), 1e11) == pytest.approx(1.0)
    with pytest.warns(ExtrapolationWarning, match=r"tokens=1e\+09"):
        PUBLISHED.optimal_batch(1e9)
    with pytest.raises(InvalidValueError, match=r"known: \['schaipp-2026'\]"):
        BatchLaw.published("step")
    with pytest.raises(InvalidValueError, match="below 1"):
        BatchLaw.from_optimal_batch(0.667, 1.2, 0.2)
    with pytest.raises(InvalidValueError, match="tolerance must be below 1"):
        PUBLISHED.near_optimal_range(1e11, 1.0)
    with pytest.raises(InvalidValueError, match="definition must be"):
        PUBLISHED.near_optimal_range(1e11, definition="compute")  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_the_optimal_batch_exponent(seed: int) -> None:
    n, m, k = _grid()
    rng = np.random.default_rng(seed)
    loss = TRUE.loss(n, m, k) * np.exp(rng.normal(0.0, 0.002, n.size))
    # A few runs diverged or were badly tuned: the Huber loss must shrug them off.
    loss[rng.choice(n.size, 4, replace=False)] *= 1.3
    fit = ThreeTermLaw.fit(n, m, k, loss)
    assert fit.batch_exponent == pytest.approx(TRUE.batch_exponent, rel=0.02)
    assert fit.optimal_batch(1e11) == pytest.approx(TRUE.optimal_batch(1e11), rel=0.15)
    assert fit.fit_loss is not None


def test_fit_is_exact_on_noiseless_data() -> None:
    n, m, k = _grid()
    fit = ThreeTermLaw.fit(n, m, k, TRUE.loss(n, m, k))
    for name in ("E", "alpha", "beta", "gamma"):
        assert getattr(fit, name) == pytest.approx(getattr(TRUE, name), rel=1e-3), name


def test_fit_refuses_too_few_runs_and_degenerate_data() -> None:
    n, m, k = _grid()
    loss = TRUE.loss(n, m, k)
    with pytest.raises(InvalidValueError, match=r"at least 10 runs"):
        ThreeTermLaw.fit(n[:5], m[:5], k[:5], loss[:5])
    with pytest.raises(InvalidValueError, match=r"batch_tokens takes 1 distinct"):
        ThreeTermLaw.fit(n, np.full_like(m, 2.0**20), k, loss)
    with pytest.raises(InvalidValueError, match=r"same length"):
        ThreeTermLaw.fit(n, m, k[:-1], loss)
    bad = loss.copy()
    bad[3] = -1.0
    with pytest.raises(InvalidValueError, match=r"loss\[3\]"):
        ThreeTermLaw.fit(n, m, k, bad)
    bad[3] = np.nan
    with pytest.raises(InvalidValueError, match=r"loss\[3\]"):
        ThreeTermLaw.fit(n, m, k, bad)
    with pytest.raises(InvalidTypeError):
        ThreeTermLaw.fit(n, m, k, ["a"] * n.size)
    with pytest.raises(InvalidValueError, match=r"gamma"):
        ThreeTermLaw(E=1, A=1, alpha=0.3, B=1, beta=0.3, C=1, gamma=-0.1)


def test_published_laws() -> None:
    batch, lr = deepseek_llm(1e18)
    assert batch == pytest.approx(0.2920 * 1e18**0.3271)
    assert lr == pytest.approx(0.3118 * 1e18**-0.125)
    batch, lr = step_law(5e8, 5e10)
    assert batch == pytest.approx(0.58 * 5e10**0.571)
    assert lr == pytest.approx(1.79 * 5e8**-0.713 * 5e10**0.307)
    assert kaplan_critical_batch(3.0) == pytest.approx(2e8 / 3.0 ** (1 / 0.21))
    steps_ratio, tokens_ratio = mccandlish_tradeoff(2**20, 2**22)
    assert (steps_ratio - 1) * (tokens_ratio - 1) == pytest.approx(1.0)
    assert mccandlish_tradeoff(5.0, 5.0) == (2.0, 2.0)


def test_published_laws_warn_when_extrapolating() -> None:
    with pytest.warns(ExtrapolationWarning, match=r"compute=1e\+24"):
        deepseek_llm(1e24)
    with pytest.warns(ExtrapolationWarning, match=r"n_params=7e\+10"):
        step_law(7e10, 5e10)
    with pytest.warns(ExtrapolationWarning, match=r"loss=1.5"):
        kaplan_critical_batch(1.5)
    with pytest.raises(InvalidValueError, match=r"compute"):
        deepseek_llm(-1.0)


def test_recommend_inside_the_fitted_range() -> None:
    advice = recommend(5e8, 5 * 10**10, multiple_of=4096 * 8)
    raw, lr = step_law(5e8, 5e10)
    assert advice.raw_batch_tokens == pytest.approx(raw)
    assert advice.batch_tokens % (4096 * 8) == 0
    assert abs(advice.batch_tokens - raw) <= 4096 * 8 / 2
    assert advice.learning_rate == pytest.approx(lr)
    assert advice.steps == 5 * 10**10 // advice.batch_tokens
    assert advice.extrapolation == []
    assert isinstance(advice.ramp, LinearRamp)
    assert advice.ramp.end == advice.batch_tokens
    assert advice.ramp.start < advice.batch_tokens
    assert advice.ramp.ramp_tokens == int(0.03 * 5 * 10**10)
    assert "0.58 D^0.571" in advice.formula


def test_recommend_warns_and_records_extrapolation() -> None:
    with pytest.warns(ExtrapolationWarning) as caught:
        advice = tokenbatch.scaling.recommend(7e10, 15 * 10**12, law="deepseek")
    assert len(caught) == 1
    assert advice.extrapolation
    assert "compute" in advice.extrapolation[0]
    assert advice.raw_batch_tokens == pytest.approx(0.2920 * (6 * 7e10 * 15e12) ** 0.3271)
    assert math.isfinite(advice.learning_rate)


def test_recommend_bad_input() -> None:
    with pytest.raises(InvalidValueError, match=r"law must be"):
        recommend(5e8, 10**10, law="chinchilla")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match=r"tokens must be at least 1"):
        recommend(5e8, 0)
    with pytest.raises(InvalidValueError, match=r"n_params"):
        recommend(0, 10**10)


# ---------------------------------------------------------------------------------------
# Launch plans
# ---------------------------------------------------------------------------------------

SEVEN_B = tokenbatch.ModelSpec.preset("mistral-7b")


def _plan_7b(**options: object) -> LaunchPlan:
    """The plan with Schaipp's three-term law, checking that it warns once, saying what its
    notes say about the extrapolated laws."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = launch_plan(
            SEVEN_B,
            2 * 10**12,
            num_gpus=256,
            gpu_memory=80e9,
            seq_len=4096,
            law="schaipp-2026",
            **options,
        )
    warned = [str(w.message) for w in caught if issubclass(w.category, ExtrapolationWarning)]
    extrapolated = [note for note in plan.notes if " is extrapolated: " in note]
    assert warned == ["; ".join(extrapolated)]
    # The laws see the non-embedding parameters: 7.24B less 2 x 32,000 x 4,096.
    assert any("Schaipp (2026)" in note and "n_params=6.98e+09" in note for note in extrapolated)
    return plan


def test_launch_plan_for_7b_on_2t_tokens_and_256_gpus() -> None:
    plan = _plan_7b()
    layout = plan.layout
    assert layout is not None
    assert layout.dp * layout.tp * layout.pp * layout.cp == 256
    assert plan.micro_batch_tokens == layout.micro_batch * 4096
    assert plan.dp == layout.dp
    usable = 0.9 * 80e9
    assert plan.usable_memory == pytest.approx(usable)
    low, high = plan.near_optimal_range
    assert low <= plan.batch_tokens <= high
    assert plan.optimal_batch_tokens == pytest.approx(0.667 * (2e12) ** 0.566)
    assert plan.stages[-1].batch_tokens == plan.batch_tokens
    assert plan.stages[-1].grad_accum_steps == layout.grad_accum_steps
    start = 0
    for previous, stage in zip((None, *plan.stages[:-1]), plan.stages, strict=True):
        # Each batch divides into micro-batch x DP x accumulation, exactly.
        assert stage.batch_tokens == plan.micro_batch_tokens * plan.dp * stage.grad_accum_steps
        assert stage.batch_sequences * 4096 == stage.batch_tokens
        # Its memory estimate is the planner's, with this accumulation, and it fits.
        assert stage.memory is not None
        assert stage.memory <= usable
        again = tokenbatch.estimate_memory(
            SEVEN_B, seq_len=4096, **{**layout.layout(), "grad_accum_steps": stage.grad_accum_steps}
        )
        assert stage.memory == again.total
        # Stages follow each other, and each starts at the first step boundary after the
        # law's critical point for its batch.
        assert stage.start_tokens == start
        if previous is not None:
            critical = plan.law.critical_tokens(stage.batch_tokens)
            assert stage.start_tokens >= critical > stage.start_tokens - previous.batch_tokens
        assert stage.learning_rate == pytest.approx(
            plan.peak_lr * math.sqrt(stage.batch_tokens / plan.batch_tokens)
        )
        start = stage.end_tokens
    assert plan.consumed_tokens == start
    assert 0 <= plan.tokens - start < plan.batch_tokens
    # The schedule is the stages, step for step, for the sampler and for Megatron.
    table = plan.schedule.table(plan.tokens, plan.micro_batch_tokens, plan.dp)
    assert len(table["batch_tokens"]) == plan.steps
    expected = np.repeat([s.batch_tokens for s in plan.stages], [s.steps for s in plan.stages])
    assert np.array_equal(table["batch_tokens"], expected)
    assert np.array_equal(
        table["grad_accum_steps"],
        np.repeat([s.grad_accum_steps for s in plan.stages], [s.steps for s in plan.stages]),
    )
    args = plan.megatron_args()
    text = args.split('--step-batch-size-schedule "')[1].split('"')[0]
    megatron = from_step_batch_size_schedule(text, seq_length=4096)
    consumed = np.concatenate([[0], table["consumed_tokens"][:-1]]) // 4096
    assert np.array_equal(megatron.batch_at(consumed) * 4096, table["batch_tokens"])
    assert f"--micro-batch-size {layout.micro_batch}" in args
    rows = plan.table()
    assert rows["steps"].sum() == plan.steps
    assert np.all(rows["memory"] <= usable)
    # The law's numbers are all in the notes too.
    assert any("n_params=6.98e+09" in note for note in plan.notes)


def test_launch_plan_explains_itself_and_scales_the_learning_rate() -> None:
    plan = _plan_7b(peak_lr=3e-4, lr_rule="linear")
    assert plan.peak_lr == 3e-4
    for stage in plan.stages:
        assert stage.learning_rate == pytest.approx(3e-4 * stage.batch_tokens / plan.batch_tokens)
    text = plan.explanation()
    for expected in (
        "mistral-7b (7.24B parameters)",
        "Schaipp (2026) three-term law",
        f"{plan.batch_tokens:,} tokens",
        f"dp={plan.dp}",
        "--step-batch-size-schedule",
        "given (tuned at the final batch)",
        "fits in the 72.0 GB usable",
    ):
        assert expected in text
    for stage in plan.stages:
        assert f"{stage.start_tokens:,}" in text
    rates = plan.lr_schedule(ConstantLR(3e-4)).lr_at([0, plan.tokens - 1])
    assert rates[0] == pytest.approx(plan.stages[0].learning_rate)
    assert rates[1] == pytest.approx(3e-4)


def test_launch_plan_from_a_parameter_count_and_a_fitted_law() -> None:
    law = ThreeTermLaw(E=1.8, A=300.0, alpha=0.33, B=40.0, beta=0.3, C=25.0, gamma=0.4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fitted law has no published range to warn about
        plan = launch_plan(5e8, 10**10, num_gpus=8, seq_len=2048, law=law, peak_lr=1e-3)
    assert plan.layout is None
    assert plan.dp == 8
    assert plan.micro_batch_tokens == 2048
    assert plan.law_name == "the given three-term law"
    assert plan.optimal_batch_tokens == pytest.approx(law.optimal_batch(1e10))
    assert all(stage.memory is None for stage in plan.stages)
    assert plan.batch_tokens % (8 * 2048) == 0
    assert [s.grad_accum_steps for s in plan.stages][:3] == [1, 2, 4]
    assert "memory not checked" in plan.explanation()
    # Too many GPUs for the optimum: one sequence per rank is already above the range.
    crowded = launch_plan(5e8, 10**10, num_gpus=4096, seq_len=2048, law=law, peak_lr=1e-3)
    assert crowded.batch_tokens == 4096 * 2048 > crowded.near_optimal_range[1]
    assert any("outside the 5%-suboptimal range" in note for note in crowded.notes)
    flat = launch_plan(5e8, 10**10, num_gpus=8, seq_len=2048, law=law, peak_lr=1e-3, ramp=False)
    assert len(flat.stages) == 1
    assert flat.stages[0].batch_tokens == plan.batch_tokens


def test_launch_plan_refusals() -> None:
    with pytest.raises(InvalidValueError, match="gpu_memory"):
        launch_plan(SEVEN_B, 10**11, num_gpus=8, seq_len=4096)
    with pytest.raises(InvalidValueError, match="less than one step"):
        launch_plan(5e8, 10**4, num_gpus=8, seq_len=2048, law=TRUE, peak_lr=1e-3)
    with pytest.raises(InvalidValueError, match="lr_rule"):
        launch_plan(5e8, 10**10, num_gpus=8, seq_len=2048, lr_rule="bad")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="law must be"):
        launch_plan(5e8, 10**10, num_gpus=8, seq_len=2048, law=3.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="no published batch law 'chinchilla'"):
        launch_plan(5e8, 10**10, num_gpus=8, seq_len=2048, law="chinchilla")
    with pytest.raises(InvalidValueError, match="no published learning-rate law 'kaplan'"):
        launch_plan(5e8, 10**10, num_gpus=8, seq_len=2048, lr_law="kaplan")
    with pytest.raises(InvalidValueError, match="either law or batch_tokens"):
        launch_plan(5e8, 10**10, num_gpus=8, seq_len=2048, law="step", batch_tokens=2**20)
    with pytest.raises(InvalidValueError, match="either lr_law or peak_lr"):
        launch_plan(5e8, 10**10, num_gpus=8, seq_len=2048, lr_law="step", peak_lr=1e-3)
    with pytest.raises(InvalidValueError, match="batch_tokens must be at least 1"):
        launch_plan(5e8, 10**10, num_gpus=8, seq_len=2048, batch_tokens=0)
    big = tokenbatch.ModelSpec.preset("llama-3.1-405b")
    with pytest.raises(InvalidValueError, match="no layout"):
        launch_plan(big, 10**12, num_gpus=8, gpu_memory=16e9, seq_len=4096)
