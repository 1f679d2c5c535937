"""TRL's ``SFTTrainer`` on token-budget micro-batches (the ``trl`` extra).

:class:`TokenBudgetSFTTrainer` is :class:`~tokenbatch.integrations.transformers.TokenBudgetTrainer`
for supervised fine-tuning: TRL prepares the dataset (chat templates, tokenization, EOS),
and the sampler, built from the prepared dataset, packs it into token-budget micro-batches
collated padding-free by :class:`~tokenbatch.torch.PackedCollator`::

    trainer = TokenBudgetSFTTrainer(
        model=model,
        args=SFTConfig("out", max_length=None),
        train_dataset=dataset,  # text, or already tokenized
        processing_class=tokenizer,
        batch_sampler=lambda prepared: TokenBudgetBatchSampler(
            sequence_lengths(prepared), max_tokens=8192
        ),
    )

The collator is already padding-free, so leave ``padding_free`` and ``packing`` off (TRL
would pack or flatten a second time). The labels are every token after each sequence's
first; with prompt masking (a ``labels`` column with ``-100`` on prompts) give
``label_counts`` so that each step's loss is normalized by the tokens really trained on.
"""

from __future__ import annotations

from typing import Any

from trl.trainer.sft_trainer import SFTTrainer

from tokenbatch.errors import InvalidValueError
from tokenbatch.integrations.transformers import TokenBudgetTrainerMixin

__all__ = ["TokenBudgetSFTTrainer"]


class TokenBudgetSFTTrainer(TokenBudgetTrainerMixin, SFTTrainer):
    """``trl.SFTTrainer`` on token-budget micro-batches; see
    :class:`~tokenbatch.integrations.transformers.TokenBudgetTrainerMixin` for the
    arguments it adds.

    Raises:
        InvalidValueError: ``padding_free=True`` or ``packing=True`` in the config: the
            sampler packs and the collator flattens already.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("args", args[1] if len(args) > 1 else None)
        for option in ("padding_free", "packing"):
            if getattr(config, option, False):
                raise InvalidValueError(
                    f"{option}=True: the token-budget sampler packs the dataset and "
                    "PackedCollator collates it padding-free; leave SFTConfig's "
                    f"{option} off"
                )
        super().__init__(*args, **kwargs)
