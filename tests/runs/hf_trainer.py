"""TokenBudgetTrainer under torchrun: ``torchrun --nproc_per_node=2 hf_trainer.py OUT``.

Runs, one after the other in the same processes (each with a new model, sampler and
Trainer), and logs every micro-batch each rank trains on:

* ``uninterrupted``: 2 epochs, 2 micro-batches per optimizer step;
* ``stopped``: the same, with a DataLoader worker, stopped right after the checkpoint at
  optimizer step ``TRAINER_STOP["ga"]`` (in the second epoch); ``resumed``: a new Trainer resumes
  from that checkpoint;
* ``schedule_uninterrupted``, ``schedule_stopped``, ``schedule_resumed``: the same with a
  batch-size ramp deciding the optimizer steps (stopped at ``TRAINER_STOP["schedule"]``);
* ``mixture``: ``MIXTURE_STEPS`` steps of a mixture of two ``datasets.Dataset`` sources,
  trained on their concatenation; ``mixture_logs`` holds each rank's log history;
* ``extra_costs``: one epoch of a sampler that packs images besides tokens.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import datasets
from run_support import (
    CPU_TRAINING_ARGS,
    MAX_TOKENS,
    MIXTURE_LOGGING_STEPS,
    MIXTURE_SOURCES,
    MIXTURE_STEPS,
    SCHEDULE,
    TRAINER_STOP,
    Log,
    RecordingMixin,
    documents,
    exit_when_every_rank_is_done,
    extra_costs_sampler,
    lengths,
    load_checkpoints_on_the_cpu,
    mixture_sampler,
    start_workers_from_a_fork_server,
    tiny_llama,
)
from transformers import TrainerCallback, TrainingArguments

from tokenbatch.integrations.transformers import TokenBudgetTrainer
from tokenbatch.torch import TokenBudgetBatchSampler


class RecordingTrainer(RecordingMixin, TokenBudgetTrainer):
    pass


class StopAfterSaving(TrainerCallback):
    """Ends training after the checkpoint of step ``step``, as a crash would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


def run(
    out: Path,
    name: str,
    output_dir: str,
    *,
    schedule: bool,
    workers: int = 0,
    save_steps: int | None = None,
    stop: int | None = None,
    resume: str | None = None,
) -> None:
    args = TrainingArguments(
        output_dir,
        **CPU_TRAINING_ARGS,
        num_train_epochs=2,
        gradient_accumulation_steps=1 if schedule else 2,
        learning_rate=3e-3,
        lr_scheduler_type="linear",
        save_strategy="no" if save_steps is None else "steps",
        save_steps=save_steps or 500,
        logging_steps=1000,
        dataloader_num_workers=workers,
        seed=0,
    )
    # Built after the TrainingArguments, which start the process group.
    sampler = TokenBudgetBatchSampler(
        lengths(), MAX_TOKENS, seed=1, schedule=SCHEDULE if schedule else None
    )
    trainer = RecordingTrainer(
        model=tiny_llama(),
        args=args,
        train_dataset=documents(),
        batch_sampler=sampler,
        callbacks=[StopAfterSaving(stop)] if stop is not None else None,
    )
    trainer.records = Log(out, name)
    trainer.train(resume_from_checkpoint=resume)


def run_mixture(out: Path) -> None:
    args = TrainingArguments(
        str(out / "mixture"),
        **CPU_TRAINING_ARGS,
        max_steps=MIXTURE_STEPS,
        logging_steps=MIXTURE_LOGGING_STEPS,
        save_strategy="no",
        seed=0,
    )
    docs = documents()
    sources = [datasets.Dataset.from_list(docs[part]) for part in MIXTURE_SOURCES.values()]
    trainer = RecordingTrainer(
        model=tiny_llama(),
        args=args,
        train_dataset=datasets.concatenate_datasets(sources),
        batch_sampler=mixture_sampler(),
    )
    trainer.records = Log(out, "mixture")
    trainer.train()
    Log(out, "mixture_logs").write(history=trainer.state.log_history)


def run_extra_costs(out: Path) -> None:
    args = TrainingArguments(
        str(out / "extra_costs"),
        **CPU_TRAINING_ARGS,
        num_train_epochs=1,
        gradient_accumulation_steps=2,
        save_strategy="no",
        seed=0,
    )
    trainer = RecordingTrainer(
        model=tiny_llama(),
        args=args,
        train_dataset=documents(),
        batch_sampler=extra_costs_sampler(),
    )
    trainer.records = Log(out, "extra_costs")
    trainer.train()


def main() -> None:
    start_workers_from_a_fork_server()
    load_checkpoints_on_the_cpu()
    out = Path(sys.argv[1])
    for mode, prefix in (("ga", ""), ("schedule", "schedule_")):
        schedule = mode == "schedule"
        run(out, f"{prefix}uninterrupted", str(out / f"{prefix}a"), schedule=schedule)
        stopped, stop = str(out / f"{prefix}b"), TRAINER_STOP[mode]
        options: dict[str, Any] = {"schedule": schedule, "workers": 1, "save_steps": stop}
        run(out, f"{prefix}stopped", stopped, stop=stop, **options)
        run(out, f"{prefix}resumed", stopped, resume=f"{stopped}/checkpoint-{stop}", **options)
    run_mixture(out)
    run_extra_costs(out)


if __name__ == "__main__":
    main()
    exit_when_every_rank_is_done()
