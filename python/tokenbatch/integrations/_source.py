"""Where an integration gets its sampler: given, or built by a function when the trainer
can build it (once the processes exist, or once the data is prepared)."""

from __future__ import annotations

from typing import Any

from tokenbatch.errors import InvalidTypeError
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
