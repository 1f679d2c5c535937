"""The sampler under a batch-size schedule: micro-batches grouped into optimizer steps."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tokenbatch.datasets import example_lengths
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.schedule import LinearRamp, Piecewise, group_into_steps
from tokenbatch.torch import TokenBudgetBatchSampler

LENGTHS = example_lengths("chat", 3000, max_length=1024, seed=4)


def sampler(rank: int, schedule: object, **kwargs: object) -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler(
        LENGTHS,
        1024,
        num_replicas=2,
        rank=rank,
        seed=3,
        schedule=schedule,
        **kwargs,  # type: ignore[arg-type]
    )


def step_tokens(s: TokenBudgetBatchSampler) -> list[int]:
    """Tokens of every optimizer step of the current epoch, summed over all ranks."""
    plan = s.plan()
    offsets = s.step_offsets()
    assert offsets is not None
    per_bin = np.add.reduceat(plan.lengths, plan.bin_offsets[:-1])
    per_round = per_bin[plan.steps].sum(axis=1)
    return [int(per_round[a:b].sum()) for a, b in itertools.pairwise(offsets)]


def test_steps_follow_a_ramp_and_cover_the_epoch() -> None:
    ramp = LinearRamp(4 * 1024, 16 * 1024, 600_000, unit="tokens")
    s = sampler(0, ramp)
    offsets = s.step_offsets()
    assert offsets is not None
    assert offsets[0] == 0
    assert offsets[-1] == len(s)
    assert (np.diff(offsets) >= 1).all()
    tokens = step_tokens(s)
    # Early steps are near the start of the ramp, later ones near its end.
    assert tokens[0] < 8 * 1024
    assert np.median(tokens[-10:-1]) > 12 * 1024
    consumed = np.concatenate([[0], np.cumsum(tokens)[:-1]])
    targets = ramp.batch_tokens_at(consumed)
    # Every full step is within one round (two micro-batches) of its target.
    assert (np.abs(np.array(tokens[:-1]) - targets[:-1]) <= 2 * 1024).all()


def test_every_rank_gets_the_same_step_boundaries() -> None:
    ramp = LinearRamp(2048, 8192, 300_000, unit="tokens")
    a, b = sampler(0, ramp), sampler(1, ramp)
    for epoch in (0, 1):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        assert np.array_equal(a.step_offsets(), b.step_offsets())  # type: ignore[arg-type]


def test_schedule_continues_across_epochs() -> None:
    # The batch doubles once 1.5 epochs of tokens are consumed.
    epoch_tokens = int(LENGTHS.sum())
    schedule = Piecewise([(0, 8192), (epoch_tokens * 3 // 2, 16384)])
    s = sampler(0, schedule)
    first = np.diff(s.step_offsets())  # type: ignore[arg-type]
    s.set_epoch(1)
    second = np.diff(s.step_offsets())  # type: ignore[arg-type]
    s.set_epoch(2)
    third = np.diff(s.step_offsets())  # type: ignore[arg-type]
    assert np.median(first) == pytest.approx(4, abs=1)
    assert np.median(second[: len(second) // 3]) == pytest.approx(4, abs=1)
    assert np.median(second[-len(second) // 3 :]) == pytest.approx(8, abs=1)
    assert np.median(third) == pytest.approx(8, abs=1)
    # The offsets are what group_into_steps gives for the consumed tokens before the epoch.
    plan = s.plan()
    per_bin = np.add.reduceat(plan.lengths, plan.bin_offsets[:-1])
    expected = group_into_steps(
        per_bin[plan.steps].reshape(-1), schedule, 2, consumed_tokens=2 * epoch_tokens
    )
    assert np.array_equal(s.step_offsets(), expected)  # type: ignore[arg-type]


def test_optimizer_step_ends_marks_the_last_micro_batch_of_each_step() -> None:
    s = sampler(1, LinearRamp(2048, 8192, 300_000, unit="tokens"))
    ends = s.optimizer_step_ends()
    offsets = s.step_offsets()
    assert ends is not None
    assert offsets is not None
    assert ends.shape == (len(s),)
    assert ends.sum() == len(offsets) - 1
    assert ends[-1]
    assert np.flatnonzero(ends).tolist() == (offsets[1:] - 1).tolist()


def test_without_schedule_there_are_no_steps() -> None:
    s = sampler(0, None)
    assert s.step_offsets() is None
    assert s.optimizer_step_ends() is None


def test_schedule_is_part_of_the_resume_fingerprint() -> None:
    with_ramp = sampler(0, LinearRamp(2048, 8192, 300_000, unit="tokens"))
    other = sampler(0, LinearRamp(2048, 4096, 300_000, unit="tokens"))
    with pytest.raises(InvalidValueError, match="schedule"):
        other.load_state_dict(with_ramp.state_dict())
    state = with_ramp.state_dict()
    state["step"] = 5
    same = sampler(0, LinearRamp(2048, 8192, 300_000, unit="tokens"))
    same.load_state_dict(state)
    assert same.start_step == 5


def test_bad_schedule_type() -> None:
    with pytest.raises(InvalidTypeError, match="schedule"):
        sampler(0, 4096)


def packings_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record every packing the sampler's options build (one entry per call)."""
    import tokenbatch.torch._sampler_options as sampler_module

    calls: list[int] = []
    real_pack = sampler_module.pack

    def counting_pack(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real_pack(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sampler_module, "pack", counting_pack)
    return calls


@pytest.mark.parametrize("algorithm", ["bfd", "first_fit_shuffled"])
@pytest.mark.parametrize("oversize", ["split", "truncate", "drop"])
def test_every_epoch_trains_on_the_input_tokens_less_the_oversize_policy(
    algorithm: str, oversize: str
) -> None:
    # What makes the tokens before an epoch a closed form: every epoch (each with its own
    # packing under first_fit_shuffled) holds every token the oversize policy keeps.
    lengths = np.concatenate([LENGTHS, [3000, 5000]])
    s = TokenBudgetBatchSampler(
        lengths, 2048, num_replicas=3, seed=5, algorithm=algorithm, oversize=oversize
    )  # type: ignore[arg-type]
    kept = {"split": 3000 + 5000, "truncate": 2 * 2048, "drop": 0}[oversize]
    expected = int(LENGTHS.sum()) + kept
    for epoch in range(4):
        s.set_epoch(epoch)
        assert int(s.plan().real_tokens().sum()) == expected


@pytest.mark.parametrize("algorithm", ["bfd", "first_fit_shuffled"])
def test_step_offsets_at_a_late_epoch_do_not_replan_earlier_ones(
    algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ramp = LinearRamp(2048, 65536, 40 * int(LENGTHS.sum()), unit="tokens")
    s = sampler(0, ramp, algorithm=algorithm)
    built = packings_built(monkeypatch)
    s.set_epoch(100)
    offsets = s.step_offsets()
    assert len(built) <= 1  # the packing of epoch 100 itself, when every epoch repacks
    micro_batches = s.plan().real_tokens().reshape(-1)
    expected = group_into_steps(micro_batches, ramp, 2, consumed_tokens=100 * int(LENGTHS.sum()))
    assert np.array_equal(offsets, expected)  # type: ignore[arg-type]


def test_drop_last_with_repacking_counts_each_epochs_own_tokens() -> None:
    # first_fit_shuffled repacks every epoch, so drop_last leaves out other tokens every
    # epoch: the tokens before epoch 3 are those the three earlier plans really held.
    ramp = LinearRamp(2048, 65536, 3 * int(LENGTHS.sum()), unit="tokens")
    options = {"algorithm": "first_fit_shuffled", "drop_last": True}
    held = []
    for epoch in range(3):
        earlier = TokenBudgetBatchSampler(LENGTHS, 1024, num_replicas=3, seed=3, **options)  # type: ignore[arg-type]
        earlier.set_epoch(epoch)
        held.append(int(earlier.plan().real_tokens().sum()))
    assert len(set(held)) > 1, "the epochs should drop different tokens"
    s = TokenBudgetBatchSampler(LENGTHS, 1024, num_replicas=3, seed=3, schedule=ramp, **options)  # type: ignore[arg-type]
    s.set_epoch(3)
    micro_batches = s.plan().real_tokens().reshape(-1)
    expected = group_into_steps(micro_batches, ramp, 3, consumed_tokens=sum(held))
    assert np.array_equal(s.step_offsets(), expected)  # type: ignore[arg-type]
    # The state carries that count, so a resume does not recount the earlier epochs.
    state = s.state_dict()
    assert state["tokens_before_epoch"] == sum(held)
    resumed = TokenBudgetBatchSampler(
        LENGTHS, 1024, num_replicas=3, seed=3, schedule=ramp, **options
    )  # type: ignore[arg-type]
    resumed.load_state_dict(state)
    assert resumed._tokens_before(3) == sum(held)
    assert np.array_equal(resumed.step_offsets(), expected)  # type: ignore[arg-type]
