"""DPO from packed rows on several ranks: ``torchrun --nproc_per_node=2 dpo_ddp.py OUT``.

Each rank trains a tiny float64 Llama under DDP (gloo) for one epoch of optimizer steps of
2 micro-batches of the token-budget sampler, twice: on pair items with a reference model
run on the same packed rows, and on sequence items (two per pair, as a packing with
groups serves them) with reference log-probabilities precomputed. Every micro-batch is one
packed row; its DPO loss is summed over its pairs and divided by the pairs of its whole
optimizer step on all ranks (counted from the plan), times the number of ranks.

For contrast, a third run on pair items averages each micro-batch's mean loss (what a
plain accumulation loop does), which weighs pairs unequally. Rank 0 then replays every
optimizer step on one process from padded pairs, the classic way
(``dpo_support.padded_dpo_loss``), and writes the gradients and losses of all four after
every step to ``grads.npz``. Every rank logs the pairs of each micro-batch
(``<form>.rank<r>.jsonl``).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from dpo_support import BETA, MAX_TOKENS, padded_dpo_loss, padded_logps, pairs, sequence_items
from run_support import Log, tiny_llama
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from tokenbatch.torch import (
    PreferenceCollator,
    TokenBudgetBatchSampler,
    dpo_loss,
    optimizer_steps,
    pair_lengths,
    sequence_logps,
)

LR = 0.5
MICRO_BATCHES_PER_STEP = 2


def flat_gradients(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy().copy()


def row_logps(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    """Summed completion log-probabilities of every sequence of a packed row."""
    # Without an attention mask (and without a cache), the model keeps the row's
    # sequences apart where position_ids restart.
    logits = model(
        input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
    ).logits
    return sequence_logps(logits, batch["labels"], batch["cu_seqlens_padded"])


def train_packed(
    form: str, items: list[dict[str, Any]], reference: Any, out: Path
) -> tuple[list[np.ndarray], list[float]]:
    world = dist.get_world_size()
    sampler = TokenBudgetBatchSampler(pair_lengths(items), MAX_TOKENS, seed=0)
    # DPO's unit is the pair: every pair item counts one towards its step's normalizer.
    steps = optimizer_steps(
        sampler,
        micro_batches_per_step=MICRO_BATCHES_PER_STEP,
        label_counts=np.ones(len(items), dtype=np.int64),
    )
    collator = PreferenceCollator()
    dataset: list[Any]
    if form in ("pairs", "means"):
        dataset, collate = items, collator
    else:
        with torch.no_grad():
            ref_chosen, ref_rejected = padded_logps(reference, items)
        dataset = []
        for pair, chosen, rejected in zip(items, ref_chosen, ref_rejected, strict=True):
            first, second = sequence_items(pair)
            dataset.append(
                [{**first, "ref_logps": float(chosen)}, {**second, "ref_logps": float(rejected)}]
            )

        def collate(batch: list[list[dict[str, Any]]]) -> dict[str, Any]:
            return collator([sequence for pair in batch for sequence in pair])

    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    model = DistributedDataParallel(tiny_llama(seed=0).double())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    log = Log(out, form)
    grads: list[np.ndarray] = []
    losses: list[float] = []
    step_loss = torch.zeros((), dtype=torch.float64)
    for i, batch in enumerate(loader):
        sync = bool(steps.ends[i])
        chosen, rejected = batch["chosen_index"], batch["rejected_index"]
        with contextlib.nullcontext() if sync else model.no_sync():
            logps = row_logps(model, batch)
            if form != "sequences":
                with torch.no_grad():
                    ref = row_logps(reference, batch)
                ref_chosen, ref_rejected = ref[chosen], ref[rejected]
            else:
                ref_chosen, ref_rejected = batch["ref_chosen_logps"], batch["ref_rejected_logps"]
            n_pairs = steps.num_items_in_batch(i)
            pair_logps = (logps[chosen], logps[rejected], ref_chosen, ref_rejected)
            if form == "means":  # each micro-batch's mean, averaged: pairs weigh unequally
                loss = dpo_loss(*pair_logps, beta=BETA) / MICRO_BATCHES_PER_STEP
                loss.backward()
            else:
                loss = dpo_loss(*pair_logps, beta=BETA, num_pairs=n_pairs)
                (loss * world).backward()  # DDP averages the gradients over the ranks
        step_loss += loss.detach() if form != "means" else loss.detach() / world
        log.write(step=steps.step_of(i), pairs=batch["pair_ids"].tolist(), num_pairs=n_pairs)
        if sync:
            dist.all_reduce(step_loss)
            grads.append(flat_gradients(model.module))
            losses.append(float(step_loss))
            optimizer.step()
            optimizer.zero_grad()
            step_loss.zero_()
    return grads, losses


def train_padded(
    items: list[dict[str, Any]], reference: Any
) -> tuple[list[np.ndarray], list[float]]:
    """The same optimizer steps on one process, each over all its pairs on all ranks."""
    world = dist.get_world_size()
    lengths = pair_lengths(items)
    per_rank = [
        list(TokenBudgetBatchSampler(lengths, MAX_TOKENS, seed=0, num_replicas=world, rank=r))
        for r in range(world)
    ]
    steps = optimizer_steps(
        TokenBudgetBatchSampler(lengths, MAX_TOKENS, seed=0),
        micro_batches_per_step=MICRO_BATCHES_PER_STEP,
    )
    policy = tiny_llama(seed=0).double()
    optimizer = torch.optim.SGD(policy.parameters(), lr=LR)
    grads: list[np.ndarray] = []
    losses: list[float] = []
    for start, end in zip(steps.offsets[:-1], steps.offsets[1:], strict=True):
        step_items = [
            items[j] for batches in per_rank for batch in batches[start:end] for j in batch
        ]
        loss = padded_dpo_loss(policy, reference, step_items)
        loss.backward()
        grads.append(flat_gradients(policy))
        losses.append(float(loss.detach()))
        optimizer.step()
        optimizer.zero_grad()
    return grads, losses


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    items = pairs()
    reference = tiny_llama(seed=1).double().eval()
    forms = ("pairs", "sequences", "means")
    results = {form: train_packed(form, items, reference, out) for form in forms}
    if dist.get_rank() == 0:
        results["padded"] = train_padded(items, reference)
        arrays = {}
        for form, (grads, losses) in results.items():
            arrays[f"{form}_grads"] = np.stack(grads)
            arrays[f"{form}_losses"] = np.array(losses)
        np.savez(out / "grads.npz", **arrays)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
