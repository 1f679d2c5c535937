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
option). A sampler with a ``schedule`` (or a ``mixture``) decides how many micro-batches
make each optimizer step: the module then uses manual optimization and steps where
:meth:`TokenBudgetCallback.is_step_end` says (automatic optimization is refused). With a
``mixture``, every optimizer step logs ``source_tokens/<source>``, the real tokens it took
from each source over all ranks. The callback uses Lightning's hooks only, and at every
epoch's start checks that the loader Lightning trains on still draws from its sampler.

Given an ``eval_batch_sampler`` (an :class:`~tokenbatch.torch.EvaluationBatchSampler`),
the callback also runs exact validation: every document of the validation set once over
the ranks, each rank's per-document losses collected by :meth:`TokenBudgetCallback.add_eval_batch`
and reduced at the end of the validation epoch into ``val_loss``, the corpus token-mean::

    def val_dataloader(self):
        return DataLoader(EvaluationDataset(val_set), batch_sampler=budget.eval_sampler,
                          collate_fn=EvaluationCollator())

    def validation_step(self, batch, batch_idx):
        logits = self.model(**model_inputs(batch), use_cache=False).logits
        budget.add_eval_batch(logits, batch)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
import numpy.typing as npt
from torch.utils.data import DataLoader

from tokenbatch.errors import InvalidValueError
from tokenbatch.integrations._packed_rows import warn_if_documents_mix
from tokenbatch.integrations._source import (
    SamplerFrom,
    build_evaluation_sampler,
    check_evaluation_source,
)
from tokenbatch.torch.document_loss import DocumentLosses, EvaluationResult
from tokenbatch.torch.evaluation import EvaluationBatchSampler
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
        eval_batch_sampler: optional: the validation set's
            :class:`~tokenbatch.torch.EvaluationBatchSampler`, or a function returning it
            (called in ``setup``, as ``batch_sampler``). Validation then logs
            ``{eval_prefix}_loss``, the token-mean loss over the whole validation set, and
            :attr:`last_evaluation` holds every document's own loss; the sanity check's
            partial pass is not reduced.
        eval_prefix: the prefix of the logged validation metrics.

    Raises:
        InvalidValueError: in ``setup``, a sampler was built for other ranks than the
            Trainer's; at an epoch's start, the training loader does not draw its batches
            from the sampler (Lightning replaced it); at the end of validation, a
            document no rank evaluated (a partial pass: ``limit_val_batches``).
    """

    def __init__(
        self,
        batch_sampler: TokenBudgetBatchSampler | Callable[[], TokenBudgetBatchSampler],
        *,
        label_counts: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
        eval_batch_sampler: EvaluationBatchSampler
        | Callable[[], EvaluationBatchSampler]
        | None = None,
        eval_prefix: str = "val",
    ) -> None:
        check_evaluation_source(eval_batch_sampler, "no arguments")
        self._eval_source = eval_batch_sampler
        self._eval_sampler: EvaluationBatchSampler | None = None
        self._eval_losses: DocumentLosses | None = None
        self.eval_prefix = eval_prefix
        #: The result of the last complete validation pass (``None`` before one).
        self.last_evaluation: EvaluationResult | None = None
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

    def is_step_end(self, batch_idx: int) -> bool:
        """Whether micro-batch ``batch_idx`` of the current epoch completes an optimizer
        step of the plan: where a module under manual optimization steps its optimizer
        when the sampler has a ``schedule`` (or a ``mixture``)."""
        return self.steps.step_ending_at(batch_idx) is not None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Build the sampler (once the processes exist) and check it against the Trainer:
        a sampler ``schedule`` (or ``mixture``) sets how many micro-batches make each
        optimizer step, which Lightning's automatic optimization cannot follow, so it
        needs manual optimization. Warns if the module holds a Hugging Face model whose
        attention would mix the documents of a packed row (sdpa or eager before torch
        2.6)."""
        sampler = self._source.build()
        _check_ranks(sampler, trainer)
        if sampler.schedule is not None and pl_module.automatic_optimization:
            raise InvalidValueError(
                "the sampler's schedule (or mixture) sets how many micro-batches make each "
                "optimizer step, but Lightning's automatic optimization steps every "
                "accumulate_grad_batches micro-batches: set automatic_optimization = False in "
                "the LightningModule and step the optimizer where "
                "TokenBudgetCallback.is_step_end(batch_idx)"
            )
        warn_if_documents_mix(pl_module)
        self._world_size = trainer.world_size
        self._accumulate = trainer.accumulate_grad_batches
        source = self._eval_source
        if source is not None and self._eval_sampler is None:
            eval_sampler = build_evaluation_sampler(source)
            _check_ranks(eval_sampler, trainer)
            self._eval_sampler = eval_sampler

    # -- validation ---------------------------------------------------------------------

    @property
    def eval_sampler(self) -> EvaluationBatchSampler:
        """The validation batch sampler, for the ``val_dataloader`` hook (built in
        ``setup``)."""
        if self._eval_sampler is None:
            raise InvalidValueError(
                "no evaluation sampler: pass eval_batch_sampler to the callback, and read "
                "eval_sampler in val_dataloader(), once the Trainer has set the callback up"
            )
        return self._eval_sampler

    def add_eval_batch(self, logits: Any, batch: Any) -> None:
        """Add the per-document losses of one validation row (an
        :class:`~tokenbatch.torch.EvaluationCollator` batch) from the model's logits."""
        if self._eval_losses is None:
            raise InvalidValueError(
                "add_eval_batch is for validation_step, between the validation epoch's start "
                "and end"
            )
        self._eval_losses.add_batch(logits, batch)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start collecting the pass's per-document losses."""
        if self._eval_sampler is not None:
            self._eval_losses = DocumentLosses(self._eval_sampler.n_documents)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Reduce the pass over the ranks and log ``{eval_prefix}_loss`` (the same value on
        every rank); the sanity check's partial pass is dropped."""
        losses, self._eval_losses = self._eval_losses, None
        if losses is None or trainer.sanity_checking:
            return
        result = losses.reduce()
        self.last_evaluation = result
        for name, value in result.metrics(self.eval_prefix).items():
            pl_module.log(name, value, sync_dist=False)

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
        epoch's start, also after a resume); at the end of an optimizer step of a mixture
        sampler, log ``source_tokens/<source>``, the real tokens the step took from each
        source over all ranks (per step, and summed over the epoch)."""
        self._position = batch_idx + 1
        steps = self.steps
        if steps.sources is None or steps.source_tokens is None:
            return
        step = steps.step_ending_at(batch_idx)
        if step is None:
            return
        for name, tokens in zip(steps.sources, steps.source_tokens[step], strict=True):
            pl_module.log(
                f"source_tokens/{name}",
                float(tokens),
                on_step=True,
                on_epoch=True,
                reduce_fx="sum",
                sync_dist=False,
            )

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


def _check_ranks(
    sampler: TokenBudgetBatchSampler | EvaluationBatchSampler, trainer: pl.Trainer
) -> None:
    """Refuse a sampler built for other ranks than the Trainer's."""
    if (sampler.num_replicas, sampler.rank) != (trainer.world_size, trainer.global_rank):
        raise InvalidValueError(
            f"the {type(sampler).__name__} was built for rank {sampler.rank} of "
            f"{sampler.num_replicas}, but this is rank {trainer.global_rank} of "
            f"{trainer.world_size}: pass a function that builds it (called once the "
            "processes exist), or build it with num_replicas=trainer.world_size, "
            "rank=trainer.global_rank"
        )
