"""PyTorch Lightning on token-budget micro-batches (the ``lightning`` extra).

:class:`TokenBudgetCallback` connects a :class:`~tokenbatch.torch.TokenBudgetBatchSampler`
to ``lightning.pytorch.Trainer``: it builds the sampler once the processes exist, sets its
epoch every epoch (Lightning sets the epoch of samplers, not of batch samplers), puts its
position in every checkpoint and restores it, so a run resumed mid-epoch trains on exactly
the batches an uninterrupted run would have, and it gives each micro-batch the label
tokens of its whole optimizer step over all ranks to normalize the loss::

    budget = TokenBudgetCallback(lambda: TokenBudgetBatchSampler(lengths, max_tokens=8192))
    trainer = Trainer(strategy="ddp", use_distributed_sampler=False, callbacks=[budget],
                      accumulate_grad_batches=4)

    # in the LightningModule (or DataModule):
    def train_dataloader(self):
        return DataLoader(dataset, batch_sampler=budget.sampler, collate_fn=PackedCollator())

    def training_step(self, batch, batch_idx):
        n = budget.num_items_in_batch(batch_idx)
        return self.model(**inputs, num_items_in_batch=n).loss * budget.loss_scale

``use_distributed_sampler=False`` keeps Lightning from replacing the sampler: the plan is
already distributed (with it on, Lightning refuses the sampler before training, naming the
option). The callback uses Lightning's hooks only, and at every epoch's start checks that
the loader Lightning trains on still draws from its sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
import numpy.typing as npt
from torch.utils.data import DataLoader

from tokenbatch.errors import InvalidValueError
from tokenbatch.integrations._source import SamplerFrom
from tokenbatch.torch.sampler import TokenBudgetBatchSampler
from tokenbatch.torch.steps import OptimizerSteps, optimizer_steps

__all__ = ["TokenBudgetCallback"]


class TokenBudgetCallback(pl.Callback):
    """Train a Lightning module on the micro-batches of a token-budget sampler.

    Args:
        batch_sampler: a function returning the training set's
            :class:`~tokenbatch.torch.TokenBudgetBatchSampler`, called once in the
            callback's ``setup``, after the processes and their process group exist (its
            ranks then default to the group's); or the sampler itself, built with
            ``num_replicas=trainer.world_size, rank=trainer.global_rank``.
        label_counts: label tokens of every sequence when labels mask more than each
            sequence's first token (see :func:`tokenbatch.torch.optimizer_steps`).

    Raises:
        InvalidValueError: in ``setup``, the sampler was built for other ranks than the
            Trainer's; at an epoch's start, the training loader does not draw its batches
            from the sampler (Lightning replaced it).
    """

    def __init__(
        self,
        batch_sampler: TokenBudgetBatchSampler | Callable[[], TokenBudgetBatchSampler],
        *,
        label_counts: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
    ) -> None:
        self._source = SamplerFrom(batch_sampler, "no arguments")
        self._label_counts = label_counts
        self._steps: OptimizerSteps | None = None
        self._accumulate = 1
        self._world_size = 1
        self._start = 0  # micro-batch of the epoch the current iteration started at
        self._position = 0  # micro-batches of the epoch trained on so far

    @property
    def sampler(self) -> TokenBudgetBatchSampler:
        """The batch sampler, for the ``train_dataloader`` hook (built in ``setup``)."""
        if self._source.sampler is None:
            raise InvalidValueError(
                "the sampler is built when the Trainer sets the callback up: read "
                "TokenBudgetCallback.sampler in train_dataloader(), not before fit()"
            )
        return self._source.sampler

    @property
    def loss_scale(self) -> int:
        """What to multiply a loss normalized by :meth:`num_items_in_batch` with before
        returning it from ``training_step``: the number of ranks (DDP averages gradients
        over them) times ``accumulate_grad_batches`` (Lightning divides the loss by it)."""
        return self._world_size * self._accumulate

    @property
    def steps(self) -> OptimizerSteps:
        """The optimizer steps of the current epoch: ``accumulate_grad_batches``
        micro-batches each, and their label tokens over all ranks."""
        if self._steps is None or self._steps.epoch != self.sampler.epoch:
            self._steps = optimizer_steps(
                self.sampler,
                micro_batches_per_step=self._accumulate,
                label_counts=self._label_counts,
            )
        return self._steps

    def num_items_in_batch(self, batch_idx: int) -> int:
        """Label tokens, over all ranks, of the optimizer step holding micro-batch
        ``batch_idx`` of the current epoch (Hugging Face models' ``num_items_in_batch``)."""
        return self.steps.num_items_in_batch(batch_idx)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Build the sampler (once the processes exist) and check it against the Trainer."""
        sampler = self._source.build()
        if (sampler.num_replicas, sampler.rank) != (trainer.world_size, trainer.global_rank):
            raise InvalidValueError(
                f"the sampler was built for rank {sampler.rank} of {sampler.num_replicas}, but "
                f"this is rank {trainer.global_rank} of {trainer.world_size}: pass a function "
                "that builds it (called once the processes exist), or build it with "
                "num_replicas=trainer.world_size, rank=trainer.global_rank"
            )
        self._world_size = trainer.world_size
        self._accumulate = trainer.accumulate_grad_batches

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Set the sampler's epoch (Lightning sets a loader's sampler's, not its batch
        sampler's), after checking that the training loader still draws from it."""
        loader = trainer.train_dataloader
        if isinstance(loader, DataLoader) and loader.batch_sampler is not self.sampler:
            raise InvalidValueError(
                "the training loader no longer draws its batches from the token-budget sampler "
                f"(it holds {type(loader.batch_sampler).__name__}): Lightning replaced it; "
                "pass Trainer(use_distributed_sampler=False), the plan is already distributed"
            )
        self.sampler.set_epoch(trainer.current_epoch)
        self._start = self._position = self.sampler.start_step
        self._steps = None

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Count the micro-batches of the epoch trained on (``batch_idx`` counts from the
        epoch's start, also after a resume)."""
        self._position = batch_idx + 1

    def state_dict(self) -> dict[str, Any]:
        """The sampler's position: the micro-batches the loop has trained on (Lightning
        and DataLoader workers fetch ahead of it)."""
        return {"sampler": self.sampler.state_dict(consumed_batches=self._position - self._start)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the sampler's position from a checkpoint (before Lightning iterates)."""
        sampler = self.sampler
        sampler.load_state_dict(state_dict["sampler"])
        if sampler.start_step >= len(sampler):
            # Saved at the end of an epoch: Lightning reads the next one from the iterator
            # it makes before any epoch hook.
            sampler.set_epoch(sampler.epoch + 1)
        self._start = self._position = sampler.start_step
        self._steps = None
