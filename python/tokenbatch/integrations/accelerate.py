"""Accelerate with the token-budget sampler, without losing or repeating data.

``accelerator.prepare(loader)`` shards the batches of every batch sampler over the
processes: with more than one process it wraps the loader's batch sampler in
``accelerate.data_loader.BatchSamplerShard``, which keeps batches ``r, r + P, r + 2P, ...``
on process ``r``. :class:`~tokenbatch.torch.TokenBudgetBatchSampler` is already
rank-aware (each rank yields its own column of one shared plan), so sharded once more each
rank would run half its steps and train on about ``1 / P`` of the data, with no error.
:func:`prepare_data_loader` prepares the loader with Accelerate's documented
``accelerate.data_loader.prepare_data_loader`` for one process, with the accelerator's
settings, so the sampler's batches pass through unsharded (and the sampler refuses to be
iterated under a plain ``accelerator.prepare``, see ``docs/trainers.md``)::

    from tokenbatch.integrations.accelerate import prepare_data_loader

    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=PackedCollator())
    loader = prepare_data_loader(accelerator, loader)  # not accelerator.prepare(loader)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import accelerate.data_loader
from accelerate import Accelerator
from torch.utils.data import DataLoader

from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.integrations._compat import accelerate as accelerate_compat
from tokenbatch.torch.sampler import BatchIndices, TokenBudgetBatchSampler

__all__ = ["prepare_data_loader"]

#: DataLoader options carried over to the prepared loader, where this torch has them.
_LOADER_OPTIONS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def prepare_data_loader(
    accelerator: Accelerator, loader: DataLoader[Any], *, device_placement: bool | None = None
) -> DataLoader[Any]:
    """``accelerator.prepare_data_loader(loader)`` for a loader whose batch sampler is a
    :class:`~tokenbatch.torch.TokenBudgetBatchSampler`, with the sampler's batches passed
    through unsharded.

    The result is Accelerate's own prepared loader (device placement, the end-of-data
    signal of gradient accumulation, ``accelerator.save_state`` bookkeeping), so use it as
    any prepared loader; call ``sampler.set_epoch(epoch)`` before each epoch (the prepared
    loader leaves the sampler's epoch alone), and resume with ``sampler.load_state_dict``
    rather than ``accelerator.skip_first_batches`` (which would replay the skipped
    batches).

    Raises:
        InvalidTypeError: the loader's batch sampler is not a ``TokenBudgetBatchSampler``.
        InvalidValueError: the sampler was built for other ranks than the accelerator's
            processes (for example before the process group existed), or the accelerator
            dispatches batches from the main process (``dispatch_batches=True``).
    """
    sampler = loader.batch_sampler
    if not isinstance(sampler, TokenBudgetBatchSampler):
        raise InvalidTypeError(
            "loader.batch_sampler must be a TokenBudgetBatchSampler, got "
            f"{type(sampler).__name__}; for other samplers use accelerator.prepare"
        )
    if (sampler.num_replicas, sampler.rank) != (
        accelerator.num_processes,
        accelerator.process_index,
    ):
        raise InvalidValueError(
            f"the sampler was built for rank {sampler.rank} of {sampler.num_replicas}, but this is "
            f"process {accelerator.process_index} of {accelerator.num_processes}: build it after "
            "the Accelerator (which starts the process group), or pass "
            "num_replicas=accelerator.num_processes, rank=accelerator.process_index"
        )
    if accelerator.dispatch_batches:
        raise InvalidValueError(
            "the accelerator dispatches batches from the main process (dispatch_batches=True), "
            "which would split the main process's micro-batches among the others; every rank "
            "reads its own micro-batches with dispatch_batches=False"
        )
    return prepare_batches(accelerator, loader, PlanBatches(sampler), device_placement)


class PlanBatches:
    """The batches of a token-budget sampler as the prepared loader draws them.

    It has no ``set_epoch`` and does not expose the sampler as ``sampler`` or
    ``batch_sampler``: Accelerate's loader sets its own iteration count as the epoch of
    what it holds, which would discard a position the sampler restored; the training
    loop sets the sampler's epoch. ``state_dict`` / ``load_state_dict`` are the
    sampler's, for a ``StatefulDataLoader``.
    """

    def __init__(self, sampler: TokenBudgetBatchSampler) -> None:
        self.token_budget_sampler = sampler

    def __iter__(self) -> Iterator[BatchIndices]:
        return iter(self.token_budget_sampler)

    def __len__(self) -> int:
        return len(self.token_budget_sampler)

    def state_dict(self) -> dict[str, Any]:
        return self.token_budget_sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.token_budget_sampler.load_state_dict(state)


def prepare_batches(
    accelerator: Accelerator,
    loader: DataLoader[Any],
    batches: PlanBatches,
    device_placement: bool | None = None,
) -> DataLoader[Any]:
    """``loader`` drawing ``batches``, prepared as ``accelerator.prepare_data_loader``
    does but for one process: Accelerate's documented ``prepare_data_loader`` with the
    accelerator's settings and ``num_processes=1``."""
    options = {name: getattr(loader, name) for name in _LOADER_OPTIONS if hasattr(loader, name)}
    unsharded: DataLoader[Any] = DataLoader(loader.dataset, batch_sampler=batches, **options)
    if device_placement is None:
        device_placement = accelerator.device_placement
    prepared: DataLoader[Any] = accelerate.data_loader.prepare_data_loader(
        unsharded,
        accelerator.device,
        num_processes=1,
        process_index=0,
        put_on_device=device_placement,
        rng_types=list(accelerator.rng_types),
        dispatch_batches=False,
        even_batches=accelerator.even_batches,
        use_seedable_sampler=accelerator.use_seedable_sampler,
        data_seed=accelerator.dataloader_config.data_seed,
        non_blocking=accelerator.non_blocking,
        use_stateful_dataloader=accelerator.use_stateful_dataloader,
    )
    accelerate_compat.track_data_loader(accelerator, prepared)
    return prepared
