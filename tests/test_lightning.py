"""The Lightning callback in one process: it trains and scales the loss, and refuses a
sampler for other ranks (the 2-process runs are in test_trainers.py)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from run_support import MAX_TOKENS, documents, lengths, mixture_sampler, tiny_llama
from torch.utils.data import DataLoader

from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.integrations._packed_rows import (
    DOCUMENTS_KEPT_APART_FROM,
    release,
    warn_if_documents_mix,
)
from tokenbatch.integrations.lightning import TokenBudgetCallback
from tokenbatch.torch import PackedCollator, TokenBudgetBatchSampler

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    # Lightning's notes about a CPU run's worker count and logging interval, and its use
    # of a torch pytree class that torch deprecated.
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.* is deprecated:FutureWarning"),
    # The tiny Llama's sdpa attention on the oldest stack (torch 2.3): asserted below.
    pytest.mark.filterwarnings("ignore:.*lets the documents of a packed row:UserWarning"),
]


def sampler(**options: Any) -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler(lengths(), MAX_TOKENS, seed=1, **options)


class Module(pl.LightningModule):
    def __init__(self, budget: TokenBudgetCallback) -> None:
        super().__init__()
        self.model = tiny_llama()
        self.budget = budget

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            documents(), batch_sampler=self.budget.sampler, collate_fn=PackedCollator()
        )

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        n = self.budget.num_items_in_batch(batch_idx)
        keys = ("input_ids", "labels", "position_ids")
        loss = self.model(**{k: batch[k] for k in keys}, num_items_in_batch=n).loss
        return loss * self.budget.loss_scale

    def configure_optimizers(self) -> Any:
        import torch

        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def lightning_trainer(budget: TokenBudgetCallback, tmp_path: Path, **length: Any) -> pl.Trainer:
    """A CPU Trainer of 3 steps of 2 micro-batches, or of the run ``length`` gives."""
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        **(length or {"max_steps": 3, "accumulate_grad_batches": 2}),
        callbacks=[budget],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )


def test_lightning_callback_trains_and_scales_the_loss(tmp_path: Path) -> None:
    budget = TokenBudgetCallback(sampler)
    with pytest.raises(InvalidValueError, match="train_dataloader"):
        _ = budget.sampler  # not built before fit
    trainer = lightning_trainer(budget, tmp_path)
    trainer.fit(Module(budget))
    assert trainer.global_step == 3
    assert budget.loss_scale == 2  # 1 rank x 2 micro-batches per step
    state = budget.state_dict()["sampler"]
    assert (state["epoch"], state["step"]) == (0, 6)


def test_lightning_callback_refuses_a_sampler_for_other_ranks(tmp_path: Path) -> None:
    budget = TokenBudgetCallback(sampler(num_replicas=2, rank=0))
    with pytest.raises(InvalidValueError, match="rank 0 of 2, but this is rank 0 of 1"):
        lightning_trainer(budget, tmp_path).fit(Module(budget))
    with pytest.raises(InvalidTypeError, match="batch_sampler"):
        TokenBudgetCallback(3)  # type: ignore[arg-type]


class ManualModule(Module):
    """Steps the optimizer where the plan's steps end (a schedule or mixture sampler)."""

    def __init__(self, budget: TokenBudgetCallback) -> None:
        super().__init__(budget)
        self.automatic_optimization = False
        self.optimizer_steps = 0

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        if self.budget.is_step_end(batch_idx):
            optimizer = self.optimizers()
            optimizer.step()  # type: ignore[union-attr]
            optimizer.zero_grad()  # type: ignore[union-attr]
            self.optimizer_steps += 1
        return loss


def test_lightning_callback_logs_the_tokens_of_every_source_of_a_mixture(tmp_path: Path) -> None:
    mixed = mixture_sampler()
    budget = TokenBudgetCallback(mixed)
    module = ManualModule(budget)
    trainer = lightning_trainer(budget, tmp_path, max_epochs=1)
    trainer.fit(module)  # the dataset is web's documents, then code's
    plan = mixed.mixture_plan()
    assert plan is not None
    assert module.optimizer_steps == len(plan) == len(budget.steps)
    epoch = plan.source_tokens.sum(axis=0)
    metrics = trainer.callback_metrics
    assert float(metrics["source_tokens/web_epoch"]) == epoch[0]
    assert float(metrics["source_tokens/code_epoch"]) == epoch[1]
    assert float(metrics["source_tokens/code_step"]) == plan.source_tokens[-1][1]


def test_lightning_refuses_a_schedule_under_automatic_optimization(tmp_path: Path) -> None:
    budget = TokenBudgetCallback(mixture_sampler())
    with pytest.raises(InvalidValueError, match="automatic_optimization = False"):
        lightning_trainer(budget, tmp_path, max_epochs=1).fit(Module(budget))


def test_lightning_warns_where_packed_documents_would_attend_to_each_other(
    tmp_path: Path,
) -> None:
    import torch

    assert release("2.15.0+cu132") == (2, 15)
    assert release("nightly") is None
    model = tiny_llama()
    with pytest.warns(UserWarning, match="sdpa attention, which with torch 2.5.1"):
        warn_if_documents_mix(model, torch_version="2.5.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for version in ("2.6.0", "2.15.0+cu132"):
            warn_if_documents_mix(model, torch_version=version)
        warn_if_documents_mix(torch.nn.Linear(2, 2), torch_version="2.3.0")  # no HF model
    # The callback checks the module it trains, with the installed torch.
    budget = TokenBudgetCallback(sampler)
    installed = release(torch.__version__)
    assert installed is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lightning_trainer(budget, tmp_path).fit(Module(budget))
    mixing = [w for w in caught if "documents of a packed row" in str(w.message)]
    assert len(mixing) == (1 if installed < DOCUMENTS_KEPT_APART_FROM else 0)
