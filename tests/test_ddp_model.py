"""The example model keeps attention inside each document: a packed row computes exactly
what each document computes alone."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from script_module import load_script

from tokenbatch.torch import PackedCollator, PaddedCollator

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_ddp.py"


@pytest.fixture(scope="module")
def train_ddp() -> ModuleType:
    return load_script(EXAMPLE, "train_ddp_example")


@pytest.fixture(scope="module")
def documents() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"input_ids": rng.integers(0, 50, size=n)} for n in (5, 9, 1, 3, 7)]


def model_for(train_ddp: ModuleType, kernel: str = "mask") -> torch.nn.Module:
    torch.manual_seed(0)
    model: torch.nn.Module = train_ddp.TinyCausalLM(50, 32, 2, 4, 64, kernel)
    return model.eval()


@pytest.mark.parametrize("kernel", ["mask", "loop"])
def test_packed_logits_equal_each_document_alone(
    train_ddp: ModuleType, documents: list[dict[str, np.ndarray]], kernel: str
) -> None:
    model = model_for(train_ddp, kernel)
    packed = PackedCollator()(documents)
    with torch.no_grad():
        logits = model(packed)[0]
        cu = packed["cu_seqlens"].tolist()
        for i, document in enumerate(documents):
            alone = model_for(train_ddp, "mask")(PackedCollator()([document]))[0]
            torch.testing.assert_close(logits[cu[i] : cu[i + 1]], alone, rtol=1e-5, atol=1e-5)


def test_without_the_document_mask_logits_leak(
    train_ddp: ModuleType, documents: list[dict[str, np.ndarray]]
) -> None:
    # Control: a plain causal mask over the row lets later documents see earlier ones, and
    # the comparison above would catch it.
    model = model_for(train_ddp)
    packed = PackedCollator()(documents)
    causal_only = {
        "input_ids": packed["input_ids"],
        "position_ids": packed["position_ids"],
        "attention_mask": torch.ones_like(packed["input_ids"]),
    }
    with torch.no_grad():
        leaked = model(causal_only)[0]
        cu = packed["cu_seqlens"].tolist()
        alone = model(PackedCollator()([documents[1]]))[0]
    assert not torch.allclose(leaked[cu[1] : cu[2]], alone, atol=1e-3)


def test_padded_logits_equal_each_document_alone(
    train_ddp: ModuleType, documents: list[dict[str, np.ndarray]]
) -> None:
    model = model_for(train_ddp)
    padded = PaddedCollator()(documents)
    with torch.no_grad():
        logits = model(padded)
        for row, document in enumerate(documents):
            n = len(document["input_ids"])
            alone = model(PackedCollator()([document]))[0]
            torch.testing.assert_close(logits[row, :n], alone, rtol=1e-5, atol=1e-5)


def test_boundary_tokens_do_not_enter_the_loss(
    train_ddp: ModuleType, documents: list[dict[str, np.ndarray]]
) -> None:
    # The summed loss of a packed row is the sum of each document's own loss.
    model = model_for(train_ddp)

    def loss_sum(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch)
        return torch.nn.functional.cross_entropy(
            logits[0, :-1], batch["labels"][0, 1:], ignore_index=-100, reduction="sum"
        )

    with torch.no_grad():
        together = loss_sum(PackedCollator()(documents))
        separate = sum(loss_sum(PackedCollator()([d])) for d in documents)
    torch.testing.assert_close(together, separate, rtol=1e-5, atol=1e-4)
