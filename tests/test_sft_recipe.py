"""The recipe of docs/datasets.md: ``pack_dataset``, then TRL's ``SFTTrainer`` with
``padding_free=True, max_length=None``. A packed row trains exactly as its sequences
alone would, and the trainer runs."""

from __future__ import annotations

from typing import Any

import datasets
import numpy as np
import pytest
import torch
import trl
from packaging.version import Version
from run_support import VOCAB, tiny_llama, tiny_tokenizer
from trl import SFTConfig, SFTTrainer

from tokenbatch.hf import pack_dataset

pytestmark = [
    # From TRL 1.16 on the padding-free collator hands the rows' sequence boundaries to
    # the model (cu_seq_lens); before, only a flash-attention model finds them, from the
    # positions, and the recipe needs one (docs/datasets.md).
    pytest.mark.skipif(
        Version(trl.__version__) < Version("1.16"), reason="the recipe needs TRL 1.16 on a CPU"
    ),
    pytest.mark.usefixtures("one_torch_thread"),
    # TRL's SFTConfig still sets the name transformers 5 deprecated.
    pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning"),
]


def sft_config(**options: Any) -> SFTConfig:
    return SFTConfig(
        "sft-out",
        padding_free=True,
        per_device_train_batch_size=2,
        max_steps=3,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        **options,
    )


@pytest.fixture
def trainer(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> SFTTrainer:
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    rows = [rng.integers(3, VOCAB, int(n)).tolist() for n in rng.integers(2, 60, 40)]
    packed = pack_dataset(datasets.Dataset.from_dict({"input_ids": rows}), max_tokens=128)
    return SFTTrainer(
        model=tiny_llama(),
        args=sft_config(max_length=None),
        train_dataset=packed,
        processing_class=tiny_tokenizer(),
    )


def test_the_documented_config_needs_max_length_none(trainer: SFTTrainer) -> None:
    # What the guide said before: TRL 1.16 refuses it at construction.
    with pytest.raises(ValueError, match="max_length"):
        SFTTrainer(
            model=trainer.model,
            args=sft_config(),  # max_length=1024, TRL's default
            train_dataset=trainer.train_dataset,
            processing_class=trainer.processing_class,
        )


def test_packed_rows_train_as_their_sequences_alone(trainer: SFTTrainer) -> None:
    model = trainer.model.eval()
    rows = [trainer.train_dataset[i] for i in range(2)]
    batch = trainer.data_collator(rows)
    sequences = [
        ids for row in rows for ids in torch.tensor(row["input_ids"]).split(row["seq_lengths"])
    ]
    assert len(sequences) > 2, "the rows hold several sequences"
    keys = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k")
    with torch.no_grad():
        logits = model(**{k: batch[k] for k in keys}, max_length_q=batch["max_length_q"],
                       max_length_k=batch["max_length_k"]).logits[0]  # fmt: skip
        alone = [model(input_ids=s[None]).logits[0] for s in sequences]
        torch.testing.assert_close(logits, torch.cat(alone), rtol=1e-5, atol=1e-5)
        # The loss: every token after each sequence's first, averaged over all of them.
        losses = [
            torch.nn.functional.cross_entropy(out[:-1], s[1:], reduction="sum")
            for out, s in zip(alone, sequences, strict=True)
        ]
        expected = torch.stack(losses).sum() / sum(len(s) - 1 for s in sequences)
        loss = trainer.compute_loss(model, dict(batch))
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_the_trainer_trains(trainer: SFTTrainer) -> None:
    result = trainer.train()
    assert result.global_step == 3
    assert np.isfinite(result.training_loss)
