"""Where an integration gets its sampler: given, or built by a function when the trainer
can build it (once the processes exist, or once the data is prepared)."""

from __future__ import annotations

from typing import Any

from tokenbatch.errors import InvalidTypeError
from tokenbatch.torch.evaluation import EvaluationBatchSampler
from tokenbatch.torch.sampler import TokenBudgetBatchSampler


class SamplerFrom:
    """A :class:`TokenBudgetBatchSampler`, or the function that builds it on first use.

    ``takes`` says what the function is called with, for error messages.
    """

    def __init__(self, source: Any, takes: str) -> None:
        if not isinstance(source, TokenBudgetBatchSampler) and not callable(source):
            raise InvalidTypeError(
                "batch_sampler must be a TokenBudgetBatchSampler or a function (called with "
                f"{takes}) that returns one, got {type(source).__name__}"
            )
        self._source = source
        self.sampler: TokenBudgetBatchSampler | None = (
            source if isinstance(source, TokenBudgetBatchSampler) else None
        )

    def build(self, *args: Any) -> TokenBudgetBatchSampler:
        """The sampler, calling the function with ``args`` the first time."""
        if self.sampler is None:
            sampler = self._source(*args)
            if not isinstance(sampler, TokenBudgetBatchSampler):
                raise InvalidTypeError(
                    "the batch_sampler function must return a TokenBudgetBatchSampler, got "
                    f"{type(sampler).__name__}"
                )
            self.sampler = sampler
        return self.sampler


def check_evaluation_source(source: Any, takes: str) -> None:
    """Refuse an ``eval_batch_sampler`` that is neither ``None``, an
    :class:`EvaluationBatchSampler` nor a function (called with ``takes``)."""
    if not (source is None or isinstance(source, EvaluationBatchSampler) or callable(source)):
        raise InvalidTypeError(
            "eval_batch_sampler must be an EvaluationBatchSampler or a function (called with "
            f"{takes}) that returns one, got {type(source).__name__}"
        )


def build_evaluation_sampler(source: Any, *args: Any) -> EvaluationBatchSampler:
    """The evaluation sampler ``source`` is, or the one its function returns for ``args``."""
    if isinstance(source, EvaluationBatchSampler):
        return source
    sampler = source(*args)
    if not isinstance(sampler, EvaluationBatchSampler):
        raise InvalidTypeError(
            "the eval_batch_sampler function must return an EvaluationBatchSampler, got "
            f"{type(sampler).__name__}"
        )
    return sampler
