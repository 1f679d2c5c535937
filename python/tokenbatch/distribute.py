"""Dealing the bins of a packing to data-parallel ranks, epoch by epoch.

A deal turns a :class:`~tokenbatch.Packing` into a table of ``n_steps x num_replicas``
bins, so that every rank runs the same number of micro-batches, every placed sequence is
used exactly once, and the bins that run side by side in one step cost about the same.

The Rust core does the work (:class:`Dealer` and :class:`EpochDeal` are its classes).
Every tie is broken by an index and every random choice comes from one seeded generator,
so every rank builds the identical deal without communicating, on any machine, numpy
version or thread count. :data:`DEAL_FORMAT` names the rules; it changes whenever what a
rank receives changes.

This module does not import torch; :mod:`tokenbatch.torch` builds its batch sampler on it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_int_unbounded
from tokenbatch._core import DEAL_FORMAT, Dealer, EpochDeal
from tokenbatch.packing import Packing

__all__ = ["DEAL_FORMAT", "Balance", "Dealer", "EpochDeal", "Segment", "deal_epoch", "mix_seed"]

Balance = Literal["attention", "tokens", "flops"] | None
#: A piece of a sequence: ``(index, start, length)``, tokens ``start:start + length``.
Segment = tuple[int, int, int]

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """Mix integers into one 64-bit seed with the Rust core's ``rng::mix_seed``.

    ``mix_seed(seed, epoch)`` gives unrelated streams for neighbouring epochs and is the
    same on every machine. Each part is taken modulo ``2**64``.
    """
    return _core.mix_seed([as_int_unbounded(part, "part") & _MASK64 for part in parts])


def _permutation(seed: int, n: int) -> npt.NDArray[np.int64]:
    """A seeded random permutation of ``range(n)``, from the Rust core's generator."""
    return _core.permutation(seed, n)


def deal_epoch(
    packing: Packing,
    num_replicas: int,
    *,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    balance: Balance = "attention",
    drop_last: bool = False,
    pad_to_multiple_of: int = 1,
    split_sequences: bool = False,
    hidden_size: int | None = None,
) -> EpochDeal:
    """Distribute the bins of ``packing`` over ``num_replicas`` data-parallel ranks:
    ``Dealer(packing, num_replicas, ...).deal(epoch)``.

    ``epoch`` and ``seed`` select the random order; the other arguments are those of
    :class:`Dealer`, which says what they do. Use a :class:`Dealer` to deal several
    epochs of one packing: it reuses the work that does not depend on the epoch.

    Raises:
        InvalidValueError: there are too few sequences to give every rank the same number
            of non-empty batches (pass ``drop_last=True``), or an invalid option.
    """
    dealer = Dealer(
        packing,
        num_replicas,
        seed=seed,
        shuffle=shuffle,
        balance=balance,
        drop_last=drop_last,
        pad_to_multiple_of=pad_to_multiple_of,
        split_sequences=split_sequences,
        hidden_size=hidden_size,
    )
    return dealer.deal(epoch)
