"""The Hugging Face, TRL and Accelerate integrations in one process: what they refuse,
and a Trainer that stops and resumes (Lightning's are in test_lightning.py, the 2-process
runs in test_trainers.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import pytest
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import DataLoader
from transformers import TrainingArguments

from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.integrations.accelerate import prepare_data_loader
from tokenbatch.integrations.transformers import SAMPLER_STATE_NAME, TokenBudgetTrainer
from tokenbatch.mixture import Mixture
from tokenbatch.schedule import LinearRamp, Piecewise
from tokenbatch.torch import TokenBudgetBatchSampler

sys.path.insert(0, str(Path(__file__).resolve().parent / "runs"))
from run_support import MAX_TOKENS, documents, lengths, tiny_llama

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    # TRL's SFTConfig still sets the name transformers 5 deprecated.
    pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning"),
]


def args(tmp_path: Path, **options: Any) -> TrainingArguments:
    defaults: dict[str, Any] = {
        "use_cpu": True,
        "report_to": [],
        "disable_tqdm": True,
        "save_strategy": "no",
        "learning_rate": 3e-3,
    }
    return TrainingArguments(str(tmp_path / "out"), **{**defaults, **options})


def sampler(**options: Any) -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler(lengths(), MAX_TOKENS, seed=1, **options)


# -- Accelerate --------------------------------------------------------------------------


def test_accelerate_passes_the_plan_through() -> None:
    accelerator = Accelerator(cpu=True)
    batches = sampler()
    loader = DataLoader(documents(), batch_sampler=batches, collate_fn=list)
    prepared = prepare_data_loader(accelerator, loader)
    assert [len(batch) for batch in prepared] == [len(b) for b in batches]


def test_accelerate_refuses_what_it_cannot_pass_through() -> None:
    accelerator = Accelerator(cpu=True)
    plain = DataLoader(documents(), batch_size=4)
    with pytest.raises(InvalidTypeError, match="TokenBudgetBatchSampler"):
        prepare_data_loader(accelerator, plain)
    two_ranks = DataLoader(documents(), batch_sampler=sampler(num_replicas=2, rank=1))
    with pytest.raises(InvalidValueError, match="rank 1 of 2, but this is process 0 of 1"):
        prepare_data_loader(accelerator, two_ranks)
    dispatching = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True)
    )
    with pytest.raises(InvalidValueError, match="dispatch_batches"):
        prepare_data_loader(dispatching, DataLoader(documents(), batch_sampler=sampler()))


def test_accelerate_leaves_a_restored_position_alone() -> None:
    # Accelerate's loader sets its iteration count as the epoch of what it holds; the
    # prepared loader must not pass that to the sampler (it would restart epoch 0).
    uninterrupted = sampler()
    uninterrupted.set_epoch(1)
    expected = [list(batch) for batch in uninterrupted][3:]
    resumed = sampler()
    resumed.load_state_dict({**uninterrupted.state_dict(), "step": 3})
    loader = DataLoader(documents(), batch_sampler=resumed, collate_fn=list)
    prepared = prepare_data_loader(Accelerator(cpu=True), loader)
    docs = [[doc["input_ids"][:2] for doc in batch] for batch in prepared]
    assert docs == [[documents()[i]["input_ids"][:2] for i in batch] for batch in expected]


def test_a_sampler_sharded_again_by_accelerate_refuses_at_its_first_batch() -> None:
    # Accelerate's documented prepare_data_loader for 2 processes, in one: the sampler
    # finds the loader that shards it among those Accelerate is iterating.
    from accelerate.data_loader import prepare_data_loader as shard

    batches = sampler(num_replicas=2, rank=0)
    loader = shard(
        DataLoader(documents(), batch_sampler=batches, collate_fn=list),
        num_processes=2,
        even_batches=False,  # else Accelerate 1.12 refuses the sampler itself (1.16 shards it)
    )
    with pytest.raises(InvalidValueError, match=r"over 2 processes.*prepare_data_loader"):
        next(iter(loader))
    unsharded = shard(
        DataLoader(documents(), batch_sampler=batches, collate_fn=list), num_processes=1
    )
    assert len(list(unsharded)) == len(batches)


# -- Hugging Face Trainer ----------------------------------------------------------------


def test_trainer_refuses_settings_it_cannot_honour(tmp_path: Path) -> None:
    model, data = tiny_llama(), documents()
    with pytest.raises(InvalidTypeError, match="batch_sampler"):
        TokenBudgetTrainer(model=model, args=args(tmp_path), train_dataset=data, batch_sampler=3)
    with pytest.raises(InvalidValueError, match="average_tokens_across_devices"):
        TokenBudgetTrainer(
            model=model,
            args=args(tmp_path, average_tokens_across_devices=False),
            train_dataset=data,
            batch_sampler=sampler(),
        )
    ramp = LinearRamp(1024, 4096, 30_000, unit="tokens")
    trainer = TokenBudgetTrainer(
        model=model,
        args=args(tmp_path, gradient_accumulation_steps=2),
        train_dataset=data,
        batch_sampler=sampler(schedule=ramp),
    )
    with pytest.raises(InvalidValueError, match="the schedule decides"):
        trainer.train()


def test_trainer_refuses_a_sampler_of_other_lengths(tmp_path: Path) -> None:
    data = datasets.Dataset.from_list(documents())
    other = lengths().copy()
    other[7] += 1
    trainer = TokenBudgetTrainer(
        model=tiny_llama(),
        args=args(tmp_path),
        train_dataset=data,
        batch_sampler=TokenBudgetBatchSampler(other, MAX_TOKENS),
    )
    with pytest.raises(InvalidValueError, match="sequence 7 of the training set"):
        trainer.train()
    wrong = TokenBudgetTrainer(
        model=tiny_llama(), args=args(tmp_path), train_dataset=data, batch_sampler=lambda d: 3
    )
    with pytest.raises(InvalidTypeError, match="must return a TokenBudgetBatchSampler"):
        wrong.train()


def test_trainer_stops_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    def trainer(**options: Any) -> TokenBudgetTrainer:
        return TokenBudgetTrainer(
            model=tiny_llama(),
            args=args(tmp_path, gradient_accumulation_steps=3, **options),
            train_dataset=datasets.Dataset.from_list(documents()),
            batch_sampler=lambda dataset: sampler(),  # built from the training set
        )

    first = trainer(max_steps=5, save_strategy="steps", save_steps=5)
    assert first.micro_batches_per_step == 3
    assert first.args.gradient_accumulation_steps == 1  # the loop sees whole steps
    first.train()
    state = json.loads((tmp_path / "out" / "checkpoint-5" / SAMPLER_STATE_NAME).read_text())
    assert (state["epoch"], state["step"]) == (0, 15)
    resumed = trainer(num_train_epochs=1)
    result = resumed.train(resume_from_checkpoint=True)
    assert result.global_step == -(-len(sampler()) // 3)  # the whole epoch, no more
    (tmp_path / "out" / "checkpoint-5" / SAMPLER_STATE_NAME).unlink()
    with pytest.raises(InvalidValueError, match=SAMPLER_STATE_NAME):
        trainer().train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-5"))


def test_trainer_logs_the_tokens_of_every_source_of_a_mixture(tmp_path: Path) -> None:
    # Two Hugging Face datasets as the sources: the sampler's lengths per source, the
    # Trainer's dataset their concatenation in the same order.
    half = len(documents()) // 2
    web = datasets.Dataset.from_list(documents()[:half])
    code = datasets.Dataset.from_list(documents()[half:])
    mixed = TokenBudgetBatchSampler(
        {
            name: [len(ids) for ids in ds["input_ids"]]
            for name, ds in [("web", web), ("code", code)]
        },
        MAX_TOKENS,
        seed=1,
        mixture=Mixture({"web": 0.75, "code": 0.25}, max_repetition=2),
        schedule=Piecewise([(0, 4 * MAX_TOKENS)]),
    )
    trainer = TokenBudgetTrainer(
        model=tiny_llama(),
        args=args(tmp_path, max_steps=6, logging_steps=2),
        train_dataset=datasets.concatenate_datasets([web, code]),
        batch_sampler=mixed,
    )
    trainer.train()
    plan = mixed.mixture_plan()
    assert plan is not None
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [2, 4, 6]
    for k, entry in enumerate(logged):
        expected = plan.source_tokens[2 * k : 2 * k + 2].sum(axis=0)
        assert [entry["source_tokens/web"], entry["source_tokens/code"]] == expected.tolist()
    # The summary of the run carries no counts of its own: none were left unlogged.
    assert "source_tokens/web" not in trainer.state.log_history[-1]


def test_trainer_loss_of_a_packed_row_is_that_of_its_documents_alone(tmp_path: Path) -> None:
    # With its cache on, a Hugging Face model lets the documents of a packed row attend to
    # each other under sdpa attention; the Trainer must run it with the cache off, also
    # where the model's config keeps it on (transformers 4.x's Trainer leaves it as it is,
    # 5.x's sets it from TrainingArguments.use_cache).
    import torch

    from tokenbatch.torch import PackedCollator

    model = tiny_llama().double()
    trainer = TokenBudgetTrainer(
        model=model, args=args(tmp_path), train_dataset=documents(), batch_sampler=sampler()
    )
    model.config.use_cache = True
    docs = documents()[:3]
    batch = PackedCollator()(docs)
    loss, outputs = trainer.compute_loss(model, batch, return_outputs=True)
    alone = [model(input_ids=torch.tensor([doc["input_ids"]])).logits[0] for doc in docs]
    torch.testing.assert_close(outputs.logits[0], torch.cat(alone), rtol=0, atol=1e-10)
    token_losses = [
        torch.nn.functional.cross_entropy(
            logits[:-1], torch.tensor(doc["input_ids"][1:]), reduction="sum"
        )
        for logits, doc in zip(alone, docs, strict=True)
    ]
    label_tokens = sum(len(doc["input_ids"]) - 1 for doc in docs)
    # The model's loss upcasts the logits to float32.
    expected = sum(token_losses) / label_tokens
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=0)


def test_sft_trainer_refuses_padding_free_and_packing(tmp_path: Path) -> None:
    from trl import SFTConfig

    from tokenbatch.integrations.trl import TokenBudgetSFTTrainer

    for option in ("padding_free", "packing"):
        config = SFTConfig(str(tmp_path), use_cpu=True, max_length=None, **{option: True})
        with pytest.raises(InvalidValueError, match=f"{option}=True"):
            TokenBudgetSFTTrainer(model=tiny_llama(), args=config, batch_sampler=sampler())


def test_importing_tokenbatch_imports_no_framework() -> None:
    code = (
        "import sys, tokenbatch, tokenbatch.integrations\n"
        "loaded = {'torch', 'transformers', 'accelerate', 'lightning', 'trl', 'torchdata'}\n"
        "print(sorted(loaded & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr
