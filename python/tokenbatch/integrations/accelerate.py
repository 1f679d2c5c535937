"""Accelerate with the token-budget sampler, without losing or repeating data.

``accelerator.prepare(loader)`` shards the batches of every batch sampler over the
processes: with more than one process it wraps the loader's batch sampler in
``accelerate.data_loader.BatchSamplerShard``, which keeps batches ``r, r + P, r + 2P, ...``
on process ``r``. :class:`~tokenbatch.torch.TokenBudgetBatchSampler` is already
rank-aware (each rank yields its own column of one shared plan), so sharded once more each
rank would run half its steps and train on about ``1 / P`` of the data, with no error.
:func:`prepare_data_loader` prepares the loader the same way but lets the sampler's
batches through unsharded, as ``transformers.Trainer`` does for its own rank-aware
sampler::

    from tokenbatch.integrations.accelerate import prepare_data_loader

    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=PackedCollator())
    loader = prepare_data_loader(accelerator, loader)  # not accelerator.prepare(loader)
"""

from __future__ import annotations

from typing import Any

from accelerate import Accelerator
from accelerate.data_loader import BatchSamplerShard
from torch.utils.data import DataLoader

from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.torch.sampler import TokenBudgetBatchSampler

__all__ = ["prepare_data_loader"]


def prepare_data_loader(
    accelerator: Accelerator, loader: DataLoader[Any], *, device_placement: bool | None = None
) -> DataLoader[Any]:
    """``accelerator.prepare_data_loader(loader)`` for a loader whose batch sampler is a
    :class:`~tokenbatch.torch.TokenBudgetBatchSampler`, with the sampler's batches passed
    through unsharded.

    The result is Accelerate's own prepared loader (device placement, the end-of-data
    signal of gradient accumulation, ``accelerator.save_state`` bookkeeping), so use it as
    any prepared loader; call ``sampler.set_epoch(epoch)`` before each epoch, and resume
    with ``sampler.load_state_dict`` rather than ``accelerator.skip_first_batches`` (which
    would replay the skipped batches).

    Raises:
        InvalidTypeError: the loader's batch sampler is not a ``TokenBudgetBatchSampler``.
        InvalidValueError: the sampler was built for other ranks than the accelerator's
            processes (for example before the process group existed), or the accelerator
            dispatches batches from the main process (``dispatch_batches=True``).
    """
    sampler = _token_budget_sampler(loader)
    if sampler is None:
        raise InvalidTypeError(
            "loader.batch_sampler must be a TokenBudgetBatchSampler, got "
            f"{type(loader.batch_sampler).__name__}; for other samplers use accelerator.prepare"
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
    prepared = accelerator.prepare_data_loader(loader, device_placement=device_placement)
    shard = prepared.batch_sampler
    if isinstance(shard, BatchSamplerShard) and shard.batch_sampler is sampler:
        # One "process" yields every batch: what transformers.Trainer does for its own
        # rank-aware BatchRebalanceSampler.
        shard.num_processes = 1
        shard.process_index = 0
    result: DataLoader[Any] = prepared
    return result


def _token_budget_sampler(loader: object) -> TokenBudgetBatchSampler | None:
    """The :class:`~tokenbatch.torch.TokenBudgetBatchSampler` a loader draws its batches
    from (directly, or through Accelerate's ``BatchSamplerShard``), else ``None``."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    if isinstance(batch_sampler, BatchSamplerShard):
        batch_sampler = batch_sampler.batch_sampler
    return batch_sampler if isinstance(batch_sampler, TokenBudgetBatchSampler) else None
