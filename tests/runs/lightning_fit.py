"""Lightning DDP under torchrun: ``torchrun --nproc_per_node=2 lightning_fit.py OUT``.

``Trainer(strategy="ddp", accelerator="cpu", devices=2)`` with a TokenBudgetCallback, 2
epochs of optimizer steps of 2 micro-batches, every micro-batch logged:
``refused`` (the error of a Trainer that would replace the sampler); ``uninterrupted``;
``stopped`` (a DataLoader worker, stopped after the checkpoint of optimizer step
``STOP``, in the second epoch) and ``resumed`` (a new Trainer fitting from that
checkpoint).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from run_support import (
    MAX_TOKENS,
    Log,
    documents,
    exit_when_every_rank_is_done,
    lengths,
    start_workers_from_a_fork_server,
    step_normalized_loss,
    tiny_llama,
)
from torch.utils.data import DataLoader

from tokenbatch.errors import InvalidValueError
from tokenbatch.integrations.lightning import TokenBudgetCallback
from tokenbatch.torch import PackedCollator, TokenBudgetBatchSampler

STOP = 28  # optimizer steps (19 per epoch)


class TinyLlama(pl.LightningModule):
    def __init__(self, budget: TokenBudgetCallback, log: Log, workers: int) -> None:
        super().__init__()
        self.model = tiny_llama()
        self.budget = budget
        self.records = log
        self.workers = workers

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            documents(),
            batch_sampler=self.budget.sampler,
            collate_fn=PackedCollator(),
            num_workers=self.workers,
        )

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        # The summed token loss over the label tokens of the step on all ranks, times the
        # ranks; the loss scale also undoes Lightning's division by accumulate_grad_batches.
        n = self.budget.num_items_in_batch(batch_idx)
        loss = step_normalized_loss(self.model, batch, n, 1)
        self.records.micro_batch(self.current_epoch, self.budget.steps, batch_idx, batch, loss)
        return loss * self.budget.loss_scale

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


class StopAfterStep(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def fit(
    out: Path,
    name: str,
    *,
    workers: int = 0,
    stop: bool = False,
    resume: bool = False,
    distributed_sampler: bool = False,
) -> None:
    budget = TokenBudgetCallback(lambda: TokenBudgetBatchSampler(lengths(), MAX_TOKENS, seed=1))
    callbacks: list[pl.Callback] = [budget]
    if stop:
        save = pl.callbacks.ModelCheckpoint(out / "ckpt", every_n_train_steps=STOP, save_top_k=-1)
        callbacks += [StopAfterStep(STOP), save]
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        use_distributed_sampler=distributed_sampler,
        max_epochs=2,
        accumulate_grad_batches=2,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=stop,
    )
    pl.seed_everything(0)
    module = TinyLlama(budget, Log(out, name), workers)
    checkpoint = str(out / "ckpt" / f"epoch=1-step={STOP}.ckpt") if resume else None
    trainer.fit(module, ckpt_path=checkpoint)


def main() -> None:
    start_workers_from_a_fork_server()
    out = Path(sys.argv[1])
    try:  # Lightning would replace the sampler: it refuses before anything runs
        fit(out, "refused", distributed_sampler=True)
    except (InvalidValueError, TypeError) as error:
        Log(out, "refused").write(error=str(error))
    fit(out, "uninterrupted")
    fit(out, "stopped", workers=1, stop=True)
    fit(out, "resumed", workers=1, resume=True)


if __name__ == "__main__":
    main()
    exit_when_every_rank_is_done()
