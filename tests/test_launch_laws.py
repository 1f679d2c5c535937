"""Every shipped law evaluated for a launch plan, the default choice among them, the safety
band, and the defaults checked against the published runs."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from script_module import load_script

import tokenbatch
from tokenbatch.errors import InvalidValueError
from tokenbatch.scaling import (
    LAWS,
    PUBLISHED_RUNS,
    ExtrapolationWarning,
    LaunchPlan,
    RunScale,
    deepseek_llm,
    kaplan_critical_batch,
    kaplan_loss,
    launch_plan,
    porian_law,
    step_law,
)
from tokenbatch.scaling.published import law_values
from tokenbatch.scaling.runs import nearest_runs
from tokenbatch.scaling.spread import BATCH_LAWS, LR_LAWS, choose, estimate

DOCS = Path(__file__).resolve().parents[1] / "docs"
LLAMA_8B = tokenbatch.ModelSpec.preset("llama-3.1-8b")


def _quiet_plan(model: tokenbatch.ModelSpec | float, tokens: int, **options: object) -> LaunchPlan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        return launch_plan(model, tokens, **options)  # type: ignore[arg-type]


def test_published_runs_are_sourced_data() -> None:
    names = [run.name for run in PUBLISHED_RUNS]
    assert len(names) == len(set(names))
    dense = [run for run in PUBLISHED_RUNS if not run.mixture_of_experts]
    moe = [run for run in PUBLISHED_RUNS if run.mixture_of_experts]
    assert len(dense) >= 20
    assert {run.name for run in moe} >= {"DeepSeek-V2", "DeepSeek-V3"}
    for run in PUBLISHED_RUNS:
        assert run.source
        assert run.optimizer
        assert run.batch_schedule
        assert 2019 <= run.year <= 2026
        assert run.tokens > 1e11
        assert run.seq_len in (2048, 4096, 8192)
        assert (run.batch_tokens is None) == (run.batch_schedule == "not published")
        assert run.peak_lr is None or 1e-5 < run.peak_lr < 1e-2
        if run.active_params is not None:
            assert run.active_params < run.n_params
            assert run.law_params == run.active_params
        else:
            assert run.law_params == run.n_params
    deepseek = next(run for run in PUBLISHED_RUNS if run.name == "DeepSeek LLM 67B")
    assert (deepseek.peak_lr, deepseek.batch_tokens, deepseek.tokens) == (3.2e-4, 4608 * 4096, 2e12)


def test_nearest_runs_keep_the_kind_and_rank_by_log_distance() -> None:
    near = nearest_runs(7e9, 2e12, mixture_of_experts=False, quantity="batch", count=3)
    # DeepSeek LLM 7B and Llama 2 7B are both 7B on 2T tokens: the table's order breaks the tie.
    assert [run.name for run in near] == ["DeepSeek LLM 7B", "Llama 2 7B", "Llama 2 13B"]
    moe = nearest_runs(37e9, 14.8e12, mixture_of_experts=True, quantity="lr", count=10)
    assert moe[0].name == "DeepSeek-V3"
    assert all(run.mixture_of_experts for run in moe)
    # Runs that did not publish the quantity are not evidence for it.
    lr_only = nearest_runs(8e9, 15e12, mixture_of_experts=False, quantity="lr", count=1)
    batch_only = nearest_runs(8e9, 15e12, mixture_of_experts=False, quantity="batch", count=1)
    assert lr_only[0].name == "Llama 3 8B"
    assert batch_only[0].name != "Llama 3 8B"


def test_every_shipped_law_is_evaluated_and_marked() -> None:
    scale = RunScale.from_count(5e8, 5e10)
    assert scale.compute == pytest.approx(6 * 5e8 * 5e10)
    batch = {law: estimate(law, "batch", scale) for law in BATCH_LAWS}
    rate = {law: estimate(law, "lr", scale) for law in LR_LAWS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        step_batch, step_rate = step_law(5e8, 5e10)
        deepseek_batch, deepseek_rate = deepseek_llm(scale.compute)
        porian_batch, porian_rate = porian_law(5e8)
        kaplan_batch = kaplan_critical_batch(kaplan_loss(5e8, 5e10))
    assert batch["schaipp-2026"].value == pytest.approx(0.667 * 5e10**0.566)
    assert batch["step"].value == pytest.approx(step_batch)
    assert batch["deepseek"].value == pytest.approx(deepseek_batch)
    assert batch["porian"].value == pytest.approx(porian_batch)
    assert batch["kaplan"].value == pytest.approx(kaplan_batch)
    # Without a batch to move to, a rate is the law's own, at the law's own batch.
    assert rate["step"].value == pytest.approx(step_rate)
    assert rate["step"].law_batch == pytest.approx(step_batch)
    assert rate["deepseek"].value == pytest.approx(deepseek_rate)
    assert rate["porian"].value == pytest.approx(porian_rate)
    # 0.5B parameters and 5e10 tokens: inside the fits of Schaipp, Step Law and Porian;
    # 1.5e20 FLOPs is beyond DeepSeek LLM's 2e19, and 5e10 tokens beyond Kaplan's 2.3e10.
    inside = {law for law, item in batch.items() if item.inside}
    assert inside == {"schaipp-2026", "step", "porian"}
    assert batch["deepseek"].outside == ("compute=1.5e+20 (fitted on 1e+17 to 2e+19)",)
    assert "tokens=5e+10 (fitted on 2.2e+07 to 2.3e+10)" in batch["kaplan"].outside
    assert {law for law, item in rate.items() if item.inside} == {"step", "porian"}
    # A rate moved to another batch follows the square root of the batch ratio.
    moved = estimate("deepseek", "lr", scale, at_batch=4 * deepseek_batch)
    assert moved.value == pytest.approx(2 * deepseek_rate)
    assert moved.at_batch == pytest.approx(4 * deepseek_batch)


def test_law_values_and_the_new_published_functions() -> None:
    assert porian_law(1e8) == pytest.approx((0.7576 * 1e8**0.703, 3.7 * 1e8**-0.36))
    loss = kaplan_loss(1e9, 2e10)
    assert loss == pytest.approx(((6.4e13 / 1e9) ** (0.076 / 0.103) + 1.8e13 / 2e10) ** 0.103)
    with pytest.warns(ExtrapolationWarning, match=r"Porian et al\. \(2024\): n_params=7e\+09"):
        porian_law(7e9)
    with pytest.warns(ExtrapolationWarning, match=r"tokens=1e\+12"):
        kaplan_loss(1e9, 1e12)
    point = law_values("kaplan", n_params=1e9, tokens=2e10, compute=1.0)
    assert point.inputs["loss"] == pytest.approx(loss)
    assert point.lr is None
    with pytest.raises(InvalidValueError, match="no learning rate"):
        point.rate()
    with pytest.raises(InvalidValueError, match="no published law 'chinchilla'"):
        law_values("chinchilla", n_params=1.0, tokens=1.0, compute=1.0)
    assert LAWS["step"].out_of_range(n_params=7e9, tokens=1e10) == [("n_params", 7e9, 6e7, 1.1e9)]
    assert LAWS["step"].mixture_of_experts
    assert not LAWS["deepseek"].mixture_of_experts


def test_the_default_prefers_a_law_fitted_on_runs_like_this() -> None:
    # 1B parameters, 1e11 tokens: Step Law is the only learning-rate law fitted there.
    scale = RunScale.from_count(1e9, 1e11)
    lr = choose("lr", scale)
    assert lr.chosen == "step"
    assert lr.reason == "the only law whose fitted range covers this run"
    batch = choose("batch", scale)
    assert {item.law for item in batch.estimates if item.inside} == {"schaipp-2026", "step"}
    assert batch.chosen in ("schaipp-2026", "step")
    assert batch.reason.startswith("of the laws whose fitted range covers this run, it agrees")
    # Of those, the one closest to the published runs nearest in scale.
    assert batch.agreement(batch.chosen) == min(
        batch.agreement(law) for law in ("schaipp-2026", "step")
    )


def test_outside_every_fit_the_default_follows_the_nearest_published_runs() -> None:
    scale = RunScale.from_count(8e9, 15e12)
    for quantity in ("batch", "lr"):
        spread = choose(quantity, scale)  # type: ignore[arg-type]
        assert not any(item.inside for item in spread.estimates)
        assert len(spread.evidence) == 4
        assert all(not run.mixture_of_experts for run in spread.evidence)
        scores = {item.law: spread.agreement(item.law) for item in spread.estimates}
        assert spread.chosen is not None
        assert scores[spread.chosen] == min(scores.values())
        assert spread.reason.startswith("no law was fitted on runs like this one")
        for run in spread.evidence:
            assert run.name in spread.reason
        assert spread.low <= spread.value <= spread.high
    # Asked for by name, a law is taken whatever the evidence says.
    picked = choose("lr", scale, law="step")
    assert (picked.chosen, picked.reason) == ("step", "chosen by the caller")
    with pytest.raises(InvalidValueError, match=r"no published learning-rate law 'kaplan'; known"):
        choose("lr", scale, law="kaplan")


def test_a_mixture_of_experts_is_judged_by_mixture_of_experts_runs() -> None:
    spec = tokenbatch.ModelSpec.preset("deepseek-v3")
    scale = RunScale.from_spec(spec, 14.8e12, 4096)
    assert scale.mixture_of_experts
    assert scale.n_params < spec.num_active_params()
    spread = choose("batch", scale)
    assert all(run.mixture_of_experts for run in spread.evidence)
    for item in spread.estimates:
        dense_only = "fitted on dense models, not on mixtures of experts" in item.outside
        assert dense_only == (item.law != "step")


def test_run_scale_from_a_spec_counts_non_embedding_parameters_and_attention() -> None:
    scale = RunScale.from_spec(LLAMA_8B, 15e12, 8192)
    n = 8_030_261_248 - 2 * 128_256 * 4096
    assert scale.n_params == n
    assert scale.flops_per_token == 6 * n + 6 * 32 * 8192 * 32 * 128
    assert not scale.mixture_of_experts


def test_the_llama_3_8b_plan_holds_up_against_its_published_rate() -> None:
    plan = _quiet_plan(LLAMA_8B, 15 * 10**12, num_gpus=512, gpu_memory=80e9, seq_len=8192)
    llama = next(run for run in PUBLISHED_RUNS if run.name == "Llama 3 8B")
    assert llama.peak_lr is not None
    assert 0.5 <= plan.peak_lr / llama.peak_lr <= 2
    step = next(item for item in plan.lr_spread.estimates if item.law == "step")
    assert not step.inside
    assert step.value > 4 * llama.peak_lr  # the rate the plan used to propose
    assert plan.lr_spread.high / plan.lr_spread.low > 4
    assert plan.peak_lr == pytest.approx(plan.lr_spread.value)
    assert not any("more than 2x" in note for note in plan.notes)
    # Every law, inside or out, with the range, in the text, the table and the data.
    text = plan.explanation()
    for item in (*plan.batch_spread.estimates, *plan.lr_spread.estimates):
        assert item.name in text
    assert text.count("range across laws:") == 2
    assert text.count("outside: ") == 8
    assert "chosen: " in text
    rows = plan.laws_table()
    assert list(rows["quantity"]) == ["batch"] * 5 + ["lr"] * 3
    assert rows["chosen"].sum() == 2
    assert not rows["inside"].any()
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["laws"]["lr"]["chosen"] == plan.lr_spread.chosen
    assert data["laws"]["batch"]["high"] == pytest.approx(plan.batch_spread.high)
    assert [law["law"] for law in data["laws"]["batch"]["laws"]] == list(BATCH_LAWS)


def test_a_learning_rate_far_above_published_runs_is_flagged() -> None:
    hot = _quiet_plan(8e9, 15 * 10**12, num_gpus=64, seq_len=8192, lr_law="step")
    note = next(note for note in hot.notes if "more than 2x" in note)
    assert f"{hot.peak_lr:.3g}" in note
    assert "Llama 3 8B: 0.0003 at 1.5e+13 tokens" in note
    assert note.count(" at ") == 3  # the three nearest runs of comparable size
    for rate, flagged in ((3e-4, False), (8e-4, False), (9e-4, True)):
        plan = _quiet_plan(8e9, 15 * 10**12, num_gpus=64, seq_len=8192, peak_lr=rate)
        # 4.2e-4 (DeepSeek LLM 7B) is the highest rate of a dense run within 2x of 8B.
        assert any("more than 2x" in note for note in plan.notes) == flagged
        assert plan.lr_spread.chosen is None
        assert plan.lr_spread.reason == "given"


def test_the_caller_chooses_a_law_or_gives_the_numbers() -> None:
    chosen = _quiet_plan(7e9, 2 * 10**12, num_gpus=8, seq_len=4096, law="deepseek", lr_law="porian")
    deepseek = next(item for item in chosen.batch_spread.estimates if item.law == "deepseek")
    assert chosen.optimal_batch_tokens == pytest.approx(deepseek.value)
    assert chosen.batch_spread.chosen == "deepseek"
    assert chosen.law_name == "DeepSeek LLM (2024)"
    porian = estimate("porian", "lr", RunScale.from_count(7e9, 2e12), at_batch=chosen.batch_tokens)
    assert chosen.peak_lr == pytest.approx(porian.value)
    assert "Porian et al. (2024) at its own batch" in chosen.lr_source
    given = _quiet_plan(7e9, 2 * 10**12, num_gpus=8, seq_len=4096, batch_tokens=2**23)
    assert given.optimal_batch_tokens == 2**23
    assert given.batch_tokens == 2**23
    assert (given.batch_spread.chosen, given.batch_spread.reason) == (None, "given")
    assert len(given.batch_spread.estimates) == len(BATCH_LAWS)
    # The near-optimal range keeps the three-term law's 4x width around the given batch.
    low, high = given.near_optimal_range
    assert high / low == pytest.approx(4.0, rel=1e-3)
    assert low < 2**23 < high


def test_a_plan_warns_once_and_only_for_the_chosen_laws() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = launch_plan(8e9, 15 * 10**12, num_gpus=64, seq_len=8192)
    messages = [str(w.message) for w in caught if issubclass(w.category, ExtrapolationWarning)]
    assert len(messages) == 1
    for spread in (plan.batch_spread, plan.lr_spread):
        chosen = next(item for item in spread.estimates if item.law == spread.chosen)
        assert chosen.name in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inside Step Law's fit for both: nothing to warn
        inside = launch_plan(1e9, 10**11, num_gpus=8, seq_len=2048, law="step", lr_law="step")
    assert not any("extrapolated" in note for note in inside.notes)


# Dense runs of 7B parameters and more where the default misses the run by more than 2x, and
# why no default could have hit them (checked below).
KNOWN_MISSES = {
    ("DeepSeek LLM 67B", "batch"): "conflict",
    ("Gopher 280B", "batch"): "no law",
    ("GPT-3 6.7B", "lr"): "no law",
    ("GPT-3 13B", "lr"): "no law",
    ("OLMo 2 32B", "lr"): "outlier",
}


def test_the_defaults_against_published_dense_runs_of_7b_and_more() -> None:
    generator = load_script(DOCS / "gen_published_runs.py", "gen_published_runs")
    rows = [
        row
        for row in generator.rows()
        if not row.run.mixture_of_experts and row.run.n_params >= 6.5e9
    ]
    assert len(rows) == 21
    compared, misses = 0, {}
    for row in rows:
        for quantity, ratio, spread in (
            ("batch", row.batch_ratio(), row.batch),
            ("lr", row.lr_ratio(), row.lr),
        ):
            if ratio is None:
                continue
            compared += 1
            if not 0.5 <= ratio <= 2:
                misses[row.run.name, quantity] = (row, spread)
    assert compared == 40
    assert set(misses) == set(KNOWN_MISSES)
    dense = [run for run in PUBLISHED_RUNS if not run.mixture_of_experts]
    for (name, quantity), (row, spread) in misses.items():
        run = row.run
        used = run.batch_tokens if quantity == "batch" else run.peak_lr
        assert used is not None
        kind = KNOWN_MISSES[name, quantity]
        if kind == "no law":
            # Every shipped law is more than 2x from the run: no choice of law could match.
            assert all(not 0.5 <= item.value / used <= 2 for item in spread.estimates)
        elif kind == "conflict":
            # A run of the same size and tokens used a value more than 4x away.
            other = [
                other.batch_tokens
                for other in dense
                if other is not run
                and other.batch_tokens is not None
                and abs(math.log(other.n_params / run.n_params)) < math.log(1.1)
                and abs(math.log(other.tokens / run.tokens)) < math.log(1.1)
            ]
            assert any(used / value > 4 or value / used > 4 for value in other)
        else:
            # The run used at least twice the rate of each other run nearest in scale,
            # which the default follows.
            others = [item for item in spread.evidence if item is not run]
            assert len(others) == 3
            assert all(item.peak_lr is not None and 2 * item.peak_lr <= used for item in others)


@settings(max_examples=200, deadline=None)
@given(
    n_params=st.floats(1e7, 1e13),
    tokens=st.floats(1e9, 1e14),
    moe=st.booleans(),
    quantity=st.sampled_from(["batch", "lr"]),
)
def test_the_default_is_always_a_listed_law_and_the_best_of_its_pool(
    n_params: float, tokens: float, moe: bool, quantity: str
) -> None:
    scale = RunScale.from_count(n_params, tokens, mixture_of_experts=moe)
    spread = choose(quantity, scale)  # type: ignore[arg-type]
    names = [item.law for item in spread.estimates]
    assert names == list(BATCH_LAWS if quantity == "batch" else LR_LAWS)
    assert spread.chosen in names
    assert spread.low <= spread.value <= spread.high
    assert all(item.value > 0 and math.isfinite(item.value) for item in spread.estimates)
    inside = [item.law for item in spread.estimates if item.inside]
    pool = inside or names
    assert spread.chosen in pool
    assert spread.agreement(spread.chosen) <= min(spread.agreement(law) for law in pool)
    assert all(run.mixture_of_experts == moe for run in spread.evidence)
    assert 0 < len(spread.evidence) <= 4
