"""Hugging Face ``Trainer`` on token-budget micro-batches (the ``hf`` extra).

:class:`TokenBudgetTrainer` is a ``transformers.Trainer`` whose training data come from a
:class:`~tokenbatch.torch.TokenBudgetBatchSampler`::

    args = TrainingArguments("out", gradient_accumulation_steps=4, ...)  # starts the group
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=8192)  # ranks from torch.distributed
    trainer = TokenBudgetTrainer(model=model, args=args, train_dataset=dataset,
                                 batch_sampler=sampler)
    trainer.train()                                  # or train(resume_from_checkpoint=True)

It gives, on any number of data-parallel processes:

* every sequence exactly once per epoch and the same number of micro-batches on every
  rank (the sampler's plan passes through Accelerate unsharded, see
  :mod:`tokenbatch.integrations.accelerate`), with the sampler's epoch set by the Trainer;
* optimizer steps of ``args.gradient_accumulation_steps`` micro-batches of the plan, or
  the steps of the sampler's batch-size ``schedule``;
* the loss of every micro-batch normalized by the label tokens of its whole optimizer step
  over all ranks, counted from the plan without a collective (``num_items_in_batch``);
* exact resume from a Trainer checkpoint mid-epoch: the sampler's position is saved in
  the checkpoint folder (``tokenbatch_sampler.json``) and restored, and the Trainer does
  not skip (replay) batches itself;
* with a ``mixture`` sampler, every training log holds ``source_tokens/<source>``: the real
  tokens each source gave the optimizer steps since the previous log, over all ranks.

It is built on the Trainer's public extension points: ``get_train_dataloader``,
``set_initial_training_values``, ``get_batch_samples``, ``training_step``,
``floating_point_ops`` and ``log`` overridden, a ``TrainerCallback`` that saves the
sampler's position with every checkpoint, and the arguments ``ignore_data_skip`` and
``gradient_accumulation_steps``: the Trainer's loop sees one item per optimizer step (all
its micro-batches), so ``trainer.args`` is a copy of the arguments with
``gradient_accumulation_steps=1`` and ``ignore_data_skip=True`` (the sampler starts where
it stopped, the Trainer skips nothing); :attr:`TokenBudgetTrainerMixin.micro_batches_per_step`
holds the value you gave. The Trainer's removal of unused columns is reached through
``tokenbatch.integrations._compat.transformers``, the only private hooks.
``per_device_train_batch_size``, ``group_by_length`` and ``dataloader_drop_last`` do not
apply: the sampler decides the batches.

With an ``eval_batch_sampler`` (an :class:`~tokenbatch.torch.EvaluationBatchSampler`),
``evaluate()`` runs every document of the evaluation set exactly once over the ranks and
reports the exact corpus token-mean loss, through the public ``get_eval_dataloader`` and
``evaluation_loop``.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback, TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, seed_worker

from tokenbatch.errors import InvalidValueError
from tokenbatch.integrations._compat import transformers as transformers_compat
from tokenbatch.integrations._hf_evaluation import EvaluationTrainerMixin
from tokenbatch.integrations._packed_rows import without_cache
from tokenbatch.integrations._source import SamplerFrom
from tokenbatch.integrations.accelerate import PlanBatches, prepare_batches
from tokenbatch.torch.collate import PackedCollator
from tokenbatch.torch.sampler import TokenBudgetBatchSampler
from tokenbatch.torch.steps import OptimizerSteps, optimizer_steps

__all__ = ["SAMPLER_STATE_NAME", "TokenBudgetTrainer", "TokenBudgetTrainerMixin"]

#: The file, in every checkpoint folder, that holds the sampler's position.
SAMPLER_STATE_NAME = "tokenbatch_sampler.json"

#: DataLoader options the Trainer's arguments give, where this transformers has them.
_LOADER_ARGUMENTS = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "multiprocessing_context": "dataloader_multiprocessing_context",
    "in_order": "dataloader_in_order",
}


class _StepBatches(list):  # type: ignore[type-arg]
    """The micro-batches of one optimizer step: one item of the Trainer's loop.

    Read by name (``inputs["input_ids"]``), it is the tokens of all its micro-batches,
    so that the Trainer's count of input tokens seen
    (``include_num_input_tokens_seen``) counts every micro-batch of the step.
    """

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return bool(self) and all(key in batch for batch in self)
        return super().__contains__(key)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return torch.cat([torch.as_tensor(batch[key]).reshape(-1) for batch in self])
        return super().__getitem__(key)


class _TrainerEpochs(PlanBatches):
    """The sampler's batches in the Trainer's loader, taking the Trainer's epochs: the
    first epoch the Trainer sets is the sampler's ``first`` epoch (where a resumed run
    continues), and each later one the next."""

    def __init__(self, sampler: TokenBudgetBatchSampler, first: int) -> None:
        super().__init__(sampler)
        self._first = first
        self._trainer_first: int | None = None

    def set_epoch(self, epoch: int) -> None:
        if self._trainer_first is None:
            self._trainer_first = epoch
        self.token_budget_sampler.set_epoch(self._first + epoch - self._trainer_first)


class _SaveSamplerState(TrainerCallback):
    """Writes the sampler's position into every checkpoint folder the Trainer saves."""

    def __init__(self, trainer: TokenBudgetTrainerMixin) -> None:
        self.trainer = trainer

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if args.should_save:
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            if not os.path.isdir(folder):
                raise InvalidValueError(
                    f"the Trainer saved no checkpoint at {folder} (a hyperparameter search "
                    "saves into folders of its own, which a token-budget Trainer does not "
                    "support): the sampler's position has nowhere to go"
                )
            with open(os.path.join(folder, SAMPLER_STATE_NAME), "w") as file:
                json.dump(self.trainer.sampler_state(), file, indent=1)


class _StepCursor:
    """Where the Trainer is in the current epoch's micro-batches."""

    def __init__(self, iterator: Iterator[Any], steps: OptimizerSteps, start: int) -> None:
        self.iterator = iterator
        self.steps = steps
        self.start = start  # micro-batch of the epoch the iteration started at
        self.position = start  # micro-batches of the epoch taken so far

    def next_step(self) -> tuple[list[Any], int]:
        """The micro-batches left of the optimizer step at the current position, and the
        step's index; nothing (and -1) at the end of the epoch."""
        if self.position >= self.steps.n_micro_batches:
            return [], -1
        step = self.steps.step_of(self.position)
        end = int(self.steps.offsets[step + 1])
        batches = list(itertools.islice(self.iterator, end - self.position))
        if len(batches) != end - self.position:
            raise RuntimeError(
                f"the data loader ended after micro-batch {self.position + len(batches)} of "
                f"epoch {self.steps.epoch}, but the sampler planned {self.steps.n_micro_batches}"
            )
        self.position = end
        return batches, step


class TokenBudgetTrainerMixin(EvaluationTrainerMixin):
    """Token-budget training for a ``transformers.Trainer`` subclass (see the module
    documentation); put it first among the bases, as :class:`TokenBudgetTrainer` and
    :class:`tokenbatch.integrations.trl.TokenBudgetSFTTrainer` do.

    Args:
        batch_sampler: the :class:`~tokenbatch.torch.TokenBudgetBatchSampler` of the
            training set, or a function that builds it from the training set the Trainer
            trains on (after its own preprocessing, as TRL's tokenization), called once
            at the start of training. Build it on every rank after the
            ``TrainingArguments``, which start the process group.
        label_counts: label tokens of every sequence when labels mask more than each
            sequence's first token (see :func:`tokenbatch.torch.optimizer_steps`).
        eval_batch_sampler: optional: the
            :class:`~tokenbatch.torch.EvaluationBatchSampler` of the evaluation set, or a
            function of the evaluation set that builds it. ``evaluate()`` then sees every
            document exactly once over the ranks and reports the corpus token-mean loss;
            :attr:`last_evaluation` holds every document's own loss too (see
            :class:`tokenbatch.integrations._hf_evaluation.EvaluationTrainerMixin`).
        *args, **kwargs: the Trainer's own arguments. ``data_collator`` defaults to
            :class:`~tokenbatch.torch.PackedCollator`.

    Raises:
        InvalidValueError: ``average_tokens_across_devices=False`` (the step's label
            tokens are counted over all ranks), or ``gradient_accumulation_steps > 1``
            with a sampler ``schedule`` (the schedule decides).
    """

    def __init__(
        self,
        *args: Any,
        batch_sampler: TokenBudgetBatchSampler | Callable[[Any], TokenBudgetBatchSampler],
        label_counts: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        source = SamplerFrom(batch_sampler, "the training set")
        if len(args) < 3 and kwargs.get("data_collator") is None:
            kwargs["data_collator"] = PackedCollator()
        super().__init__(*args, **kwargs)
        if not getattr(self.args, "average_tokens_across_devices", True):
            raise InvalidValueError(
                "average_tokens_across_devices=False: the loss of each micro-batch is normalized "
                "by the label tokens of its optimizer step on all ranks, which needs True"
            )
        #: Micro-batches of the plan per optimizer step (``gradient_accumulation_steps``).
        self.micro_batches_per_step: int = self.args.gradient_accumulation_steps
        self.args = copy.copy(self.args)
        self.args.gradient_accumulation_steps = 1
        self.args.ignore_data_skip = True
        self._sampler_source = source
        self._checked = False
        self._label_counts = label_counts
        self._cursor: _StepCursor | None = None
        # Tokens per source of the steps taken since the last log (mixture samplers).
        self._unlogged_source_tokens: npt.NDArray[np.int64] | None = None
        # (global step, epoch to start at) of the checkpoint train() resumes from.
        self._resume: tuple[int, int] | None = None
        self.add_callback(_SaveSamplerState(self))

    # -- the sampler ----------------------------------------------------------------

    @property
    def token_budget_sampler(self) -> TokenBudgetBatchSampler:
        """The batch sampler of the training set (built on first use from a function)."""
        sampler = self._sampler_source.build(self.train_dataset)
        if not self._checked:
            if sampler.schedule is not None and self.micro_batches_per_step != 1:
                raise InvalidValueError(
                    f"gradient_accumulation_steps={self.micro_batches_per_step} with a sampler "
                    "schedule: the schedule decides how many micro-batches make each optimizer "
                    "step; leave gradient_accumulation_steps at 1"
                )
            _check_lengths(sampler, self.train_dataset)
            self._checked = True
        return sampler

    def optimizer_steps(self, epoch: int | None = None) -> OptimizerSteps:
        """The optimizer steps of ``epoch`` (default: the sampler's current one) and the
        label tokens that normalize each."""
        return optimizer_steps(
            self.token_budget_sampler,
            micro_batches_per_step=self.micro_batches_per_step,
            label_counts=self._label_counts,
            epoch=epoch,
        )

    def get_train_dataloader(self) -> DataLoader[Any]:
        """A loader over the sampler's micro-batches, prepared by Accelerate unsharded."""
        if self.train_dataset is None:
            raise InvalidValueError("training needs a train_dataset")
        sampler = self.token_budget_sampler
        dataset, collator = transformers_compat.training_data(
            self, self.train_dataset, self.data_collator, _is_hf_dataset(self.train_dataset)
        )
        args = self.args
        options: dict[str, Any] = {
            option: getattr(args, argument)
            for option, argument in _LOADER_ARGUMENTS.items()
            if hasattr(args, argument)
        }
        options["worker_init_fn"] = partial(
            seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index
        )
        loader = DataLoader(dataset, collate_fn=collator, **options)
        first_epoch = self._resume[1] if self._resume else 0
        return prepare_batches(self.accelerator, loader, _TrainerEpochs(sampler, first_epoch))

    # -- the training loop ----------------------------------------------------------

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        """``Trainer.train``, restoring the sampler's position from the checkpoint."""
        self._resume = None
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)  # type: ignore[no-untyped-call]
            if resume_from_checkpoint is None:
                raise InvalidValueError(
                    f"no checkpoint to resume from in output_dir={self.args.output_dir!r}"
                )
        if isinstance(resume_from_checkpoint, (str, os.PathLike)):
            self._restore_sampler(os.fspath(resume_from_checkpoint))
        return super().train(
            resume_from_checkpoint=resume_from_checkpoint or None,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            **kwargs,
        )

    def set_initial_training_values(self, args: Any, dataloader: Any, *rest: Any) -> Any:
        """The Trainer's epoch and step counts, exact from the plan: optimizer steps per
        epoch vary with a schedule, and a resumed epoch has only its remaining steps.

        Of the values the Trainer computes, the epochs to train, the optimizer steps per
        epoch, the steps in an epoch and the total steps (first, second, sixth and last)
        are replaced; the Trainer counts the epochs a resumed run has trained as the
        checkpoint's global step over the steps per epoch, so the epochs to train start
        from there.
        """
        values = list(super().set_initial_training_values(args, dataloader, *rest))
        global_step, start_epoch = self._resume or (0, 0)
        sampler = self.token_budget_sampler
        counts: list[int] = []  # optimizer steps left in each epoch from start_epoch on

        def steps_left(epoch: int, fraction: float = 1.0) -> int:
            steps = self.optimizer_steps(epoch)
            planned = math.ceil(fraction * len(steps))
            if epoch != sampler.epoch or sampler.start_step == 0:
                return planned
            done = steps.step_of(sampler.start_step) if sampler.start_step < len(sampler) else 0
            return max(planned - done, 0)

        if args.max_steps > 0:
            max_steps = int(args.max_steps)
            epoch = start_epoch
            while global_step + sum(counts) < max_steps:
                counts.append(steps_left(epoch))
                if counts[-1] == 0:
                    raise InvalidValueError(f"epoch {epoch} of the sampler has no optimizer step")
                epoch += 1
        else:
            num_train_epochs = math.ceil(args.num_train_epochs)
            fraction = args.num_train_epochs - (num_train_epochs - 1)
            for epoch in range(start_epoch, num_train_epochs):
                last = epoch == num_train_epochs - 1
                counts.append(steps_left(epoch, fraction if last else 1.0))
            max_steps = global_step + sum(counts)
        per_epoch = max([*counts, 1])
        # The Trainer's own epoch count restarts at global_step // per_epoch.
        values[0] = global_step // per_epoch + len(counts)
        values[1] = values[5] = per_epoch
        values[-1] = max_steps
        return tuple(values)

    def get_batch_samples(
        self, epoch_iterator: Iterator[Any], num_batches: int, device: torch.device
    ) -> tuple[list[Any], torch.Tensor | int | None]:
        """The micro-batches of the next optimizer step of the plan, as one item, and the
        label tokens of the whole step on all ranks (``num_items_in_batch``)."""
        cursor = self._cursor
        if cursor is None or cursor.iterator is not epoch_iterator:
            # A new epoch (or a resumed one): nothing has been read from the iterator yet,
            # so the sampler still knows where it will start.
            sampler = self.token_budget_sampler
            cursor = _StepCursor(epoch_iterator, self.optimizer_steps(), sampler.start_step)
            self._cursor = cursor
        batches, step = cursor.next_step()
        if not batches:
            return [], None
        source_tokens = cursor.steps.source_tokens
        if source_tokens is not None:
            unlogged = self._unlogged_source_tokens
            taken = source_tokens[step]
            self._unlogged_source_tokens = taken if unlogged is None else unlogged + taken
        label_tokens = int(cursor.steps.label_tokens[step])
        return [_StepBatches(batches)], torch.tensor(label_tokens, device=device)

    def training_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """Forward and backward over every micro-batch of one optimizer step, gradients
        synchronized across ranks only on the last one."""
        if not isinstance(inputs, _StepBatches):
            return super().training_step(model, inputs, num_items_in_batch)
        # Without num_items_in_batch (a model that takes no loss kwargs) the Trainer
        # divides each micro-batch's mean loss by this.
        self.current_gradient_accumulation_steps = len(inputs)
        total: torch.Tensor | None = None
        for i, batch in enumerate(inputs):
            last = i == len(inputs) - 1
            context = contextlib.nullcontext() if last else self.accelerator.no_sync(model)
            with context:
                loss = super().training_step(model, batch, num_items_in_batch)
            total = loss if total is None else total + loss
        assert total is not None  # an optimizer step has at least one micro-batch
        return total

    def compute_loss(
        self, model: torch.nn.Module, inputs: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        """The Trainer's loss of a packed micro-batch, with the model's cache off so that its
        documents do not attend to each other."""
        return super().compute_loss(model, without_cache(self.model, inputs), *args, **kwargs)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """``Trainer.log``, with ``source_tokens/<source>`` added for a mixture sampler: the
        real tokens each source gave the optimizer steps since the previous log (all
        ranks). Logs without new steps (evaluation) are left as they are."""
        unlogged = self._unlogged_source_tokens
        if unlogged is not None:
            names = self.token_budget_sampler.sources or ()
            counts = {f"source_tokens/{n}": int(t) for n, t in zip(names, unlogged, strict=True)}
            logs = {**logs, **counts}
            self._unlogged_source_tokens = None
        super().log(logs, *args, **kwargs)

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """FLOPs of a micro-batch, or of every micro-batch of an optimizer step."""
        if isinstance(inputs, _StepBatches):
            return sum(super(TokenBudgetTrainerMixin, self).floating_point_ops(b) for b in inputs)
        return super().floating_point_ops(inputs)

    # -- checkpoints ----------------------------------------------------------------

    def sampler_state(self) -> dict[str, Any]:
        """The sampler's position after the micro-batches the loop has trained on (what a
        checkpoint saves as ``tokenbatch_sampler.json``)."""
        sampler = self.token_budget_sampler
        cursor = self._cursor
        if cursor is not None and cursor.steps.epoch == sampler.epoch:
            # DataLoader workers and Accelerate read ahead of the loop; count what the loop took.
            return sampler.state_dict(consumed_batches=cursor.position - cursor.start)
        return sampler.state_dict()

    def _restore_sampler(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, SAMPLER_STATE_NAME)
        if not os.path.isfile(path):
            raise InvalidValueError(
                f"{checkpoint} holds no {SAMPLER_STATE_NAME}: it was not saved by a token-budget "
                "trainer, so the position in the epoch is unknown"
            )
        with open(path) as file:
            state = json.load(file)
        sampler = self.token_budget_sampler
        sampler.load_state_dict(state)
        trainer_state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
        epoch = sampler.epoch
        if sampler.start_step >= len(sampler):  # saved at the end of an epoch
            epoch += 1
            sampler.set_epoch(epoch)
        self._resume = (trainer_state.global_step, epoch)


class TokenBudgetTrainer(TokenBudgetTrainerMixin, Trainer):
    """``transformers.Trainer`` on token-budget micro-batches; see
    :class:`TokenBudgetTrainerMixin` for the arguments it adds."""


def _is_hf_dataset(dataset: object) -> bool:
    try:
        import datasets
    except ImportError:  # pragma: no cover - the hf extra installs it
        return False
    return isinstance(dataset, datasets.Dataset)


def _check_lengths(sampler: TokenBudgetBatchSampler, dataset: Any) -> None:
    """Refuse a sampler planned for other lengths than the training set's (checked
    exactly, from the Arrow offsets, for a ``datasets.Dataset`` with ``input_ids``)."""
    if dataset is None:
        return
    if len(dataset) != len(sampler.lengths):
        raise InvalidValueError(
            f"the sampler has {len(sampler.lengths)} sequences but the training set has "
            f"{len(dataset)}; build the sampler from the training set the Trainer uses"
        )
    if not (_is_hf_dataset(dataset) and "input_ids" in dataset.column_names):
        return
    import pyarrow.compute as pc

    column = dataset.with_format("arrow")[:]["input_ids"]
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    differ = np.flatnonzero(lengths != sampler.lengths)
    if len(differ):
        i = int(differ[0])
        raise InvalidValueError(
            f"sequence {i} of the training set has {int(lengths[i])} tokens, the sampler was "
            f"given {int(sampler.lengths[i])} ({len(differ)} sequences differ); build the "
            "sampler from the training set the Trainer uses (pass a function of it as "
            "batch_sampler when the Trainer tokenizes or truncates)"
        )
