"""Consecutive runs of one sampler epoch on changing world sizes, each resuming from the
state the last one saved: the batches every rank trained on, over all the runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokenbatch.torch import TokenBudgetBatchSampler


def batches_over_runs(
    make: Callable[[int, int], TokenBudgetBatchSampler],
    runs: Sequence[tuple[int, int | None]],
) -> list[list[int]]:
    """Run ``(replicas, steps)`` one after the other (``steps=None``: to the epoch's end)
    with the samplers ``make(replicas, rank)``; all ranks of a run have equal lengths."""
    batches: list[list[int]] = []
    state = None
    for replicas, steps in runs:
        samplers = [make(replicas, rank) for rank in range(replicas)]
        for sampler in samplers:
            if state is not None:
                sampler.load_state_dict(state, allow_resize=True)
        assert len({len(s) for s in samplers}) == 1
        for sampler in samplers:
            iterator = iter(sampler)
            take = len(sampler) - sampler.start_step if steps is None else steps
            batches.extend(next(iterator) for _ in range(take))
        state = samplers[0].state_dict()
    return batches
