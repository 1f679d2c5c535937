"""Context-parallel attention over a packed row, checked against one process.

    torchrun --nproc_per_node=4 examples/context_parallel_attention.py --log-dir logs

Every process is one rank of a context-parallel (CP) group. All ranks build the same
packed batch of documents (each padded to a multiple of ``2 * cp_size``) and
``ContextParallelCollator`` keeps this rank's load-balanced shard: chunks ``r`` and
``2 * cp_size - 1 - r`` of every document. The rank projects its tokens to queries, keys
and values, all-gathers keys and values from the group (differentiably), puts them back
in row order with ``unshard``, and attends with a causal mask that keeps documents apart,
built from its tokens' ``seq_idx`` and ``position_ids``. This is all-gather context
parallelism (as in Llama 3's training); ring attention computes the same thing in steps.

The loss uses ``shift_labels``, shifted in the whole row before sharding. After a
backward pass and an all-reduce of the gradients, each rank compares its outputs, the
loss and the gradients with a single-process computation of the whole row, and the
script exits non-zero if any differs. ``--log-dir`` gets one JSON file per rank with the
largest differences and the rank's attention work.
gloo on CPU, nccl on GPU.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F  # noqa: N812

from tokenbatch.torch import ContextParallelCollator, PackedCollator, unshard

IGNORE = -100


class Attention(nn.Module):
    """One causal self-attention layer with a language-model head."""

    def __init__(self, vocab: int, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, vocab)

    def project(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v = self.qkv(self.embed(input_ids[0])).chunk(3, dim=-1)
        return tuple(x.unflatten(-1, (self.heads, -1)).transpose(0, 1) for x in (q, k, v))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> Any:
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(attended.transpose(0, 1).flatten(1))


def document_mask(
    query_doc: torch.Tensor, query_pos: torch.Tensor, key_doc: torch.Tensor, key_pos: torch.Tensor
) -> torch.Tensor:
    """A query sees the keys of its own document up to its own position."""
    same = query_doc[:, None] == key_doc[None, :]
    return same & (key_pos[None, :] <= query_pos[:, None])


def row_layout(cu_seqlens_padded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Document and position of every token of the row (the same on every rank)."""
    lengths = torch.diff(cu_seqlens_padded.long())
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    return doc, torch.arange(int(cu_seqlens_padded[-1])) - cu_seqlens_padded.long()[doc]


class AllGather(torch.autograd.Function):
    """All ranks' tensors in rank order; the gradient of each comes back to its rank."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor) -> tuple[torch.Tensor, ...]:
        shards = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
        dist.all_gather(shards, shard.contiguous())
        return tuple(shards)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        # Every rank's loss depends on this rank's shard: sum their gradients.
        grad = torch.stack(grads).contiguous()
        dist.all_reduce(grad)
        return grad[dist.get_rank()]


def gather_row(shard: torch.Tensor, cu_seqlens_padded: torch.Tensor, dim: int) -> torch.Tensor:
    """All ranks' shards, gathered differentiably, back in the row's order."""
    return unshard(AllGather.apply(shard), cu_seqlens_padded, dim=dim)


def documents(seed: int, n_docs: int, max_length: int) -> list[dict[str, list[int]]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_length + 1, size=n_docs)
    return [{"input_ids": rng.integers(1, 64, size=n).tolist()} for n in lengths.tolist()]


def whole_row(model: Attention, items: list[Any], multiple: int) -> dict[str, Any]:
    """Output, loss and gradients of one process over the whole row."""
    collator = PackedCollator(pad_each_to_multiple_of=multiple)
    batch = ContextParallelCollator(1, 0, collator=collator)(items)
    doc, pos = row_layout(batch["cu_seqlens_padded"])
    q, k, v = model.project(batch["input_ids"])
    logits = model.attend(q, k, v, document_mask(doc, pos, doc, pos))
    targets = batch["shift_labels"][0]
    loss = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
    loss = loss / (targets != IGNORE).sum()
    model.zero_grad()
    loss.backward()
    grads = {name: grad.clone() for name, grad in gradients(model).items()}
    return {"logits": logits.detach(), "loss": loss.detach(), "grads": grads}


def gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=6)
    parser.add_argument("--max-length", type=int, default=40)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", type=Path)
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    cp_size, cp_rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else None
    if device is not None:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    model = Attention(64, args.dim, args.heads).double()  # float64: exact comparisons
    items = documents(args.seed, args.docs, args.max_length)
    expected = whole_row(model, items, 2 * cp_size)
    model.to(device)

    collator = PackedCollator(pad_each_to_multiple_of=2 * cp_size, return_seq_idx=True)
    batch = ContextParallelCollator(cp_size, cp_rank, collator=collator)(items)
    batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    q, k, v = model.project(batch["input_ids"])
    # Every rank needs every key and value: gather them, differentiably, in rank order,
    # and put them back in the row's order.
    k_all, v_all = (gather_row(x, batch["cu_seqlens_padded"], dim=1) for x in (k, v))
    key_doc, key_pos = (x.to(device) for x in row_layout(batch["cu_seqlens_padded"].cpu()))
    mask = document_mask(batch["seq_idx"][0], batch["position_ids"][0], key_doc, key_pos)
    logits = model.attend(q, k_all, v_all, mask)

    targets = batch["shift_labels"][0]
    n_targets = (targets != IGNORE).sum()
    dist.all_reduce(n_targets)
    loss = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum") / n_targets
    model.zero_grad()
    loss.backward()
    for grad in gradients(model).values():
        dist.all_reduce(grad)  # each rank's loss covers its own tokens only
    total_loss = loss.detach().clone()
    dist.all_reduce(total_loss)

    full_logits = gather_row(logits.detach(), batch["cu_seqlens_padded"], dim=0)
    errors = {
        "logits": float((full_logits.cpu() - expected["logits"]).abs().max()),
        "loss": float((total_loss.cpu() - expected["loss"]).abs()),
        "grads": max(
            float((grad.cpu() - expected["grads"][name]).abs().max())
            for name, grad in gradients(model).items()
        ),
    }
    result: dict[str, float] = {f"max_error_{key}": value for key, value in errors.items()}
    result.update(
        cp_size=cp_size,
        rank=cp_rank,
        tokens=int(batch["cu_seqlens_padded"][-1]),
        local_tokens=int(batch["input_ids"].shape[1]),
        attended_pairs=int(mask.sum()),  # the rank's attention work: equal on all ranks
    )
    print(json.dumps(result), flush=True)
    if args.log_dir is not None:
        (args.log_dir / f"rank{cp_rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    if max(errors.values()) > 1e-9:
        raise SystemExit(f"rank {cp_rank}: context-parallel result differs: {errors}")


if __name__ == "__main__":
    main()
