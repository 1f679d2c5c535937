"""PyTorch integration: a token-budget batch sampler for distributed training, the
collators that turn its batches into padding-free or padded tensors (also of preference
pairs and of vision-language documents), a streaming dataset that packs a stream of
unknown length, and evaluation passes that see every document once and reduce the losses
exactly.

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
from tokenbatch.torch.document_loss import DocumentLosses, EvaluationResult, document_losses
from tokenbatch.torch.evaluation import (
    EvaluationBatchSampler,
    EvaluationCollator,
    EvaluationDataset,
    model_inputs,
)
from tokenbatch.torch.preference import (
    IncompletePairError,
    PreferenceCollator,
    dpo_loss,
    pair_lengths,
    sequence_logps,
)
from tokenbatch.torch.sampler import BatchIndices, TokenBudgetBatchSampler
from tokenbatch.torch.steps import OptimizerSteps, optimizer_steps
from tokenbatch.torch.streaming import StreamingDataset
from tokenbatch.torch.sync import stop_together
from tokenbatch.torch.vision import VisionLanguageCollator, mrope_position_ids

__all__ = [
    "BatchIndices",
    "ContextParallelCollator",
    "DocumentLosses",
    "EvaluationBatchSampler",
    "EvaluationCollator",
    "EvaluationDataset",
    "EvaluationResult",
    "IncompletePairError",
    "OptimizerSteps",
    "PackedCollator",
    "PaddedCollator",
    "PreferenceCollator",
    "SegmentDataset",
    "StreamingDataset",
    "TokenBudgetBatchSampler",
    "VisionLanguageCollator",
    "document_losses",
    "dpo_loss",
    "model_inputs",
    "mrope_position_ids",
    "optimizer_steps",
    "pair_lengths",
    "sequence_lengths",
    "sequence_logps",
    "shard_batch",
    "stop_together",
    "unshard",
]
