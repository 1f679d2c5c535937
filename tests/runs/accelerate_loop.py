"""A custom Accelerate loop under torchrun: ``torchrun --nproc_per_node=2 accelerate_loop.py OUT``.

2 epochs of optimizer steps of 2 micro-batches, the loader prepared with
``tokenbatch.integrations.accelerate.prepare_data_loader`` and every micro-batch logged
(``accelerate.rank<r>.jsonl``). For comparison, the same loader passed to plain
``accelerator.prepare`` is iterated once, which the sampler refuses (``plain.rank<r>.jsonl``
holds the error).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from run_support import (
    MAX_TOKENS,
    Log,
    decode,
    documents,
    exit_when_every_rank_is_done,
    lengths,
    step_normalized_loss,
    tiny_llama,
)
from torch.utils.data import DataLoader

from tokenbatch.errors import InvalidValueError
from tokenbatch.integrations.accelerate import prepare_data_loader
from tokenbatch.torch import PackedCollator, TokenBudgetBatchSampler, optimizer_steps


def main() -> None:
    out = Path(sys.argv[1])
    accelerator = Accelerator(cpu=True)
    sampler = TokenBudgetBatchSampler(lengths(), MAX_TOKENS, seed=1)
    loader = DataLoader(documents(), batch_sampler=sampler, collate_fn=PackedCollator())

    plain = Log(out, "plain")
    # With even_batches (the default) Accelerate 1.12 refuses a batch sampler
    # without a batch size itself (1.16 shards it); without, every release shards it.
    accelerator.even_batches = False
    try:
        for batch in accelerator.prepare(loader):  # sharded twice: refused
            plain.write(epoch=0, docs=decode(batch))
    except InvalidValueError as error:
        plain.write(epoch=0, error=str(error))
    accelerator.even_batches = True

    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = prepare_data_loader(accelerator, loader)
    log = Log(out, "accelerate")
    for epoch in range(2):
        sampler.set_epoch(epoch)
        steps = optimizer_steps(sampler, micro_batches_per_step=2)
        for i, batch in enumerate(loader, start=sampler.start_step):
            sync = steps.ends[i]
            with contextlib.nullcontext() if sync else accelerator.no_sync(model):
                n = steps.num_items_in_batch(i)
                loss = step_normalized_loss(model, batch, n, accelerator.num_processes)
                accelerator.backward(loss)
            if sync:
                optimizer.step()
                optimizer.zero_grad()
            log.micro_batch(epoch, steps, i, batch, loss)


if __name__ == "__main__":
    main()
    exit_when_every_rank_is_done()
