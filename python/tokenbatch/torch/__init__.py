"""PyTorch integration: a token-budget batch sampler for distributed training, the
collators that turn its batches into padding-free or padded tensors, and a streaming
dataset that packs a stream of unknown length.

::

    sampler = TokenBudgetBatchSampler(lengths, max_tokens=8192, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=PackedCollator())
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...

This package imports torch; the rest of tokenbatch does not.
"""

from __future__ import annotations

from tokenbatch.torch.collate import PackedCollator, PaddedCollator
from tokenbatch.torch.context_parallel import ContextParallelCollator, shard_batch, unshard
from tokenbatch.torch.data import SegmentDataset, sequence_lengths
from tokenbatch.torch.sampler import BatchIndices, TokenBudgetBatchSampler
from tokenbatch.torch.steps import OptimizerSteps, optimizer_steps
from tokenbatch.torch.streaming import StreamingDataset
from tokenbatch.torch.sync import stop_together

__all__ = [
    "BatchIndices",
    "ContextParallelCollator",
    "OptimizerSteps",
    "PackedCollator",
    "PaddedCollator",
    "SegmentDataset",
    "StreamingDataset",
    "TokenBudgetBatchSampler",
    "optimizer_steps",
    "sequence_lengths",
    "shard_batch",
    "stop_together",
    "unshard",
]
