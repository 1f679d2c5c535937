"""TokenBudgetSFTTrainer under torchrun: ``torchrun --nproc_per_node=2 trl_sft.py OUT``.

TRL tokenizes a text dataset (appending EOS, so every document grows by one token) and
the sampler is built from the tokenized dataset TRL trains on; 2 epochs of optimizer
steps of 2 micro-batches, every micro-batch logged (``sft.rank<r>.jsonl``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import datasets
from run_support import (
    CPU_TRAINING_ARGS,
    MAX_TOKENS,
    Log,
    RecordingMixin,
    exit_when_every_rank_is_done,
    texts,
    tiny_llama,
    tiny_tokenizer,
)
from trl import SFTConfig

from tokenbatch.integrations.trl import TokenBudgetSFTTrainer
from tokenbatch.torch import TokenBudgetBatchSampler, sequence_lengths


class RecordingSFTTrainer(RecordingMixin, TokenBudgetSFTTrainer):
    pass


def main() -> None:
    out = Path(sys.argv[1])
    config = SFTConfig(
        str(out / "sft"),
        **CPU_TRAINING_ARGS,
        max_length=None,
        num_train_epochs=2,
        gradient_accumulation_steps=2,
        learning_rate=3e-3,
        save_strategy="no",
        logging_steps=1000,
        seed=0,
    )
    trainer = RecordingSFTTrainer(
        model=tiny_llama(),
        args=config,
        train_dataset=datasets.Dataset.from_list(texts()),
        processing_class=tiny_tokenizer(),
        batch_sampler=lambda prepared: TokenBudgetBatchSampler(
            sequence_lengths(prepared), MAX_TOKENS, seed=1
        ),
    )
    trainer.records = Log(out, "sft")
    trainer.train()


if __name__ == "__main__":
    main()
    exit_when_every_rank_is_done()
