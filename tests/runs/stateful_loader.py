"""A plain DDP loop over torchdata's StatefulDataLoader under torchrun:
``torchrun --nproc_per_node=2 stateful_loader.py OUT``.

1. Gradients of one optimizer step (3 micro-batches per rank), saved by rank 0:
   ``grads_step.pt`` with the loss normalized by the label tokens of the whole step on all
   ranks, ``grads_mean.pt`` with per-micro-batch mean losses, and ``grads_reference.pt``
   of one process over the same global batch with a sum-over-tokens / total-tokens loss.
2. 2 epochs of optimizer steps of 2 micro-batches (``uninterrupted``); then runs stopped
   after micro-batch ``STOP`` of the second epoch, saving ``loader.state_dict()`` with the
   model, and resumed from it, with 0 and 2 DataLoader workers (``stopped_w0``,
   ``resumed_w0``, ``stopped_w2``, ``resumed_w2``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from run_support import (
    MAX_TOKENS,
    MODEL_KEYS,
    Log,
    documents,
    label_tokens,
    lengths,
    start_workers_from_a_fork_server,
    step_normalized_loss,
    tiny_llama,
)
from torch.nn.parallel import DistributedDataParallel
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenbatch.torch import PackedCollator, TokenBudgetBatchSampler, optimizer_steps

STOP = 20  # micro-batches of the second epoch before the stop (an optimizer step's end)


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def gradient_check(out: Path) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    samplers = [
        TokenBudgetBatchSampler(lengths(), MAX_TOKENS, seed=1, num_replicas=world, rank=r)
        for r in range(world)
    ]
    steps = optimizer_steps(samplers[rank], micro_batches_per_step=3)
    docs, collate = documents(), PackedCollator()

    def first_step(r: int) -> list[dict[str, Any]]:
        return [collate([docs[i] for i in b]) for b in itertools.islice(samplers[r], 3)]

    for mode in ("step", "mean"):
        model = DistributedDataParallel(tiny_llama())
        for i, batch in enumerate(first_step(rank)):
            with contextlib.nullcontext() if steps.ends[i] else model.no_sync():
                if mode == "step":
                    loss = step_normalized_loss(model, batch, steps.num_items_in_batch(i), world)
                else:  # each micro-batch's mean token loss, averaged over the micro-batches
                    loss = model(**{key: batch[key] for key in MODEL_KEYS}).loss / 3
                loss.backward()
        if rank == 0:
            torch.save(gradients(model.module), out / f"grads_{mode}.pt")
    if rank == 0:
        model = tiny_llama()
        everything = [batch for r in range(world) for batch in first_step(r)]
        total = sum(label_tokens(batch) for batch in everything)
        summed = sum(
            torch.nn.functional.cross_entropy(
                model(**{key: batch[key] for key in MODEL_KEYS}).logits[0, :-1],
                batch["labels"][0, 1:],
                reduction="sum",
            )
            for batch in everything
        )
        (summed / total).backward()
        torch.save(gradients(model), out / "grads_reference.pt")
        meta = {"label_tokens": total, "num_items_in_batch": int(steps.label_tokens[0])}
        (out / "grads.json").write_text(json.dumps(meta))
    dist.barrier()


def run(out: Path, name: str, *, workers: int, stop: bool = False, resume: bool = False) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    checkpoint = out / f"checkpoint_w{workers}.rank{rank}.pt"
    sampler = TokenBudgetBatchSampler(lengths(), MAX_TOKENS, seed=1)
    loader = StatefulDataLoader(
        documents(), batch_sampler=sampler, collate_fn=PackedCollator(), num_workers=workers
    )
    model = DistributedDataParallel(tiny_llama())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first_epoch, start = 0, 0
    if resume:
        state = torch.load(checkpoint, weights_only=False)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])  # the sampler's position comes back with it
        first_epoch, start = state["epoch"], state["micro_batch"]
    log = Log(out, name)
    for epoch in range(first_epoch, 2):
        sampler.set_epoch(epoch)
        steps = optimizer_steps(sampler, micro_batches_per_step=2)
        for i, batch in enumerate(loader, start=start if epoch == first_epoch else 0):
            with contextlib.nullcontext() if steps.ends[i] else model.no_sync():
                loss = step_normalized_loss(model, batch, steps.num_items_in_batch(i), world)
                loss.backward()
            if steps.ends[i]:
                optimizer.step()
                optimizer.zero_grad()
            log.micro_batch(epoch, steps, i, batch, loss)
            if stop and epoch == 1 and i + 1 == STOP:
                state = {
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),
                    "epoch": epoch,
                    "micro_batch": i + 1,
                }
                torch.save(state, checkpoint)
                return


def main() -> None:
    start_workers_from_a_fork_server()
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    gradient_check(out)
    run(out, "uninterrupted", workers=0)
    for workers in (0, 2):
        run(out, f"stopped_w{workers}", workers=workers, stop=True)
        run(out, f"resumed_w{workers}", workers=workers, resume=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
