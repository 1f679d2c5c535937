"""Keeping data-parallel ranks in step when their data runs out at different times."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch

__all__ = ["stop_together"]


_T = TypeVar("_T")


def stop_together(
    batches: Iterable[_T],
    *,
    group: Any = None,
    device: torch.device | str | None = None,
) -> Iterator[_T]:
    """Yield from ``batches`` while every rank of ``group`` still has a batch.

    Data-parallel ranks that read streams of unknown length (such as
    :class:`tokenbatch.torch.StreamingDataset` shards) hold different numbers of
    batches; a rank that finishes early would leave the others waiting forever in their
    next gradient all-reduce. Wrapping each rank's loader makes all of them stop after the
    shortest one, at the cost of one all-reduce of a single integer per step::

        for batch in stop_together(loader):
            loss_fn(ddp_model(batch)).backward()

    The batches the longer ranks had left are not yielded. Outside an initialized
    process group this is plain iteration.

    Args:
        batches: this rank's batches (a DataLoader, any iterable).
        group: the process group (default: the default group).
        device: where the flag tensor lives; default: the current CUDA device for the
            ``nccl`` backend, else the CPU.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        yield from batches
        return
    if device is None:
        device = collective_device(group)
    flag = torch.ones(1, dtype=torch.int32, device=device)
    iterator = iter(batches)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            has_batch = 0
        else:
            has_batch = 1
        flag.fill_(has_batch)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=group)
        if int(flag.item()) == 0:
            return
        yield batch


def collective_device(group: Any = None) -> torch.device:
    """Where the tensors of a collective of ``group`` live: the current CUDA device for the
    ``nccl`` backend, else the CPU."""
    if torch.distributed.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
