"""Shared pieces of the multi-process trainer runs: a tiny Llama built from a config, a
synthetic corpus whose documents say who they are, and one JSON log per rank.

Document ``i`` starts with the tokens ``i % VOCAB, i // VOCAB``, so the documents of any
packed micro-batch can be read back from its ``input_ids`` and ``cu_seq_lens_q``,
whatever the framework did with the batch on the way.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from tokenbatch.mixture import Mixture
from tokenbatch.schedule import LinearRamp, Piecewise
from tokenbatch.torch import TokenBudgetBatchSampler

VOCAB = 128
N_DOCS = 480
MAX_TOKENS = 512
#: The batch-size ramp of the schedule runs.
SCHEDULE = LinearRamp(1024, 4096, 30_000, unit="tokens")
#: Optimizer step the Trainer runs stop at, in the middle of the second epoch (19 + 19
#: steps of 2 micro-batches, 16 + 10 steps under the ramp).
TRAINER_STOP = {"ga": 28, "schedule": 20}
#: The TrainingArguments (or TRL SFTConfig) options of every CPU training run.
CPU_TRAINING_ARGS: dict[str, Any] = {
    "use_cpu": True,
    "report_to": [],
    "disable_tqdm": True,
    "ddp_find_unused_parameters": False,
}
#: The mixture run's sources: the first and second half of the documents, in that order.
MIXTURE_SOURCES = {"web": slice(0, N_DOCS // 2), "code": slice(N_DOCS // 2, N_DOCS)}
#: Its optimizer steps (of 4 micro-batches' tokens over both ranks) and its log interval.
MIXTURE_STEPS, MIXTURE_LOGGING_STEPS = 6, 2


def lengths(n: int = N_DOCS, seed: int = 0) -> np.ndarray:
    """Document lengths in [2, 400], skewed towards short ones."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(4.0, 0.9, n).astype(np.int64), 2, 400)


def mixture_sampler(rank: int | None = None) -> TokenBudgetBatchSampler:
    """The mixture run's sampler: 3 tokens of web to 1 of code, each source repeated at
    most twice. ``rank`` given: that rank's sampler of 2 (otherwise the process group's)."""
    all_lengths = lengths()
    ranks = {} if rank is None else {"num_replicas": 2, "rank": rank}
    return TokenBudgetBatchSampler(
        {name: all_lengths[part] for name, part in MIXTURE_SOURCES.items()},
        MAX_TOKENS,
        seed=1,
        mixture=Mixture({"web": 0.75, "code": 0.25}, max_repetition=2),
        schedule=Piecewise([(0, 4 * MAX_TOKENS)]),
        **ranks,
    )


#: The extra-costs run's budget of images per micro-batch; each document carries
#: ``IMAGES[i % 4]`` of them.
MAX_IMAGES, IMAGES = 5, np.array([0, 1, 3, 2])


def extra_costs_sampler(rank: int | None = None) -> TokenBudgetBatchSampler:
    """The extra-costs run's sampler: tokens and images under their budgets (``rank``
    given: that rank's sampler of 2, otherwise the process group's)."""
    ranks = {} if rank is None else {"num_replicas": 2, "rank": rank}
    images = IMAGES[np.arange(N_DOCS) % 4, None]
    return TokenBudgetBatchSampler(
        lengths(), MAX_TOKENS, seed=1, extra_costs=images, max_extra_costs=[MAX_IMAGES], **ranks
    )


def documents(n: int = N_DOCS, seed: int = 0) -> list[dict[str, list[int]]]:
    rng = np.random.default_rng(seed + 1)
    docs = []
    for i, length in enumerate(lengths(n, seed)):
        tokens = rng.integers(0, VOCAB, int(length))
        tokens[:2] = (i % VOCAB, i // VOCAB)
        docs.append({"input_ids": tokens.tolist()})
    return docs


def tiny_llama(seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=1,
    )
    return LlamaForCausalLM(config)


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over the words ``<0> ... <127>`` (``<0>`` pads, ``<1>`` ends
    a text; special tokens are matched inside words, so no word may contain another)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(VOCAB)}, unk_token="<2>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<0>", eos_token="<1>", unk_token="<2>"
    )


def texts(n: int = N_DOCS, seed: int = 0) -> list[dict[str, str]]:
    """The documents as text for :func:`tiny_tokenizer` (a trailing space, so that the
    EOS a trainer appends is a word of its own)."""
    return [
        {"text": "".join(f"<{token}> " for token in doc["input_ids"])} for doc in documents(n, seed)
    ]


#: What a Hugging Face causal LM takes from a PackedCollator batch.
MODEL_KEYS = ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k",
              "max_length_q", "max_length_k")  # fmt: skip


def step_normalized_loss(model: Any, batch: dict[str, Any], num_items: int, world: int) -> Any:
    """The micro-batch's summed token loss over the label tokens of its whole optimizer
    step on all ranks, times the ranks DDP averages the gradients over."""
    inputs = {key: batch[key] for key in MODEL_KEYS}
    return model(**inputs, num_items_in_batch=num_items).loss * world


def decode(batch: dict[str, Any]) -> list[int]:
    """The documents of a packed micro-batch, in order."""
    ids = batch["input_ids"].reshape(-1).tolist()
    starts = batch["cu_seq_lens_q"].tolist()[:-1]
    return [ids[s] + VOCAB * ids[s + 1] for s in starts]


def label_tokens(batch: dict[str, Any]) -> int:
    """Labels a causal LM trains on (the first label of a row is never a target)."""
    return int((batch["labels"][..., 1:] != -100).sum())


class RecordingMixin:
    """Put first among the bases of a Trainer: logs the documents, labels, normalizer and
    loss of every micro-batch to ``records`` (a :class:`Log`)."""

    records: Log

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.records.write(
            epoch=self.token_budget_sampler.epoch,
            step=self.state.global_step,
            docs=decode(inputs),
            labels=label_tokens(inputs),
            num_items=int(kwargs["num_items_in_batch"]),
            loss=float(loss.detach()),
        )
        return loss


class Log:
    """One JSON line per record, per rank."""

    def __init__(self, directory: str | Path, name: str) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        path = Path(directory) / f"{name}.rank{self.rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("w")

    def write(self, **record: Any) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def micro_batch(self, epoch: int, steps: Any, i: int, batch: Any, loss: Any) -> None:
        """Record micro-batch ``i`` of ``epoch`` (``steps``: its OptimizerSteps)."""
        self.write(
            epoch=epoch,
            step=steps.step_of(i),
            docs=decode(batch),
            labels=label_tokens(batch),
            num_items=steps.num_items_in_batch(i),
            loss=float(loss.detach()),
        )


def start_workers_from_a_fork_server() -> None:
    """Make DataLoader workers start from a fork server rather than by forking the rank:
    on CPython before 3.12 a worker forked from a DDP rank can be stuck for good at its
    start (gh-112275; docs/trainers.md, "Limits"). The Lightning run hung so twice in
    146 runs."""
    multiprocessing.set_start_method("forkserver", force=True)
    # Started now, the server imports the script while the rank runs, rather than when the
    # first DataLoader wants a worker (one timing of the Lightning run: 26 s against 28).
    multiprocessing.forkserver.ensure_running()


def load_checkpoints_on_the_cpu() -> None:
    """Load a resumed CPU run's checkpoints on the device ``"cpu"``.

    transformers before 5.x maps the optimizer state of a multi-process run to the
    processes' device, which for a CPU run is the indexed ``cpu:0`` that ``torch.load``
    cannot restore (newer releases load it on ``"cpu"``); GPU runs are not affected. The
    trainer runs resume multi-process CPU runs on every supported release, so they load
    as the newer releases do.
    """
    load = torch.load

    def load_on_the_cpu(*args: Any, map_location: Any = None, **kwargs: Any) -> Any:
        if isinstance(map_location, torch.device) and map_location.type == "cpu":
            map_location = "cpu"
        return load(*args, map_location=map_location, **kwargs)

    torch.load = load_on_the_cpu


def free_port() -> int:
    """A TCP port no process listens on now, for a torchrun rendezvous."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


#: Seconds after which a run script prints every thread's stack and exits (set by
#: :func:`run`): a hang in a collective or a DataLoader worker then fails its test with
#: the place each rank stopped at, not a bare timeout. The first rank to exit makes
#: torchrun stop the others with SIGTERM, so they print their stacks on SIGTERM too.
WATCHDOG_ENV = "TOKENBATCH_TEST_WATCHDOG_S"
if float(os.environ.get(WATCHDOG_ENV, "0")) > 0:
    faulthandler.dump_traceback_later(float(os.environ[WATCHDOG_ENV]), exit=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)


def run(command: list[str], *, cwd: Path, timeout: float) -> None:
    """Run ``command`` (a launcher of CPU processes: one torch thread each, no GPU),
    failing with its output if it fails or outlives ``timeout`` seconds."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONUNBUFFERED": "1",
        # Scripts that import this module dump their stacks a minute before the timeout.
        WATCHDOG_ENV: str(max(timeout - 60, timeout / 2)),
    }
    # A timeout turns a hang in a collective into a failure instead of a stuck CI job.
    try:
        result = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(
            f"{command} still ran after {timeout} s:\n{_tail(expired.stdout, 3000)}\n"
            f"{_tail(expired.stderr, 20000)}"
        ) from None
    assert result.returncode == 0, (
        f"{command} failed:\n{_tail(result.stdout, 3000)}\n{_tail(result.stderr, 20000)}"
    )


def _tail(output: str | bytes | None, chars: int) -> str:
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    return (output or "")[-chars:]


def torchrun(script: Path, args: list[str], *, nproc: int, cwd: Path, timeout: float) -> None:
    """Run ``script args`` on ``nproc`` CPU processes under torchrun."""
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    run([*launcher, f"--master_port={free_port()}", str(script), *args], cwd=cwd, timeout=timeout)


def exit_when_every_rank_is_done() -> NoReturn:
    """End this rank's process once every rank is done: at a barrier when a process group
    is up, then at once, without the interpreter's teardown. Every rank must call this.

    Neither way of tearing down a gloo group is safe at exit. Exiting with the group
    alive can abort in the teardown of its threads ("terminate called without an active
    exception"), and ``destroy_process_group`` can deadlock on torch 2.6: the group's
    destructor holds the GIL while it joins a gloo worker thread, and that thread, freeing
    a finished collective's tensor, waits for the GIL (``hf_evaluate.py`` on the oldest
    stack, about 1 run in 20 under load). :class:`Log` flushes every record, so nothing is
    lost by skipping the teardown."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
