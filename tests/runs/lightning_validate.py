"""Lightning validation under torchrun: ``torchrun --nproc_per_node=2 lightning_validate.py OUT``.

``Trainer(strategy="ddp", accelerator="cpu", devices=2).validate`` of the float64 tiny
Llama on the evaluation corpus of ``evaluation.py``, with a TokenBudgetCallback's
``eval_batch_sampler``; every rank logs the reduced result (``lightning`` log).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from evaluation import EVAL_MAX_TOKENS, corpus, log_result
from run_support import MAX_TOKENS, Log, exit_when_every_rank_is_done, lengths, tiny_llama
from torch.utils.data import DataLoader

from tokenbatch.integrations.lightning import TokenBudgetCallback
from tokenbatch.torch import (
    EvaluationBatchSampler,
    EvaluationCollator,
    EvaluationDataset,
    TokenBudgetBatchSampler,
    model_inputs,
)


class TinyLlama(pl.LightningModule):
    def __init__(self, budget: TokenBudgetCallback) -> None:
        super().__init__()
        self.model = tiny_llama().double()
        self.budget = budget

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            EvaluationDataset(corpus()),
            batch_sampler=self.budget.eval_sampler,
            collate_fn=EvaluationCollator(),
        )

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        logits = self.model(**model_inputs(batch), use_cache=False).logits
        self.budget.add_eval_batch(logits, batch)


def main() -> None:
    out = Path(sys.argv[1])
    budget = TokenBudgetCallback(
        lambda: TokenBudgetBatchSampler(lengths(), MAX_TOKENS, seed=1),
        eval_batch_sampler=lambda: EvaluationBatchSampler(
            [len(item["input_ids"]) for item in corpus()], EVAL_MAX_TOKENS
        ),
    )
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        use_distributed_sampler=False,
        callbacks=[budget],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    (metrics,) = trainer.validate(TinyLlama(budget))
    result = budget.last_evaluation
    assert result is not None
    log_result(Log(out, "lightning"), result, metrics={k: float(v) for k, v in metrics.items()})


if __name__ == "__main__":
    main()
    exit_when_every_rank_is_done()
