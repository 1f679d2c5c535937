"""Token mixtures in the sampler: shares per optimizer step, repetitions, schedules, resume
and resize, determinism, bad input, and sample-weighted blending side by side."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenbatch as tb
from tokenbatch.errors import InvalidTypeError, InvalidValueError, TokenBatchError
from tokenbatch.mixture import Mixture
from tokenbatch.schedule import Piecewise
from tokenbatch.torch import TokenBudgetBatchSampler, optimizer_steps

STEP = 1 << 20  # tokens per optimizer step
SHARES = {"web": 0.7, "documents": 0.2, "chat": 0.1}
TOLERANCE = 0.01  # one percentage point


@functools.cache
def realistic() -> dict[str, npt.NDArray[np.int64]]:
    """The ``documents`` and ``chat`` examples beside web text, as three sources."""
    return {
        "web": tb.datasets.example_lengths("lognormal", 60_000, seed=1),
        "documents": tb.datasets.example_lengths("documents", 30_000, seed=2),
        "chat": tb.datasets.example_lengths("chat", 8_000, seed=3),
    }


def sampler(
    mixture: Mixture,
    *,
    lengths: Mapping[str, npt.NDArray[np.int64]] | None = None,
    num_replicas: int = 8,
    rank: int = 0,
    step: int = STEP,
    seed: int = 0,
) -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler(
        realistic() if lengths is None else lengths,
        8192,
        num_replicas=num_replicas,
        rank=rank,
        seed=seed,
        mixture=mixture,
        schedule=Piecewise([(0, step)]),
    )


def step_sequences(s: TokenBudgetBatchSampler) -> list[list[int]]:
    """The sorted global indices of every optimizer step of the current epoch (all ranks)."""
    plan = s.plan()
    offsets = s.step_offsets()
    assert offsets is not None
    steps = []
    for k in range(len(offsets) - 1):
        indices: list[int] = []
        for micro in range(int(offsets[k]), int(offsets[k + 1])):
            for rank in range(plan.num_replicas):
                b = int(plan.steps[micro, rank])
                indices.extend(plan.indices[plan.bin_offsets[b] : plan.bin_offsets[b + 1]].tolist())
        steps.append(sorted(indices))
    return steps


def test_every_step_follows_the_shares_within_one_point() -> None:
    s = sampler(Mixture(SHARES, max_repetition={"chat": 3}))
    plan = s.mixture_plan()
    assert plan is not None
    assert len(plan) > 20
    targets = np.array([SHARES[name] for name in plan.sources])
    shares = plan.shares()
    assert np.abs(shares - targets).max() < TOLERANCE
    # Every step holds about the batch (the last one up to one and a half).
    totals = plan.source_tokens.sum(axis=1)
    assert np.all(np.abs(totals[:-1] - STEP) < 3 * 8192)
    # The plan's tokens per source are those of the batches every rank runs.
    offsets = s.step_offsets()
    assert offsets is not None
    real = s.plan().real_tokens()
    for k in range(len(plan)):
        assert real[offsets[k] : offsets[k + 1]].sum() == totals[k]
    source_offsets = s.source_offsets
    assert source_offsets is not None
    for k, indices in enumerate(step_sequences(s)):
        source = np.searchsorted(source_offsets, indices, side="right") - 1
        lengths = np.concatenate(list(realistic().values()))[indices]
        per_source = np.bincount(source, weights=lengths, minlength=3)
        assert per_source.tolist() == plan.source_tokens[k].tolist()


def test_optimizer_steps_carry_the_tokens_of_every_source() -> None:
    s = sampler(Mixture(SHARES, max_repetition={"chat": 3}), num_replicas=4, rank=1)
    plan = s.mixture_plan()
    assert plan is not None
    steps = optimizer_steps(s)
    assert steps.sources == plan.sources == tuple(SHARES)
    assert steps.source_tokens is not None
    np.testing.assert_array_equal(steps.source_tokens, plan.source_tokens)
    assert not steps.source_tokens.flags.writeable
    # Another epoch is counted from its own plan, and a sampler without sources has none.
    s.set_epoch(1)
    later = s.mixture_plan()
    assert later is not None
    np.testing.assert_array_equal(optimizer_steps(s).source_tokens, later.source_tokens)
    plain = optimizer_steps(TokenBudgetBatchSampler(realistic()["web"], 8192, num_replicas=4))
    assert plain.sources is None
    assert plain.source_tokens is None


def uses_per_source(s: TokenBudgetBatchSampler) -> list[Counter[int]]:
    offsets = s.source_offsets
    assert offsets is not None
    counts: list[Counter[int]] = [Counter() for _ in range(len(offsets) - 1)]
    for indices in step_sequences(s):
        for index in indices:
            source = int(np.searchsorted(offsets, index, side="right")) - 1
            counts[source][index] += 1
    return counts


@pytest.mark.parametrize("exhausted", ["stop", "renormalize"])
def test_each_repetition_uses_every_sequence_once_and_the_cap_holds(exhausted: str) -> None:
    caps = {"web": 1, "documents": 2, "chat": 4}
    s = sampler(Mixture(SHARES, max_repetition=caps, exhausted=exhausted))  # type: ignore[arg-type]
    plan = s.mixture_plan()
    assert plan is not None
    sizes = {name: len(values) for name, values in realistic().items()}
    ran_out = []
    for name, counts in zip(plan.sources, uses_per_source(s), strict=True):
        used = sum(counts.values())
        full = used // sizes[name]
        assert full <= caps[name]
        assert plan.repetitions[name] <= caps[name]
        # Complete repetitions use each sequence once; the one begun uses some once more.
        assert set(counts.values()) <= {full, full + 1}
        if full:
            assert len(counts) == sizes[name]
        ran_out.append(used == caps[name] * sizes[name])
    if exhausted == "renormalize":
        assert all(ran_out)  # the pass goes on until every source is used up
    else:
        assert any(ran_out)


def test_renormalized_shares_after_a_source_runs_out() -> None:
    s = sampler(Mixture(SHARES, exhausted="renormalize"))
    plan = s.mixture_plan()
    assert plan is not None
    targets = plan.target_shares()
    assert np.abs(plan.shares() - targets)[:-1].max() < TOLERANCE
    base = np.array([SHARES[name] for name in plan.sources])
    live = plan.target_tokens > 0  # the sources still in the mixture at each step
    assert live[0].all()
    assert not live[-1].all()
    for k in range(len(plan) - 1):
        if (live[k] == live[k + 1]).all():  # no source ran out during step k
            assert np.allclose(targets[k][live[k]], base[live[k]] / base[live[k]].sum())


def test_the_schedule_is_followed_after_each_change_point() -> None:
    points = [
        (0, SHARES),
        (20 * STEP, {"web": 0.4, "documents": 0.3, "chat": 0.3}),
        (35 * STEP, {"web": 0.2, "documents": 0.8}),
    ]
    mixture = Mixture(points, max_repetition=4)
    s = sampler(mixture)
    plan = s.mixture_plan()
    assert plan is not None
    starts = np.concatenate([[0], np.cumsum(plan.source_tokens.sum(axis=1))])[:-1]
    changed = 0
    for k in range(len(plan)):
        expected = mixture.shares_at(int(starts[k]))
        target = np.array([expected[name] for name in plan.sources])
        assert np.abs(plan.shares()[k] - target).max() < TOLERANCE, k
        changed += int(starts[k] >= 20 * STEP)
    assert changed > 5
    linear = Mixture(points, max_repetition=4, interpolation="linear")
    assert linear.shares_at(int(27.5 * STEP))["web"] == pytest.approx(0.3)
    plan = sampler(linear).mixture_plan()
    assert plan is not None
    starts = np.concatenate([[0], np.cumsum(plan.source_tokens.sum(axis=1))])[:-1]
    for k in range(len(plan)):
        expected = linear.shares_at(int(starts[k]))
        target = np.array([expected[name] for name in plan.sources])
        assert np.abs(plan.shares()[k] - target).max() < TOLERANCE


def test_shares_continue_across_epochs() -> None:
    points = [(0, SHARES), (30 * STEP, {"web": 0.5, "documents": 0.5})]
    s = sampler(Mixture(points))
    first = s.mixture_plan()
    assert first is not None
    s.set_epoch(1)
    second = s.mixture_plan()
    assert second is not None
    state = s.state_dict()
    assert state["tokens_before_epoch"] == first.total_tokens
    assert first.total_tokens > 30 * STEP
    assert np.abs(second.shares()[:-1] - [0.5, 0.5, 0.0]).max() < TOLERANCE


def batches(s: TokenBudgetBatchSampler) -> list[list[int]]:
    return [list(batch) for batch in s]  # type: ignore[arg-type]


def test_resume_mid_epoch_reproduces_the_remaining_batches() -> None:
    mixture = Mixture(SHARES, max_repetition={"chat": 2})
    full = sampler(mixture, rank=3)
    full.set_epoch(1)
    expected = batches(full)
    interrupted = sampler(mixture, rank=3)
    interrupted.set_epoch(1)
    iterator = iter(interrupted)
    for _ in range(77):
        next(iterator)
    state = interrupted.state_dict()
    resumed = sampler(mixture, rank=3)
    resumed.load_state_dict(state)
    assert resumed.start_step == 77
    assert batches(resumed) == expected[77:]


def test_resize_reproduces_the_remaining_steps() -> None:
    mixture = Mixture(SHARES, max_repetition={"chat": 2})
    eight = sampler(mixture, num_replicas=8)
    offsets = eight.step_offsets()
    assert offsets is not None
    k = 12
    uninterrupted = step_sequences(eight)
    iterator = iter(eight)
    for _ in range(int(offsets[k])):
        next(iterator)
    state = eight.state_dict()
    assert state["mixture_step"] == [k, 0]
    for size in (3, 16):
        resized = sampler(mixture, num_replicas=size)
        resized.load_state_dict(state, allow_resize=True)
        new_offsets = resized.step_offsets()
        assert new_offsets is not None
        assert resized.start_step == new_offsets[k]
        # The remaining optimizer steps hold the same sequences as the uninterrupted run's.
        assert step_sequences(resized)[k:] == uninterrupted[k:]
        ranks = [sampler(mixture, num_replicas=size, rank=r) for r in range(size)]
        for r in ranks:
            r.load_state_dict(state, allow_resize=True)
        lists = [batches(r) for r in ranks]
        assert len({len(b) for b in lists}) == 1
        dealt = sorted(i for b in lists for batch in b for i in batch)
        assert dealt == sorted(i for step in uninterrupted[k:] for i in step)
    # Between the micro-batches of a step, a resize is refused.
    next(iterator)
    with pytest.raises(InvalidValueError, match="optimizer step boundary"):
        sampler(mixture, num_replicas=4).load_state_dict(eight.state_dict(), allow_resize=True)


def test_plans_are_identical_on_every_rank_and_thread_count() -> None:
    mixture = Mixture(SHARES, max_repetition={"chat": 2})
    reference = sampler(mixture, num_replicas=4, rank=0).plan()
    for rank in range(4):
        s = sampler(mixture, num_replicas=4, rank=rank)
        assert np.array_equal(s.plan().steps, reference.steps)
        assert np.array_equal(s.plan().indices, reference.indices)
        assert [list(b) for b in s] == [list(b) for b in reference.batches(rank)]
    try:
        for threads in (1, 2, 3):
            tb.set_num_threads(threads)
            plan = sampler(mixture, num_replicas=4).plan()
            assert np.array_equal(plan.steps, reference.steps)
            assert np.array_equal(plan.indices, reference.indices)
            assert np.array_equal(plan.bin_offsets, reference.bin_offsets)
    finally:
        tb.set_num_threads(None)


def megatron_blend(
    lengths: Mapping[str, npt.NDArray[np.int64]], weights: Mapping[str, float], step: int
) -> npt.NDArray[np.float64]:
    """Token shares per step of Megatron's ``BlendedDataset``: sample ``i`` comes from the
    dataset whose sample count lags its weight the most (``build_blending_indices``), each
    dataset's samples in order, and a step takes samples until it holds ``step`` tokens."""
    names = list(lengths)
    weight = np.array([weights[name] for name in names])
    taken = np.zeros(len(names), dtype=np.int64)
    step_tokens = np.zeros(len(names))
    shares = []
    while True:
        sample = int(taken.sum())
        d = int(np.argmax(weight * (sample + 1) - taken))
        if taken[d] >= len(lengths[names[d]]):
            break
        step_tokens[d] += lengths[names[d]][taken[d]]
        taken[d] += 1
        if step_tokens.sum() >= step:
            shares.append(step_tokens / step_tokens.sum())
            step_tokens = np.zeros(len(names))
    return np.array(shares)


def test_sample_weighted_blending_misses_the_token_shares() -> None:
    s = sampler(Mixture(SHARES, max_repetition={"chat": 3}))
    plan = s.mixture_plan()
    assert plan is not None
    ours = np.abs(plan.shares() - [SHARES[n] for n in plan.sources]).max()
    blended = megatron_blend(realistic(), SHARES, STEP)
    theirs = np.abs(blended - [SHARES[n] for n in realistic()]).max(axis=0)
    # Sample weights give each source its share of *samples*: sources of long documents
    # get more tokens than their share, sources of short chats fewer.
    assert ours < TOLERANCE
    assert theirs.max() > 10 * ours
    assert theirs.max() > 0.05, theirs


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Mixture({"web": 0.7, "chat": 0.2}), "sum to 1"),
        (lambda: Mixture({"web": 1.2, "chat": -0.2}), "non-negative"),
        (lambda: Mixture([(0, {"web": 1.0}), (10, {"code": 1.0})]), "source 'code'"),
        (lambda: Mixture({"web": 1.0}, max_repetition=0), "max_repetition"),
        (lambda: Mixture({"web": 1.0}, max_repetition={"web": 0}), "max_repetition"),
        (lambda: Mixture([(5, {"web": 1.0})]), "at 0 tokens"),
        (lambda: Mixture({"web": 1.0}, exhausted="wrap"), "exhausted"),
    ],
)
def test_bad_mixtures_are_refused(build: object, message: str) -> None:
    with pytest.raises(TokenBatchError, match=message):
        build()  # type: ignore[operator]


def test_bad_sources_are_refused() -> None:
    mixture = Mixture({"web": 0.5, "chat": 0.5})
    web = np.full(100, 50)
    with pytest.raises(InvalidValueError, match="source 'chat' has no sequences"):
        sampler(mixture, lengths={"web": web, "chat": np.zeros(0, dtype=np.int64)})
    with pytest.raises(InvalidValueError, match="which lengths does not have"):
        sampler(mixture, lengths={"web": web})
    with pytest.raises(InvalidValueError, match="gives no share"):
        sampler(mixture, lengths={"web": web, "chat": web, "code": web})
    with pytest.raises(InvalidTypeError, match="must map every source"):
        sampler(mixture, lengths=web)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="needs schedule="):
        TokenBudgetBatchSampler({"web": web, "chat": web}, 512, num_replicas=1, mixture=mixture)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=2, max_size=3),
    seed=st.integers(0, 2**32),
    caps=st.lists(st.integers(1, 3), min_size=3, max_size=3),
    renormalize=st.booleans(),
    ranks=st.integers(1, 3),
)
def test_any_mixture_uses_each_sequence_once_per_repetition(
    sizes: list[int], seed: int, caps: list[int], renormalize: bool, ranks: int
) -> None:
    rng = np.random.default_rng(seed)
    names = [f"s{i}" for i in range(len(sizes))]
    lengths = {name: rng.integers(1, 200, size) for name, size in zip(names, sizes, strict=True)}
    raw = rng.integers(1, 10, len(sizes))
    mixture = Mixture(
        {name: float(w) for name, w in zip(names, raw / raw.sum(), strict=True)},
        max_repetition=dict(zip(names, caps, strict=False)),
        exhausted="renormalize" if renormalize else "stop",
    )
    try:
        s = sampler(mixture, lengths=lengths, num_replicas=ranks, step=2000, seed=seed)
    except InvalidValueError as error:
        # Too few sequences in a step for this many ranks is refused, with the reason.
        with pytest.raises(InvalidValueError, match="same number of micro-batches"):
            raise error
        return
    for name, counts in zip(names, uses_per_source(s), strict=True):
        full = sum(counts.values()) // len(lengths[name])
        assert full <= mixture.max_repetition[name]
        assert set(counts.values()) <= {full, full + 1}
    assert (
        len(
            {
                len(
                    batches(
                        sampler(
                            mixture,
                            lengths=lengths,
                            num_replicas=ranks,
                            rank=r,
                            step=2000,
                            seed=seed,
                        )
                    )
                )
                for r in range(ranks)
            }
        )
        == 1
    )
