"""Dealing the bins of a packing to data-parallel ranks, epoch by epoch.

A deal turns a :class:`~tokenbatch.Packing` into a table of ``n_steps x num_replicas``
bins, so that every rank runs the same number of micro-batches, every placed sequence is
used exactly once, and the bins that run side by side in one step cost about the same.

The Rust core does the work; :class:`Dealer` and :class:`EpochDeal` read the arguments
and hand out its results (arrays are read-only views of its memory, not copies).
Every tie is broken by an index and every random choice comes from one seeded generator,
so every rank builds the identical deal without communicating, on any machine, numpy
version or thread count. :data:`DEAL_FORMAT` names the rules; it changes whenever what a
rank receives changes.

This module does not import torch; :mod:`tokenbatch.torch` builds its batch sampler on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_bool, as_int, as_int_unbounded, as_seed, as_str
from tokenbatch._core import DEAL_FORMAT
from tokenbatch.errors import InvalidTypeError
from tokenbatch.packing import Packing

__all__ = ["DEAL_FORMAT", "Balance", "Dealer", "EpochDeal", "Segment", "deal_epoch", "mix_seed"]

Balance = Literal["attention", "tokens", "flops"] | None
CostKind = Literal["tokens", "attention", "flops"]
#: A piece of a sequence: ``(index, start, length)``, tokens ``start:start + length``.
Segment = tuple[int, int, int]

_MASK64 = (1 << 64) - 1
_I64 = npt.NDArray[np.int64]


def mix_seed(*parts: int) -> int:
    """Mix integers into one 64-bit seed with the Rust core's ``rng::mix_seed``.

    ``mix_seed(seed, epoch)`` gives unrelated streams for neighbouring epochs and is the
    same on every machine. Each part is taken modulo ``2**64``.
    """
    return _core.mix_seed([as_int_unbounded(part, "part") & _MASK64 for part in parts])


def _permutation(seed: int, n: int) -> _I64:
    """A seeded random permutation of ``range(n)``, from the Rust core's generator."""
    return _core.permutation(seed, n)


class Dealer:
    """Deals the bins of one packing to ``num_replicas`` ranks, epoch by epoch, reusing
    the epoch-independent work (cutting bins so that their count divides by
    ``num_replicas``, costs, the order by cost) across epochs.

    Args:
        packing: a result of :func:`tokenbatch.pack` or :func:`tokenbatch.batch_padded`.
        num_replicas: number of data-parallel ranks.
        seed: the same on every rank; deals are identical for equal arguments.
        shuffle: shuffle, every epoch, the order of steps, which rank runs which bin of a
            step, and bins of equal cost; ``False`` keeps the deterministic order
            (costliest steps first when balancing).
        balance: ``"attention"`` groups bins of similar attention cost (sum of squared
            padded sequence lengths) into the same step, ``"tokens"`` bins of similar token
            count, ``"flops"`` bins of similar total FLOPs (tokens plus
            attention / (12 hidden_size), needs ``hidden_size``); ``None`` deals bins in
            (shuffled) packing order.
        drop_last: when the number of bins does not divide by ``num_replicas``, leave out
            the least-filled remainder bins instead of cutting bins.
        pad_to_multiple_of: the value the packing was built with: every cost counts each
            sequence at its length rounded up to this multiple (a kernel that needs the
            padding, as context parallelism does, spends attention time on it too).
        split_sequences: when cutting bins between their sequences cannot make enough
            bins, cut the longest sequences into pieces first (the batches then hold
            ``(index, start, length)`` segments, as with ``oversize="split"``).
        hidden_size: the model's hidden size, for the ``"flops"`` cost (and its imbalance
            in :meth:`EpochDeal.stats`).

    Without ``drop_last``, bins are cut between their sequences (the costliest first)
    until their number divides by ``num_replicas``; no sequence is lost or repeated. Every
    tie is broken by bin or sequence index and randomness comes from the Rust core's
    SplitMix64, so deals are identical on every machine, numpy version and thread count.

    Raises:
        InvalidValueError: too few sequences to give every rank the same number of
            non-empty batches (pass ``drop_last=True``), or an invalid option.
    """

    def __init__(
        self,
        packing: Packing,
        num_replicas: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        balance: Balance = "attention",
        drop_last: bool = False,
        pad_to_multiple_of: int = 1,
        split_sequences: bool = False,
        hidden_size: int | None = None,
    ) -> None:
        if not isinstance(packing, Packing):
            raise InvalidTypeError(
                f"packing must be a tokenbatch.Packing, got {type(packing).__name__}"
            )
        self._dealer = _core.Dealer(
            packing,
            as_int(num_replicas, "num_replicas"),
            seed=as_seed(seed),
            shuffle=as_bool(shuffle, "shuffle"),
            balance=None if balance is None else as_str(balance, "balance"),
            drop_last=as_bool(drop_last, "drop_last"),
            pad_to_multiple_of=as_int(pad_to_multiple_of, "pad_to_multiple_of"),
            split_sequences=as_bool(split_sequences, "split_sequences"),
            hidden_size=None if hidden_size is None else as_int(hidden_size, "hidden_size"),
        )

    @property
    def packing(self) -> Packing:
        """The packing dealt."""
        return self._dealer.packing

    @property
    def num_replicas(self) -> int:
        """Number of data-parallel ranks."""
        return self._dealer.num_replicas

    @property
    def seed(self) -> int:
        """The seed of the deals."""
        return self._dealer.seed

    @property
    def shuffle(self) -> bool:
        """Whether deals are shuffled every epoch."""
        return self._dealer.shuffle

    @property
    def balance(self) -> Balance:
        """The cost balanced within a step (``None``: packing order)."""
        return self._dealer.balance

    @property
    def drop_last(self) -> bool:
        """Whether the remainder bins are left out."""
        return self._dealer.drop_last

    @property
    def pad_to_multiple_of(self) -> int:
        """The multiple costs round each sequence up to."""
        return self._dealer.pad_to_multiple_of

    @property
    def split_sequences(self) -> bool:
        """Whether sequences may be cut to give every rank the same number of batches."""
        return self._dealer.split_sequences

    @property
    def hidden_size(self) -> int | None:
        """The model's hidden size, for the FLOPs cost."""
        return self._dealer.hidden_size

    @property
    def epoch_tokens(self) -> int:
        """Real tokens every epoch's deal holds: the packing's, less what ``drop_last``
        leaves out (the same every epoch: epochs only deal the same bins differently)."""
        return self._dealer.epoch_tokens

    def deal(self, epoch: int) -> EpochDeal:
        """The deal of ``epoch``."""
        return EpochDeal(self._dealer.deal(as_int(epoch, "epoch")))

    def deal_after(self, epoch: int, runs: Iterable[tuple[int, int]]) -> EpochDeal:
        """The deal that finishes ``epoch`` on this dealer's ``num_replicas`` after ``runs``
        of it on other world sizes, for a job resized mid-epoch.

        ``runs[i] = (num_replicas, steps)``: run ``i`` ran ``steps`` steps on
        ``num_replicas`` ranks. The first run's deal is the ordinary deal of ``epoch`` for
        its world size; the bins each run left are dealt again to the next world size (cut
        between their sequences when their number does not divide, as for any deal), so
        every sequence of the epoch is still used exactly once. With no runs this is
        :meth:`deal`.

        Raises:
            InvalidValueError: a run has more steps than its deal, or too few sequences are
                left to give every rank of the next world size a batch.
        """
        return EpochDeal(
            self._dealer.deal_after(as_int(epoch, "epoch"), [_run(run) for run in _pairs(runs)])
        )

    def __repr__(self) -> str:
        balance = "None" if self.balance is None else repr(self.balance)
        return (
            f"Dealer(num_replicas={self.num_replicas}, seed={self.seed}, "
            f"shuffle={self.shuffle}, balance={balance})"
        )


def _pairs(runs: object) -> list[Any]:
    if isinstance(runs, (str, bytes)) or not isinstance(runs, Iterable):
        raise InvalidTypeError("runs must be a sequence of (num_replicas, steps) pairs")
    return list(runs)


def _run(run: object) -> tuple[int, int]:
    if isinstance(run, (str, bytes)) or not isinstance(run, Iterable):
        raise InvalidTypeError("runs must hold (num_replicas, steps) pairs")
    pair = list(run)
    if len(pair) != 2:
        raise InvalidTypeError("runs must hold (num_replicas, steps) pairs")
    return as_int(pair[0], "num_replicas of a run"), as_int(pair[1], "steps of a run")


class EpochDeal:
    """One epoch of data-parallel micro-batches: ``steps[s, r]`` is the bin rank ``r`` runs
    at step ``s``; bin ``b`` holds segments ``bin_offsets[b]:bin_offsets[b + 1]`` of
    ``indices`` / ``starts`` / ``lengths`` (read-only views, no copies).

    Every rank runs :attr:`n_steps` bins; every segment of the packing appears in exactly
    one of them, except the bins ``drop_last`` left out (see :meth:`stats`). Made by
    :meth:`Dealer.deal` and :func:`deal_epoch`.
    """

    def __init__(self, deal: _core.EpochDeal) -> None:
        self._deal = deal

    @property
    def steps(self) -> _I64:
        """The ``(n_steps, num_replicas)`` table of bins."""
        return self._deal.steps

    @property
    def bin_offsets(self) -> _I64:
        """``n_bins + 1`` offsets into the segment arrays."""
        return self._deal.bin_offsets

    @property
    def indices(self) -> _I64:
        """Input sequence of each segment."""
        return self._deal.indices

    @property
    def starts(self) -> _I64:
        """Token offset of each segment inside its sequence."""
        return self._deal.starts

    @property
    def lengths(self) -> _I64:
        """Tokens of each segment."""
        return self._deal.lengths

    @property
    def epoch(self) -> int:
        """The epoch this deal is for."""
        return self._deal.epoch

    @property
    def num_replicas(self) -> int:
        """Number of ranks."""
        return self._deal.num_replicas

    @property
    def n_steps(self) -> int:
        """Micro-batches every rank runs this epoch."""
        return self._deal.n_steps

    def __len__(self) -> int:
        return self._deal.n_steps

    def rank_bins(self, rank: int) -> _I64:
        """Bins of ``rank``, in step order (a read-only view of a column of :attr:`steps`)."""
        return self._deal.rank_bins(as_int(rank, "rank"))

    def batches(self, rank: int, start: int = 0, *, segments: bool = False) -> Iterator[Any]:
        """Iterate over the batches of ``rank`` from step ``start`` on.

        A batch is a list of sequence indices, or with ``segments=True`` a list of
        ``(index, start, length)`` tuples (needed when sequences were split or truncated).
        Skipping ahead costs nothing: the deal is a table, not a stream.
        """
        return self._deal.batches(
            as_int(rank, "rank"), as_int(start, "start"), as_bool(segments, "segments")
        )

    def rest(self, step: int) -> Packing:
        """The bins no rank has run before step ``step``, as a packing of their own.

        Deal it to another number of ranks (:func:`deal_epoch`, :class:`Dealer`) to finish
        the epoch on a resized job: the bins keep their segments, so every sequence of the
        epoch is still used exactly once. Bins are listed in step order, ranks in order
        within a step; the packing keeps this deal's ``max_tokens``, ``n_seqs`` and kind,
        and the counts of sequences the original packing dropped, truncated or split; its
        ``lower_bound`` and ``input_tokens`` are those of the bins it holds.
        """
        return self._deal.rest(as_int(step, "step"))

    def step_costs(self, kind: CostKind = "tokens") -> npt.NDArray[np.float64]:
        """Cost of every bin of the table, shape ``(n_steps, num_replicas)``: tokens
        (padding included), attention (sum of squared padded lengths) or flops (tokens plus
        attention / (12 hidden_size): matmul and attention FLOPs in units of one token's
        matmul FLOPs; needs ``hidden_size``)."""
        return self._deal.step_costs(as_str(kind, "kind"))

    def real_tokens(self) -> _I64:
        """Real (non-padding) tokens of every bin of the table, shape
        ``(n_steps, num_replicas)``."""
        return self._deal.real_tokens()

    def stats(self) -> dict[str, int | float]:
        """Counts and balance of this epoch.

        ``*_imbalance_max`` / ``*_imbalance_mean`` are the worst and average over steps of
        ``max / mean`` cost across ranks; ``*_sync_overhead`` is ``sum of per-step maxima /
        sum of per-step means``: how much longer lockstep ranks take than perfectly
        balanced ones, by that cost model (1.0 is perfect). ``tokens`` counts what the
        linear layers process (padding included), ``attention`` the sum of squared spans.
        """
        return self._deal.stats()

    def __repr__(self) -> str:
        return (
            f"EpochDeal(epoch={self.epoch}, num_replicas={self.num_replicas}, "
            f"n_steps={self.n_steps})"
        )


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
