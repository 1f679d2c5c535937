"""Evaluation for the token-budget Hugging Face Trainer: every document of the evaluation
set exactly once over the ranks, and the corpus token-mean loss reduced exactly.

:class:`EvaluationTrainerMixin` overrides two public, documented methods of
``transformers.Trainer``: ``get_eval_dataloader`` (a loader over an
:class:`~tokenbatch.torch.EvaluationBatchSampler`, not sharded again by Accelerate) and
``evaluation_loop`` (per-document losses of each packed row, reduced over the ranks).
``Trainer.evaluate`` itself is unchanged: it still times the pass, logs the metrics and
calls the callbacks' ``on_evaluate``, during training as from a direct call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader
from transformers.trainer_utils import EvalLoopOutput

from tokenbatch.errors import InvalidValueError
from tokenbatch.integrations._packed_rows import without_cache
from tokenbatch.integrations._source import build_evaluation_sampler, check_evaluation_source
from tokenbatch.torch.collate import PackedCollator
from tokenbatch.torch.document_loss import DocumentLosses, EvaluationResult
from tokenbatch.torch.evaluation import (
    EvaluationBatchSampler,
    EvaluationCollator,
    EvaluationDataset,
    model_inputs,
)

if TYPE_CHECKING:
    from transformers import Trainer

    _TrainerBase = Trainer
else:
    _TrainerBase = object

EvalSamplerSource = EvaluationBatchSampler | Callable[[Any], EvaluationBatchSampler]


class EvaluationTrainerMixin(_TrainerBase):
    """Token-budget evaluation for a ``transformers.Trainer`` subclass.

    Args:
        eval_batch_sampler: the :class:`~tokenbatch.torch.EvaluationBatchSampler` of the
            evaluation set, or a function that builds it from an evaluation set (called
            at every evaluation, with the set being evaluated: one of several named
            ``eval_dataset`` sets, say). ``None`` leaves evaluation to the Trainer.
        *args, **kwargs: the Trainer's own arguments.

    With a sampler, ``evaluate()`` reports ``{prefix}_loss``, the token-mean loss over the
    label tokens of the whole evaluation set, and ``{prefix}_tokens``;
    :attr:`last_evaluation` holds the full result, every document's own loss included.
    Rows are collated by the Trainer's ``data_collator`` when it is a
    :class:`~tokenbatch.torch.PackedCollator`, else by a default one.
    """

    def __init__(
        self, *args: Any, eval_batch_sampler: EvalSamplerSource | None = None, **kwargs: Any
    ) -> None:
        check_evaluation_source(eval_batch_sampler, "the evaluation set")
        super().__init__(*args, **kwargs)
        self._token_budget_eval_source = eval_batch_sampler
        #: The result of the last token-budget evaluation (``None`` before one).
        self.last_evaluation: EvaluationResult | None = None

    def eval_batch_sampler_for(self, dataset: Any) -> EvaluationBatchSampler:
        """The evaluation sampler of ``dataset``, checked against its length."""
        source = self._token_budget_eval_source
        if source is None:
            raise InvalidValueError("this Trainer was given no eval_batch_sampler")
        sampler = build_evaluation_sampler(source, dataset)
        if len(dataset) != sampler.n_documents:
            raise InvalidValueError(
                f"the evaluation sampler has {sampler.n_documents} documents but the "
                f"evaluation set has {len(dataset)}; build it from the set being evaluated "
                "(pass a function of the set as eval_batch_sampler for several sets)"
            )
        return sampler

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader[Any]:
        """A loader over the evaluation sampler's micro-batches (each rank its own), or the
        Trainer's loader without an ``eval_batch_sampler``."""
        if self._token_budget_eval_source is None:
            return super().get_eval_dataloader(eval_dataset)
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(dataset, str):
            if not isinstance(self.eval_dataset, Mapping):
                raise InvalidValueError(f"no evaluation set named {dataset!r}")
            dataset = self.eval_dataset[dataset]
        if dataset is None:
            raise InvalidValueError("evaluation needs an eval_dataset")
        collator = self.data_collator
        row = collator if isinstance(collator, PackedCollator) else None
        args = self.args
        return DataLoader(
            EvaluationDataset(dataset),
            batch_sampler=self.eval_batch_sampler_for(dataset),
            collate_fn=EvaluationCollator(row),
            num_workers=args.dataloader_num_workers,
            pin_memory=args.dataloader_pin_memory,
        )

    def evaluation_loop(
        self,
        dataloader: DataLoader[Any],
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """Per-document losses of every micro-batch, reduced over the ranks, for a loader
        of :meth:`get_eval_dataloader`; the Trainer's loop for any other loader."""
        sampler = dataloader.batch_sampler
        if not isinstance(sampler, EvaluationBatchSampler):
            return super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
        if self.compute_metrics is not None:
            raise InvalidValueError(
                "compute_metrics needs the predictions of every document, which a token-budget "
                "evaluation does not gather: it reports the exact losses (last_evaluation)"
            )
        # The outermost model (DDP, FSDP...), which every rank runs the same number of
        # times, padding batches included, so that its collectives always meet.
        model = self.model_wrapped
        was_training = model.training
        model.eval()
        losses = DocumentLosses(sampler.n_documents)
        device = self.args.device
        with torch.no_grad():
            for batch in dataloader:
                inputs = {
                    key: value.to(device) if isinstance(value, torch.Tensor) else value
                    for key, value in model_inputs(batch).items()
                    if key != "labels"
                }
                outputs = model(**without_cache(self.model, inputs))
                logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs[0]
                losses.add_batch(logits, batch)
        model.train(was_training)
        result = losses.reduce()
        self.last_evaluation = result
        return EvalLoopOutput(
            predictions=None,  # type: ignore[arg-type]
            label_ids=None,
            metrics=result.metrics(metric_key_prefix),
            num_samples=sampler.n_documents,
        )
