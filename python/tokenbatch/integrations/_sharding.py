"""Whether Accelerate shards the batches of a token-budget sampler a second time.

``accelerator.prepare(loader)`` (and so every trainer built on Accelerate) wraps a
loader's batch sampler in ``accelerate.data_loader.BatchSamplerShard``, which keeps every
``P``-th batch on each of ``P`` processes. A ``TokenBudgetBatchSampler`` already yields
only its own rank's batches, so the wrapper would silently drop about ``1 - 1/P`` of
them. The sampler asks here when it starts an iteration, which happens inside the
iteration of the loader that draws from it: a loader Accelerate prepared is then
``GradientState().active_dataloader`` (a documented attribute of Accelerate's
``GradientState``), and what it holds says whether it shards the sampler. tokenbatch
never imports Accelerate for this: when nothing has imported it, nothing can have
wrapped the sampler.
"""

from __future__ import annotations

import sys


def accelerate_shards(sampler: object) -> int:
    """The number of processes over which the data loader Accelerate is iterating shards
    the batches of ``sampler`` (1: it does not, or Accelerate iterates no loader)."""
    data_loader = sys.modules.get("accelerate.data_loader")
    state = sys.modules.get("accelerate.state")
    if data_loader is None or state is None:
        return 1
    shard = getattr(state.GradientState().active_dataloader, "batch_sampler", None)
    if isinstance(shard, data_loader.BatchSamplerShard) and shard.batch_sampler is sampler:
        return int(shard.num_processes)
    return 1
