"""optimizer_steps: grouping into optimizer steps, and label tokens counted from the plan
equal to the labels the collator really produces on all ranks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenbatch.errors import InvalidValueError
from tokenbatch.schedule import LinearRamp
from tokenbatch.torch import (
    PackedCollator,
    PaddedCollator,
    SegmentDataset,
    TokenBudgetBatchSampler,
    optimizer_steps,
)


def documents(lengths: list[int], prompt: list[int] | None = None) -> list[dict[str, object]]:
    """Token ``j`` of document ``i`` is ``j``; the first ``prompt[i]`` labels are masked."""
    items: list[dict[str, object]] = []
    for i, n in enumerate(lengths):
        item: dict[str, object] = {"input_ids": np.arange(n)}
        if prompt is not None:
            labels = np.arange(n)
            labels[: prompt[i]] = -100
            item["labels"] = labels
        items.append(item)
    return items


def labels_per_step(
    samplers: list[TokenBudgetBatchSampler],
    dataset: object,
    offsets: np.ndarray,
    collator: object,
) -> list[int]:
    """Labels other than -100 that the collator produces, all ranks, per optimizer step;
    a causal LM shifts labels, so a row's first label is never a target."""
    per_micro_batch = np.zeros(len(samplers[0]), dtype=np.int64)
    for sampler in samplers:
        for i, batch in enumerate(sampler):
            labels = collator([dataset[j] for j in batch])["labels"]  # type: ignore[index, operator]
            per_micro_batch[i] += int((labels[:, 1:] != -100).sum())
    return [int(per_micro_batch[a:b].sum()) for a, b in itertools.pairwise(offsets)]


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 90), min_size=4, max_size=60),
    num_replicas=st.integers(1, 3),
    per_step=st.integers(1, 4),
    split=st.booleans(),
    padded=st.booleans(),
)
def test_label_tokens_equal_the_collated_labels_of_every_rank(
    lengths: list[int], num_replicas: int, per_step: int, split: bool, padded: bool
) -> None:
    max_tokens = 64
    oversize = "split" if split else "truncate"
    try:
        samplers = [
            TokenBudgetBatchSampler(
                lengths,
                max_tokens,
                num_replicas=num_replicas,
                rank=rank,
                oversize=oversize,
                mode="padded" if padded else "packed",
            )
            for rank in range(num_replicas)
        ]
    except InvalidValueError:
        return  # too few sequences for this many ranks
    steps = optimizer_steps(samplers[0], micro_batches_per_step=per_step)
    assert steps.n_micro_batches == len(samplers[0])
    assert np.diff(steps.offsets).max(initial=0) <= per_step
    collator = PaddedCollator() if padded else PackedCollator()
    dataset = SegmentDataset(documents(lengths))
    counted = labels_per_step(samplers, dataset, steps.offsets, collator)
    assert steps.label_tokens.tolist() == counted
    # Every rank computes the same steps without communicating.
    for other in samplers[1:]:
        again = optimizer_steps(other, micro_batches_per_step=per_step)
        assert again.label_tokens.tolist() == steps.label_tokens.tolist()


def test_label_counts_of_masked_prompts() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 200, 300).tolist()
    prompt = [int(rng.integers(0, n)) for n in lengths]
    dataset = documents(lengths, prompt)
    counts = [int((np.asarray(item["labels"])[1:] != -100).sum()) for item in dataset]
    samplers = [TokenBudgetBatchSampler(lengths, 512, num_replicas=2, rank=r) for r in range(2)]
    steps = optimizer_steps(samplers[0], micro_batches_per_step=3, label_counts=counts)
    assert steps.label_tokens.tolist() == labels_per_step(
        samplers, dataset, steps.offsets, PackedCollator()
    )
    # Without the counts, every token after the first counts.
    plain = optimizer_steps(samplers[0], micro_batches_per_step=3)
    assert plain.label_tokens.sum() == sum(n - 1 for n in lengths)
    assert steps.label_tokens.sum() == sum(counts) < plain.label_tokens.sum()


def test_steps_follow_the_schedule() -> None:
    lengths = np.random.default_rng(1).integers(1, 1024, 3000)
    ramp = LinearRamp(4096, 16384, 600_000, unit="tokens")
    sampler = TokenBudgetBatchSampler(lengths, 1024, num_replicas=2, rank=0, schedule=ramp)
    steps = optimizer_steps(sampler)
    offsets = sampler.step_offsets()
    assert offsets is not None
    assert steps.offsets.tolist() == offsets.tolist()
    ends = sampler.optimizer_step_ends()
    assert ends is not None
    assert steps.ends.tolist() == ends.tolist()
    with pytest.raises(InvalidValueError, match="schedule decides"):
        optimizer_steps(sampler, micro_batches_per_step=2)


def test_lookup_by_micro_batch() -> None:
    lengths = np.random.default_rng(2).integers(1, 400, 500)
    sampler = TokenBudgetBatchSampler(lengths, 1024, num_replicas=2, rank=1)
    steps = optimizer_steps(sampler, micro_batches_per_step=4)
    n = len(sampler)
    assert len(steps) == -(-n // 4)
    assert [steps.step_of(i) for i in range(n)] == [i // 4 for i in range(n)]
    assert steps.num_items_in_batch(n - 1) == steps.label_tokens[-1]
    assert steps.ends.nonzero()[0].tolist() == sorted({min(i + 4, n) - 1 for i in range(0, n, 4)})
    assert [steps.step_ending_at(i) for i in range(n)] == [
        i // 4 if i % 4 == 3 or i == n - 1 else None for i in range(n)
    ]
    for lookup in (steps.step_of, steps.step_ending_at):
        with pytest.raises(InvalidValueError, match="beyond"):
            lookup(n)


def test_another_epoch_leaves_the_sampler_where_it_was() -> None:
    lengths = np.random.default_rng(3).integers(1, 1024, 2000)
    ramp = LinearRamp(4096, 16384, 400_000, unit="tokens")
    sampler = TokenBudgetBatchSampler(lengths, 1024, num_replicas=2, rank=0, schedule=ramp)
    iterator = iter(sampler)
    for _ in range(5):
        next(iterator)
    state = sampler.state_dict()
    resumed = TokenBudgetBatchSampler(lengths, 1024, num_replicas=2, rank=0, schedule=ramp)
    resumed.load_state_dict(state)
    later = optimizer_steps(resumed, epoch=1)
    assert resumed.epoch == 0
    assert resumed.start_step == 5
    reference = TokenBudgetBatchSampler(lengths, 1024, num_replicas=2, rank=0, schedule=ramp)
    reference.set_epoch(1)
    assert later.offsets.tolist() == optimizer_steps(reference).offsets.tolist()
    # The ramp has grown by then: fewer, larger steps.
    assert len(later) < len(optimizer_steps(resumed))


def test_bad_label_counts() -> None:
    sampler = TokenBudgetBatchSampler([5, 3, 8, 2], 16, num_replicas=1, rank=0)
    with pytest.raises(InvalidValueError, match="4 sequences"):
        optimizer_steps(sampler, label_counts=[1, 2])
    with pytest.raises(InvalidValueError, match=r"label_counts\[1\] = 3"):
        optimizer_steps(sampler, label_counts=[1, 3, 1, 1])
    split = TokenBudgetBatchSampler([5, 30], 16, num_replicas=1, rank=0, oversize="split")
    with pytest.raises(InvalidValueError, match="whole sequences"):
        optimizer_steps(split, label_counts=[4, 29])
