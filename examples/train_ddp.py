"""Train a small causal transformer with DistributedDataParallel on token-budget batches.

Launch with torchrun (gloo on CPU, nccl on GPU)::

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 examples/train_ddp.py --mode packed

Modes, all with the same model and the same token budget per micro-batch:

* ``packed``: ``TokenBudgetBatchSampler`` + ``PackedCollator``; sequences are concatenated
  into one row, attention stays inside each document (block-diagonal causal mask with
  SDPA, or ``flash_attn_varlen_func`` on GPU when flash-attn is installed);
* ``padded``: ``TokenBudgetBatchSampler(mode="padded")`` + ``PaddedCollator``;
* ``fixed``: a plain ``DistributedSampler`` with a fixed number of sequences per batch
  (``max_tokens // max_length``), padded to the longest, as most training scripts do.

Every step logs the loss, useful (non-padding) tokens per second and the padding ratio;
``--log-dir`` writes one JSON line per step and rank, with the dataset indices the rank
trained on. ``--checkpoint-at K --checkpoint PATH`` saves model, optimizer and sampler
state after global step K (``--stop-after-checkpoint`` then exits, as a crash would);
``--resume PATH`` continues from such a checkpoint with exactly the batches an
uninterrupted run would have seen; with ``--allow-resize`` the checkpoint may come from
a run on another number of processes, and the epoch finishes on this one with the
sequences not yet used.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from tokenbatch.datasets import example_lengths
from tokenbatch.torch import PackedCollator, PaddedCollator, TokenBudgetBatchSampler

try:  # the varlen kernel is optional: CUDA only, installed separately
    from flash_attn import flash_attn_varlen_func
except ImportError:
    flash_attn_varlen_func = None


# ----------------------------------------------------------------------------- model


class Attention(nn.Module):
    """Causal multi-head self-attention that never crosses document boundaries.

    ``kernel`` selects how packed rows are computed: ``"flash"`` calls
    ``flash_attn_varlen_func`` (CUDA, flash-attn installed); ``"mask"`` runs SDPA once over
    the row with a block-diagonal causal mask (cost: row length squared); ``"loop"`` runs
    SDPA once per document (cost: sum of squared document lengths); ``"auto"`` takes
    flash when it can, else the loop. Padded batches always use SDPA with a mask.
    """

    def __init__(self, d_model: int, n_heads: int, kernel: str = "auto") -> None:
        super().__init__()
        self.n_heads = n_heads
        self.kernel = kernel
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        n_rows, n_tokens, d_model = x.shape
        head_dim = d_model // self.n_heads
        q, k, v = self.qkv(x).view(n_rows, n_tokens, 3, self.n_heads, head_dim).unbind(2)
        cu_seqlens = batch.get("cu_seqlens")
        kernel = self.kernel
        if kernel == "auto":
            kernel = "flash" if flash_attn_varlen_func is not None and x.is_cuda else "loop"
        if cu_seqlens is not None and kernel == "flash":
            cu = cu_seqlens.to(device=x.device, dtype=torch.int32)
            max_len = int(batch["max_seqlen"])
            qh, kh, vh = (t[0].bfloat16() for t in (q, k, v))
            attended = flash_attn_varlen_func(qh, kh, vh, cu, cu, max_len, max_len, causal=True)
            y = attended.to(x.dtype).reshape(1, n_tokens, d_model)
        elif cu_seqlens is not None and kernel == "loop":
            sizes = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
            pieces = [
                F.scaled_dot_product_attention(
                    qd.transpose(0, 1), kd.transpose(0, 1), vd.transpose(0, 1), is_causal=True
                ).transpose(0, 1)
                for qd, kd, vd in zip(*(t[0].split(sizes) for t in (q, k, v)), strict=True)
            ]
            y = torch.cat(pieces).reshape(1, n_tokens, d_model)
        else:
            mask = attention_mask(batch, n_rows, n_tokens, x.device)
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
            )
            y = y.transpose(1, 2).reshape(n_rows, n_tokens, d_model)
        return self.out(y)


def attention_mask(
    batch: dict[str, Any], n_rows: int, n_tokens: int, device: torch.device
) -> torch.Tensor:
    """Boolean ``[rows, 1, T, T]`` mask: causal, within one document, never on padding."""
    positions = torch.arange(n_tokens, device=device)
    causal = positions[None, :] <= positions[:, None]
    cu_seqlens = batch.get("cu_seqlens")
    if cu_seqlens is not None:  # packed row: block-diagonal causal
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(device=device, dtype=torch.long)
        document = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
        same = document[None, :] == document[:, None]
        return (causal & same)[None, None]
    keys = batch["attention_mask"].to(device=device, dtype=torch.bool)
    eye = torch.eye(n_tokens, dtype=torch.bool, device=device)  # padding rows attend to self
    return ((causal[None] & keys[:, None, :]) | eye[None])[:, None]


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, kernel: str) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attention = Attention(d_model, n_heads, kernel)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), batch)
        return x + self.mlp(self.norm2(x))


class TinyCausalLM(nn.Module):
    """A GPT-style decoder: token + learned position embeddings, pre-norm blocks."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        max_positions: int,
        kernel: str = "auto",
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_positions, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, kernel) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Logits ``[rows, T, vocab]`` for a packed or a padded batch."""
        input_ids = batch["input_ids"]
        position_ids = batch.get("position_ids")
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        x = self.embed(input_ids) + self.position(position_ids)
        for block in self.blocks:
            x = block(x, batch)
        return self.head(self.norm(x))


# ------------------------------------------------------------------------------ data


class SyntheticDocuments(Dataset[dict[str, Any]]):
    """Documents of arithmetic progressions modulo ``vocab_size``: token ``i + 1`` is token
    ``i`` plus a per-document stride (1, 2 or 3), learnable only from context."""

    def __init__(self, lengths: Sequence[int], vocab_size: int, seed: int) -> None:
        self.lengths = [int(n) for n in lengths]
        self.vocab_size = vocab_size
        self.seed = seed

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        rng = np.random.default_rng((self.seed, index))
        first = int(rng.integers(self.vocab_size))
        stride = 1 + index % 3
        tokens = (first + stride * np.arange(self.lengths[index])) % self.vocab_size
        return {"input_ids": tokens.astype(np.int64), "index": index}


def document_lengths(distribution: str, n: int, max_length: int, seed: int) -> np.ndarray:
    """A named length distribution of tokenbatch.datasets, rescaled from its 8,192-token
    range to ``[1, max_length]`` (same shape, fewer tokens)."""
    lengths = example_lengths(distribution, n, max_length=8192, seed=seed)
    return np.maximum(1, lengths * max_length // 8192).astype(np.int64)


class WithIndices:
    """Adds the dataset indices of a batch to what a collator returns (for the logs)."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        batch: dict[str, Any] = self.collate(items)
        batch["indices"] = [int(item["index"]) for item in items]
        return batch


# -------------------------------------------------------------------------- training


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("packed", "padded", "fixed"), default="packed")
    parser.add_argument("--num-seqs", type=int, default=2000)
    parser.add_argument("--distribution", default="lognormal")
    parser.add_argument("--max-length", type=int, default=512, help="longest document")
    parser.add_argument("--max-tokens", type=int, default=1024, help="tokens per micro-batch")
    parser.add_argument("--algorithm", default="bfd")
    parser.add_argument(
        "--balance", default="attention", choices=("attention", "tokens", "flops", "none")
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many (0: no)")
    parser.add_argument("--vocab-size", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-layers", type=int, default=2)
    parser.add_argument("--n-heads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--attention", choices=("auto", "flash", "mask", "loop"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--log-dir", type=Path)
    parser.add_argument("--log-every", type=int, default=1)
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--checkpoint-at", type=int, default=0, help="global step to save at")
    parser.add_argument("--stop-after-checkpoint", action="store_true")
    parser.add_argument("--resume", type=Path)
    parser.add_argument(
        "--allow-resize", action="store_true", help="resume a checkpoint of another world size"
    )
    parser.add_argument("--warmup-steps", type=int, default=2, help="left out of the summary")
    return parser.parse_args(argv)


def setup() -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes (a single process without torchrun)."""
    cuda = torch.cuda.is_available()
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def all_reduce(values: list[float], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return [float(v) for v in tensor.tolist()]


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {
        key: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        for key, value in batch.items()
    }


def make_loader(
    args: argparse.Namespace,
    dataset: SyntheticDocuments,
    lengths: np.ndarray,
    world: int,
    rank: int,
) -> tuple[DataLoader[Any], Any]:
    if args.mode == "fixed":
        per_batch = max(1, args.max_tokens // args.max_length)
        sampler: Any = DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed
        )
        loader = DataLoader(
            dataset,
            batch_size=per_batch,
            sampler=sampler,
            collate_fn=WithIndices(PaddedCollator()),
            num_workers=args.num_workers,
            multiprocessing_context=worker_start(args.num_workers),
        )
        return loader, sampler
    sampler = TokenBudgetBatchSampler(
        lengths,
        args.max_tokens,
        mode=args.mode,
        algorithm=args.algorithm,
        seed=args.seed,
        num_replicas=world,
        rank=rank,
        balance=None if args.balance == "none" else args.balance,
        hidden_size=args.d_model,
        dataset=dataset,
    )
    collate = PackedCollator() if args.mode == "packed" else PaddedCollator()
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=WithIndices(collate),
        num_workers=args.num_workers,
        multiprocessing_context=worker_start(args.num_workers),
    )
    return loader, sampler


def worker_start(num_workers: int) -> str | None:
    """How DataLoader workers start: from a fork server, not by forking the rank. On
    CPython before 3.12 a child forked while another thread of the rank creates or
    deletes its Python thread state (the gloo process group's threads do, during DDP
    training) can be stuck for good at its start (gh-112275)."""
    return "forkserver" if num_workers > 0 else None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = setup()
    try:
        train(args, rank, world, device)
    finally:
        # Free the model, its DDP wrapper and the loader (collecting the reference cycles
        # modules and hooks form) before the process group goes: a gloo group whose last
        # holder dies during interpreter shutdown can abort the process at exit
        # ("terminate called without an active exception").
        gc.collect()
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    return 0


def train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> None:
    """Train for the epochs asked, logging each step; checkpoint and resume as asked."""
    if args.device == "cpu":
        device = torch.device("cpu")
    lengths = document_lengths(args.distribution, args.num_seqs, args.max_length, args.seed)
    dataset = SyntheticDocuments(lengths, args.vocab_size, args.seed)
    loader, sampler = make_loader(args, dataset, lengths, world, rank)

    torch.manual_seed(args.seed)
    model = TinyCausalLM(
        args.vocab_size, args.d_model, args.n_layers, args.n_heads, args.max_length, args.attention
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start_epoch, step = 0, 0
    if args.resume is not None:
        checkpoint = torch.load(args.resume, map_location=device, weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        sampler.load_state_dict(checkpoint["sampler"], allow_resize=args.allow_resize)
        start_epoch, step = int(checkpoint["sampler"]["epoch"]), int(checkpoint["step"])
    ddp = DistributedDataParallel(model) if dist.is_initialized() else model

    log = None
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
        log = (args.log_dir / f"rank{rank}.jsonl").open("a")
    if rank == 0 and isinstance(sampler, TokenBudgetBatchSampler):
        stats = sampler.stats()
        print(
            f"plan: {stats['n_steps']} steps x {world} ranks, padding "
            f"{stats['padding_ratio']:.1%}, attention sync overhead "
            f"{stats['attention_sync_overhead']:.3f}",
            flush=True,
        )

    useful, computed, seconds = 0.0, 0.0, 0.0
    finished = False
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        clock = time.perf_counter()
        for taken, batch in enumerate(loader, start=1):
            indices = batch.pop("indices")
            batch = to_device(batch, device)
            logits = ddp(batch)
            labels = batch["labels"][:, 1:]
            loss_sum = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                labels.reshape(-1),
                ignore_index=-100,
                reduction="sum",
            )
            real = int(batch["input_ids"].numel())
            if "attention_mask" in batch:
                real = int(batch["attention_mask"].sum())
            n_labels = int((labels != -100).sum())
            totals = all_reduce(
                [float(loss_sum.detach()), n_labels, real, batch["input_ids"].numel()], device
            )
            # Mean over every label of the global batch: DDP averages gradients over ranks.
            loss = loss_sum * world / max(totals[1], 1.0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            elapsed, clock = now - clock, now
            if step > args.warmup_steps:
                useful, computed, seconds = (
                    useful + totals[2],
                    computed + totals[3],
                    seconds + elapsed,
                )
            record = {
                "epoch": epoch,
                "step": step,
                "loss": totals[0] / max(totals[1], 1.0),
                "tokens": real,
                "padding_ratio": 1.0 - real / max(int(batch["input_ids"].numel()), 1),
                "tokens_per_s": totals[2] / elapsed,
                "indices": indices,
            }
            if log is not None:
                log.write(json.dumps(record) + "\n")
                log.flush()
            if rank == 0 and step % args.log_every == 0:
                print(
                    f"epoch {epoch} step {step} loss {record['loss']:.4f} "
                    f"tokens/s {record['tokens_per_s']:.0f} "
                    f"padding {record['padding_ratio']:.1%}",
                    flush=True,
                )
            if args.checkpoint is not None and step == args.checkpoint_at:
                save_checkpoint(args.checkpoint, model, optimizer, sampler, step, taken, rank)
                if args.stop_after_checkpoint:
                    finished = True
                    break
            if args.max_steps and step >= args.max_steps:
                finished = True
                break
        if finished:
            break
    if rank == 0 and seconds > 0:
        summary = {
            "mode": args.mode,
            "world": world,
            "steps": step,
            "useful_tokens_per_s": useful / seconds,
            "padding_ratio": 1.0 - useful / max(computed, 1.0),
        }
        print("summary " + json.dumps(summary), flush=True)
    if log is not None:
        log.close()


def save_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: Any,
    step: int,
    taken: int,
    rank: int,
) -> None:
    """Rank 0 saves; the sampler state is the same on every rank. ``taken`` is the number
    of batches the loop took from this epoch's iterator, which stays exact when
    DataLoader workers prefetch ahead."""
    if rank == 0:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "sampler": sampler.state_dict(consumed_batches=taken),
            "step": step,
        }
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(path)
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    sys.exit(main())
