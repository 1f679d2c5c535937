"""TokenBudgetTrainer.evaluate under torchrun: ``torchrun --nproc_per_node=2 hf_evaluate.py OUT``.

Every rank evaluates the float64 tiny Llama on the evaluation corpus of ``evaluation.py``
through ``Trainer.evaluate()`` with an ``eval_batch_sampler``, and logs the metrics and
every document's loss it reduced (``trainer`` log).
"""

from __future__ import annotations

import sys
from pathlib import Path

from evaluation import EVAL_MAX_TOKENS, corpus, log_result
from run_support import (
    MAX_TOKENS,
    Log,
    documents,
    exit_when_every_rank_is_done,
    lengths,
    tiny_llama,
)
from transformers import TrainingArguments

from tokenbatch.integrations.transformers import TokenBudgetTrainer
from tokenbatch.torch import EvaluationBatchSampler, TokenBudgetBatchSampler


def main() -> None:
    out = Path(sys.argv[1])
    args = TrainingArguments(
        str(out / "trainer"), use_cpu=True, report_to=[], disable_tqdm=True, seed=0
    )
    # Built after the TrainingArguments, which start the process group.
    trainer = TokenBudgetTrainer(
        model=tiny_llama().double(),
        args=args,
        train_dataset=documents(),
        eval_dataset=corpus(),
        batch_sampler=TokenBudgetBatchSampler(lengths(), MAX_TOKENS, seed=1),
        eval_batch_sampler=lambda dataset: EvaluationBatchSampler(
            [len(item["input_ids"]) for item in dataset], EVAL_MAX_TOKENS
        ),
    )
    metrics = trainer.evaluate()
    result = trainer.last_evaluation
    assert result is not None
    log_result(Log(out, "trainer"), result, metrics=metrics)


if __name__ == "__main__":
    main()
    exit_when_every_rank_is_done()
