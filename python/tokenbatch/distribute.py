"""Epoch plans for data-parallel training: which rank runs which bin at which step.

A plan turns a :class:`~tokenbatch.Packing` into a table of ``n_steps x num_replicas``
bins, so that every rank runs the same number of micro-batches, every placed sequence is
used exactly once, and the bins that run side by side in one step cost about the same.
Everything is computed from ``(packing, seed, epoch)`` alone, with vectorized numpy, so
every rank builds the identical plan without communicating.

This module does not import torch; :mod:`tokenbatch.torch` builds its batch sampler on it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from tokenbatch._convert import as_int, as_seed
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.packing import Packing

__all__ = ["Balance", "EpochPlan", "Segment", "mix_seed", "plan_epoch"]

Balance = Literal["attention", "tokens", "flops"] | None
#: A piece of a sequence: ``(index, start, length)``, tokens ``start:start + length``.
Segment = tuple[int, int, int]

_I64 = npt.NDArray[np.int64]
_F64 = npt.NDArray[np.float64]
_U64 = npt.NDArray[np.uint64]

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E37_79B9_7F4A_7C15
_MIX1 = 0xBF58_476D_1CE4_E5B9
_MIX2 = 0x94D0_49BB_1331_11EB
_MIX_SEED_START = 0x5EED_0F70_4B3B_A7C4
# Domains of the random streams of one epoch, so that they are unrelated to each other.
_STREAM_TIES = 1
_STREAM_STEPS = 2
_STREAM_RANKS = 3


def _splitmix(state: int) -> int:
    """Output of SplitMix64 whose state *before* the call is ``state``."""
    z = (state + _GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def mix_seed(*parts: int) -> int:
    """Mix integers into one 64-bit seed, as the Rust core's ``rng::mix_seed`` does.

    ``mix_seed(seed, epoch)`` gives unrelated streams for neighbouring epochs and is the
    same on every machine.
    """
    acc = _splitmix(_MIX_SEED_START)
    for part in parts:
        acc = _splitmix(acc ^ (part & _MASK64))
    return acc


def _random_keys(seed: int, n: int) -> _U64:
    """The first ``n`` outputs of SplitMix64 seeded with ``seed``, computed all at once."""
    with np.errstate(over="ignore"):
        z = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_GAMMA) + np.uint64(seed)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        keys: _U64 = z ^ (z >> np.uint64(31))
        return keys


def _permutation(seed: int, n: int) -> _I64:
    return np.argsort(_random_keys(seed, n), kind="stable").astype(np.int64, copy=False)


class _Layout:
    """The epoch-independent part of a plan: bins after splitting (or dropping) so that
    their count divides by ``num_replicas``, their costs, and their order by cost."""

    __slots__ = (
        "attention",
        "bin_ids",
        "bin_offsets",
        "by_cost",
        "cost_groups",
        "dropped_bins",
        "dropped_seqs",
        "dropped_tokens",
        "flops_scale",
        "indices",
        "lengths",
        "split_bins",
        "split_seqs",
        "starts",
        "tokens",
    )

    def __init__(
        self,
        packing: Packing,
        num_replicas: int,
        *,
        drop_last: bool,
        pad_to_multiple_of: int,
        balance: Balance,
        split_sequences: bool = False,
        hidden_size: int | None = None,
    ) -> None:
        # A transformer layer spends 6 x 12 h^2 FLOPs per token in its matmuls (forward
        # and backward) and 6 h L^2 on causal attention over a sequence of L tokens, so in
        # units of one token's matmul FLOPs a sequence costs L + L^2 / (12 h).
        self.flops_scale = None if hidden_size is None else 1.0 / (12.0 * hidden_size)
        offsets = packing.bin_offsets
        lengths = packing.lengths
        self.indices, self.starts, self.lengths = packing.indices, packing.starts, lengths
        self.split_seqs = 0
        costs = _SegmentCosts(lengths, packing.kind, pad_to_multiple_of)
        tokens, attention = costs.of_bins(offsets)
        n_bins = len(offsets) - 1
        remainder = n_bins % num_replicas
        self.split_bins = 0
        self.dropped_bins = 0
        self.dropped_seqs = 0
        self.dropped_tokens = 0
        bin_ids = np.arange(n_bins, dtype=np.int64)
        if remainder and drop_last:
            # Leave out the least-filled bins: the fewest tokens lost.
            real = _real_tokens(offsets, lengths)
            by_fill = np.lexsort((-bin_ids, real))
            dropped = np.sort(by_fill[:remainder])
            bin_ids = np.delete(bin_ids, dropped)
            counts = np.diff(offsets)
            self.dropped_bins = remainder
            self.dropped_seqs = int(counts[dropped].sum())
            self.dropped_tokens = int(real[dropped].sum())
        elif remainder:
            needed = num_replicas - remainder
            shortfall = needed - int((np.diff(offsets) - 1).sum())
            if shortfall > 0 and split_sequences:
                offsets = self._split_sequences(offsets, shortfall)
                lengths = self.lengths
                costs = _SegmentCosts(lengths, packing.kind, pad_to_multiple_of)
                tokens, attention = costs.of_bins(offsets)
            key = self.cost(balance or "tokens", tokens, attention)
            offsets = _split_bins(offsets, lengths, key, needed, num_replicas)
            tokens, attention = costs.of_bins(offsets)
            bin_ids = np.arange(len(offsets) - 1, dtype=np.int64)
            self.split_bins = needed
        self.bin_offsets = offsets
        self.bin_ids = bin_ids
        self.tokens = tokens
        self.attention = attention
        # Bins by decreasing cost, once; epochs only shuffle inside groups of equal cost.
        if balance is None:
            self.by_cost = bin_ids
            self.cost_groups = np.zeros(len(bin_ids), dtype=np.uint64)
        else:
            cost: npt.NDArray[Any]
            if balance == "flops":
                cost = self.cost("flops", tokens[bin_ids], attention[bin_ids])
                sorted_ids = np.argsort(-cost, kind="stable")
            else:
                # Exact integer costs: ~x on uint64 sorts in decreasing order.
                cost = attention[bin_ids] if balance == "attention" else tokens[bin_ids]
                cost = cost.view(np.uint64)
                sorted_ids = np.argsort(~cost, kind="stable")
            self.by_cost = bin_ids[sorted_ids]
            sorted_cost = cost[sorted_ids]
            changes = np.empty(len(sorted_cost), dtype=np.uint64)
            if len(sorted_cost):
                changes[0] = 0
                np.not_equal(sorted_cost[1:], sorted_cost[:-1], out=changes[1:])
            self.cost_groups = np.cumsum(changes, dtype=np.uint64)

    def cost(self, kind: str, tokens: _I64, attention: _U64) -> _F64:
        """Bins' cost by ``kind`` (``"tokens"``, ``"attention"`` or ``"flops"``)."""
        if kind == "tokens":
            return tokens.astype(np.float64)
        if kind == "attention":
            return attention.astype(np.float64)
        if self.flops_scale is None:
            raise InvalidValueError("the flops cost needs hidden_size (the model's hidden size)")
        flops: _F64 = tokens + attention.astype(np.float64) * self.flops_scale
        return flops

    def _split_sequences(self, offsets: _I64, count: int) -> _I64:
        """Cut the longest segments into ``count`` more pieces in all (pieces stay in their
        bin), so that cutting bins between segments can then make enough bins."""
        lengths = self.lengths
        candidates = np.flatnonzero(lengths >= 2)
        if int((lengths[candidates] - 1).sum()) < count:
            return offsets  # too few tokens: _split_bins explains
        if len(candidates) > count:
            top = np.argpartition(-lengths[candidates], count - 1)[:count]
            candidates = np.sort(candidates[top])
        pieces = _share_cuts(lengths, lengths, candidates, count)
        repeats = np.ones(len(lengths), dtype=np.int64)
        repeats[candidates] = [pieces[c] for c in candidates.tolist()]
        prefix = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(repeats, out=prefix[1:])
        piece = np.arange(prefix[-1], dtype=np.int64) - np.repeat(prefix[:-1], repeats)
        total = np.repeat(lengths, repeats)
        n_pieces = np.repeat(repeats, repeats)
        base, extra = total // n_pieces, total % n_pieces
        self.lengths = base + (piece < extra)
        self.starts = np.repeat(self.starts, repeats) + piece * base + np.minimum(piece, extra)
        self.indices = np.repeat(self.indices, repeats)
        self.split_seqs = sum(1 for n in pieces.values() if n > 1)
        return prefix[offsets]


class _SegmentCosts:
    """Per-segment costs, computed once and summed per bin for any bin boundaries."""

    __slots__ = ("kind", "padded", "squares")

    def __init__(self, lengths: _I64, kind: str, pad_to_multiple_of: int) -> None:
        multiple = pad_to_multiple_of
        self.kind = kind
        self.padded = lengths if multiple == 1 else -(-lengths // multiple) * multiple
        # Squares of lengths below 2**32 are exact in uint64, and so are their sums within
        # one bin (at most max_tokens**2 < 2**64).
        self.squares = (lengths * lengths).view(np.uint64) if kind != "padded" else None

    def of_bins(self, offsets: _I64) -> tuple[_I64, _U64]:
        """``(tokens, attention)`` of each bin.

        ``tokens`` is what the linear layers process (padding included), ``attention``
        the sum of squared attention spans, which is what attention kernels spend their
        time on (for a padded batch: count x longest squared).
        """
        n_bins = max(len(offsets) - 1, 0)
        if n_bins == 0 or len(self.padded) == 0:
            return np.zeros(n_bins, dtype=np.int64), np.zeros(n_bins, dtype=np.uint64)
        starts = offsets[:-1]
        if self.squares is None:
            counts = np.diff(offsets)
            longest = np.maximum.reduceat(self.padded, starts)
            tokens = counts * longest
            attention = tokens.view(np.uint64) * longest.view(np.uint64)
        else:
            tokens = np.add.reduceat(self.padded, starts)
            attention = np.add.reduceat(self.squares, starts)
        return tokens.astype(np.int64, copy=False), attention


def _real_tokens(offsets: _I64, lengths: _I64) -> _I64:
    if len(offsets) < 2 or len(lengths) == 0:
        return np.zeros(max(len(offsets) - 1, 0), dtype=np.int64)
    return np.add.reduceat(lengths, offsets[:-1]).astype(np.int64, copy=False)


def _split_bins(offsets: _I64, lengths: _I64, cost: _F64, needed: int, num_replicas: int) -> _I64:
    """Add ``needed`` bins by cutting bins between their segments (the costliest first).

    Pieces of a bin are runs of its segments, so every piece stays within the budget and
    no segment moves: only new offsets are inserted. Greedy: each new bin goes to the bin
    whose pieces are currently the costliest; that bin is always one of the ``needed``
    costliest splittable bins, so only those are considered.
    """
    counts = np.diff(offsets)
    splittable = np.flatnonzero(counts > 1)
    capacity = int((counts[splittable] - 1).sum())
    if capacity < needed:
        n_bins = len(counts)
        raise InvalidValueError(
            f"cannot give each of num_replicas={num_replicas} ranks the same number of "
            f"batches: the packing has {n_bins} bins holding {int(counts.sum())} sequences, "
            f"and {n_bins + needed} non-empty bins would be needed; pass drop_last=True to "
            "leave the remainder out, use a smaller max_tokens or fewer replicas"
        )
    if len(splittable) > needed:
        top = np.argpartition(-cost[splittable], needed - 1)[:needed]
        candidates = splittable[np.sort(top)]
    else:
        candidates = splittable
    pieces = _share_cuts(cost, counts, candidates, needed)
    cuts: list[int] = []
    for b, n_pieces in pieces.items():
        if n_pieces > 1:
            cuts.extend(_cut_points(lengths, int(offsets[b]), int(offsets[b + 1]), n_pieces))
    new_offsets = np.sort(np.asarray(cuts, dtype=np.int64))
    return np.insert(offsets, np.searchsorted(offsets, new_offsets), new_offsets)


def _cut_points(lengths: _I64, lo: int, hi: int, n_pieces: int) -> list[int]:
    """Offsets strictly inside ``(lo, hi)`` that cut a bin into ``n_pieces`` runs of
    about equal tokens, each holding at least one segment."""
    cumulative = np.cumsum(lengths[lo:hi])
    total = int(cumulative[-1]) if len(cumulative) else 0
    count = hi - lo
    cuts: list[int] = []
    previous = 0
    for piece in range(1, n_pieces):
        target = total * piece / n_pieces
        cut = int(np.searchsorted(cumulative, target, side="left")) + 1
        cut = max(cut, previous + 1)
        cut = min(cut, count - (n_pieces - piece))
        cuts.append(lo + cut)
        previous = cut
    return cuts


class EpochPlan:
    """One epoch of data-parallel micro-batches: ``steps[s, r]`` is the bin rank ``r``
    runs at step ``s``; bin ``b`` holds segments ``bin_offsets[b]:bin_offsets[b + 1]`` of
    ``indices`` / ``starts`` / ``lengths``.

    Every rank runs :attr:`n_steps` bins; every segment of the packing appears in exactly
    one of them, except the bins ``drop_last`` left out (see :meth:`stats`).
    """

    __slots__ = (
        "_layout",
        "_packing",
        "bin_offsets",
        "epoch",
        "indices",
        "lengths",
        "num_replicas",
        "starts",
        "steps",
    )

    steps: _I64
    bin_offsets: _I64
    indices: _I64
    starts: _I64
    lengths: _I64
    epoch: int
    num_replicas: int

    def __init__(
        self, packing: Packing, layout: _Layout, steps: _I64, *, epoch: int, num_replicas: int
    ) -> None:
        self._packing = packing
        self._layout = layout
        steps.flags.writeable = False
        self.steps = steps
        self.bin_offsets = layout.bin_offsets
        self.indices = layout.indices
        self.starts = layout.starts
        self.lengths = layout.lengths
        self.epoch = epoch
        self.num_replicas = num_replicas

    @property
    def n_steps(self) -> int:
        """Micro-batches every rank runs this epoch."""
        return int(self.steps.shape[0])

    def __len__(self) -> int:
        return self.n_steps

    def rank_bins(self, rank: int) -> _I64:
        """Bins of ``rank``, in step order."""
        return self.steps[:, self._rank(rank)]

    def batches(self, rank: int, start: int = 0, *, segments: bool = False) -> Iterator[Any]:
        """Yield the batches of ``rank`` from step ``start`` on.

        A batch is a list of sequence indices, or with ``segments=True`` a list of
        ``(index, start, length)`` tuples (needed when sequences were split or truncated).
        Skipping ahead costs nothing: the plan is a table, not a stream.
        """
        rank = self._rank(rank)
        start = as_int(start, "start", minimum=0)
        bins = self.steps[start:, rank].tolist()
        offsets = self.bin_offsets
        indices = self.indices
        if segments:
            starts, lengths = self.starts, self.lengths
            for b in bins:
                lo, hi = offsets[b], offsets[b + 1]
                yield list(
                    zip(
                        indices[lo:hi].tolist(),
                        starts[lo:hi].tolist(),
                        lengths[lo:hi].tolist(),
                        strict=True,
                    )
                )
        else:
            for b in bins:
                yield indices[offsets[b] : offsets[b + 1]].tolist()

    def rest(self, step: int) -> Packing:
        """The bins no rank has run before step ``step``, as a packing of their own.

        Plan it for another number of ranks (:func:`plan_epoch`, :class:`Planner`) to
        finish the epoch on a resized job: the bins keep their segments, so every sequence
        of the epoch is still used exactly once. Bins are listed in step order, ranks in
        order within a step; the packing keeps this plan's ``max_tokens``, ``n_seqs`` and
        kind, and the counts of sequences the original packing dropped, truncated or
        split; its ``lower_bound`` and ``input_tokens`` are those of the bins it holds.
        """
        step = as_int(step, "step", minimum=0)
        if step > self.n_steps:
            raise InvalidValueError(f"step={step} is beyond the {self.n_steps} steps of the plan")
        bins = self.steps[step:].reshape(-1)
        counts = np.diff(self.bin_offsets)[bins]
        offsets = np.zeros(len(bins) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        # Segment j of the rest is segment j - offsets[k] + bin_offsets[bins[k]] of this
        # plan, for the bin k it falls in.
        source = np.arange(int(offsets[-1]), dtype=np.int64)
        source += np.repeat(self.bin_offsets[bins] - offsets[:-1], counts)
        packing = self._packing
        lengths = self.lengths[source]
        cost = self._layout.tokens[bins].astype(np.int64)
        summary = {
            **packing._counts,
            "lower_bound": -(-int(cost.sum()) // packing.max_tokens),
            "input_tokens": int(lengths.sum()),
        }
        return Packing(
            (offsets, self.indices[source], self.starts[source], lengths, cost, summary),
            max_tokens=packing.max_tokens,
            n_seqs=packing.n_seqs,
            kind=packing.kind,
        )

    def _rank(self, rank: int) -> int:
        value = as_int(rank, "rank", minimum=0)
        if value >= self.num_replicas:
            raise InvalidValueError(
                f"rank must be smaller than num_replicas={self.num_replicas}, got {value}"
            )
        return value

    def step_costs(self, kind: Literal["tokens", "attention", "flops"] = "tokens") -> _F64:
        """Cost of every bin of the table, shape ``(n_steps, num_replicas)``: tokens
        (padding included), attention (sum of squared lengths) or flops (tokens plus
        attention / (12 hidden_size): matmul and attention FLOPs in units of one token's
        matmul FLOPs; needs ``hidden_size``)."""
        if kind not in ("tokens", "attention", "flops"):
            raise InvalidValueError(f"kind must be 'tokens', 'attention' or 'flops', got {kind!r}")
        layout = self._layout
        bins = self.steps
        return layout.cost(kind, layout.tokens[bins], layout.attention[bins])

    def stats(self) -> dict[str, int | float]:
        """Counts and balance of this epoch.

        ``*_imbalance_max`` / ``*_imbalance_mean`` are the worst and average over steps of
        ``max / mean`` cost across ranks; ``*_sync_overhead`` is ``sum of per-step maxima /
        sum of per-step means``: how much longer lockstep ranks take than perfectly
        balanced ones, by that cost model (1.0 is perfect). ``tokens`` counts what the
        linear layers process (padding included), ``attention`` the sum of squared spans.
        """
        layout = self._layout
        packing = self._packing
        used = self.steps.reshape(-1)
        real = _real_tokens(self.bin_offsets, self.lengths)[used]
        compute = layout.tokens[used]
        total_real = int(real.sum())
        total_compute = int(compute.sum())
        counts = np.diff(self.bin_offsets)[used]
        result: dict[str, int | float] = {
            "epoch": self.epoch,
            "num_replicas": self.num_replicas,
            "n_steps": self.n_steps,
            "n_bins": int(used.size),
            "n_seqs": packing.n_seqs,
            "n_segments": int(counts.sum()),
            "max_tokens": packing.max_tokens,
            "total_tokens": total_real,
            "padding_tokens": total_compute - total_real,
            "padding_ratio": 0.0 if total_compute == 0 else 1.0 - total_real / total_compute,
            "efficiency": 1.0
            if used.size == 0
            else total_real / (int(used.size) * packing.max_tokens),
            "split_bins": layout.split_bins,
            "split_seqs": layout.split_seqs,
            "dropped_bins": layout.dropped_bins,
            "drop_last_seqs": layout.dropped_seqs,
            "drop_last_tokens": layout.dropped_tokens,
            "dropped_seqs": layout.dropped_seqs + int(packing.stats()["dropped_seqs"]),
        }
        kinds: tuple[Literal["tokens", "attention", "flops"], ...] = ("tokens", "attention")
        if layout.flops_scale is not None:
            kinds = (*kinds, "flops")
        for kind in kinds:
            result.update(_imbalance(self.step_costs(kind), kind))
        return result

    def __repr__(self) -> str:
        return (
            f"EpochPlan(epoch={self.epoch}, num_replicas={self.num_replicas}, "
            f"n_steps={self.n_steps})"
        )


def _imbalance(table: _F64, kind: str) -> dict[str, float]:
    if table.size == 0:
        return {
            f"{kind}_imbalance_max": 1.0,
            f"{kind}_imbalance_mean": 1.0,
            f"{kind}_sync_overhead": 1.0,
        }
    highest = table.max(axis=1)
    mean = table.mean(axis=1)
    ratio = np.divide(highest, mean, out=np.ones_like(mean), where=mean > 0)
    total_mean = float(mean.sum())
    return {
        f"{kind}_imbalance_max": float(ratio.max()),
        f"{kind}_imbalance_mean": float(ratio.mean()),
        f"{kind}_sync_overhead": 1.0 if total_mean == 0 else float(highest.sum()) / total_mean,
    }


def _deal(layout: _Layout, num_replicas: int, seed: int, shuffle: bool, balance: Balance) -> _I64:
    """Arrange the bins of ``layout`` into a ``(n_steps, num_replicas)`` table."""
    n = len(layout.by_cost)
    if not shuffle:
        order = layout.by_cost
    elif balance is None:
        order = layout.by_cost[_permutation(mix_seed(seed, _STREAM_TIES), n)]
    else:
        # Bins of equal cost are ordered at random, so that the grouping of bins into
        # steps still changes between epochs: one sort of (cost group, random bits).
        noise = _random_keys(mix_seed(seed, _STREAM_TIES), n) >> np.uint64(32)
        key = (layout.cost_groups << np.uint64(32)) | noise
        order = layout.by_cost[np.argsort(key, kind="stable")]
    steps = order.reshape(-1, num_replicas)
    if shuffle and len(steps):
        steps = steps[_permutation(mix_seed(seed, _STREAM_STEPS), len(steps))]
        keys = _random_keys(mix_seed(seed, _STREAM_RANKS), steps.size).reshape(steps.shape)
        steps = np.take_along_axis(steps, np.argsort(keys, axis=1, kind="stable"), axis=1)
    return np.ascontiguousarray(steps, dtype=np.int64)


class Planner:
    """Builds :class:`EpochPlan` objects for one packing, reusing the epoch-independent
    work (splitting, costs) across epochs."""

    __slots__ = ("_layout", "balance", "num_replicas", "packing", "seed", "shuffle")

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
            raise InvalidTypeError(f"packing must be a tokenbatch.Packing, got {packing!r}")
        self.packing = packing
        self.num_replicas = as_int(num_replicas, "num_replicas", minimum=1)
        self.seed = as_seed(seed)
        self.shuffle = _as_bool(shuffle, "shuffle")
        self.balance = _as_balance(balance)
        if hidden_size is not None:
            hidden_size = as_int(hidden_size, "hidden_size", minimum=1)
        elif self.balance == "flops":
            raise InvalidValueError(
                "balance='flops' needs hidden_size, the model's hidden size (it sets how "
                "much attention costs against the matmuls)"
            )
        self._layout = _Layout(
            packing,
            self.num_replicas,
            drop_last=_as_bool(drop_last, "drop_last"),
            pad_to_multiple_of=as_int(pad_to_multiple_of, "pad_to_multiple_of", minimum=1),
            balance=self.balance,
            split_sequences=_as_bool(split_sequences, "split_sequences"),
            hidden_size=hidden_size,
        )

    def plan(self, epoch: int) -> EpochPlan:
        """The plan of ``epoch``."""
        epoch = as_int(epoch, "epoch", minimum=0)
        epoch_seed = mix_seed(self.seed, epoch)
        steps = _deal(self._layout, self.num_replicas, epoch_seed, self.shuffle, self.balance)
        return EpochPlan(
            self.packing, self._layout, steps, epoch=epoch, num_replicas=self.num_replicas
        )


def plan_epoch(
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
) -> EpochPlan:
    """Distribute the bins of ``packing`` over ``num_replicas`` data-parallel ranks.

    Args:
        packing: a result of :func:`tokenbatch.pack` or :func:`tokenbatch.batch_padded`.
        num_replicas: number of data-parallel ranks.
        epoch: with ``seed``, selects the random order of this epoch.
        seed: the same on every rank; plans are identical for equal arguments.
        shuffle: shuffle the order of steps and which rank runs which bin of a step;
            ``False`` keeps the deterministic order (costliest steps first when balancing).
        balance: ``"attention"`` groups bins of similar attention cost (sum of squared
            sequence lengths) into the same step, ``"tokens"`` bins of similar token
            count, ``"flops"`` bins of similar total FLOPs (tokens plus
            attention / (12 hidden_size), needs ``hidden_size``); ``None`` deals bins in
            (shuffled) packing order.
        drop_last: when the number of bins does not divide by ``num_replicas``, leave out
            the least-filled remainder bins instead of splitting bins.
        pad_to_multiple_of: the value the packing was built with (for costs).
        split_sequences: when cutting bins between their sequences cannot make enough
            bins, cut the longest sequences in two first (the batches then hold
            ``(index, start, length)`` segments, as with ``oversize="split"``).
        hidden_size: the model's hidden size, for the ``"flops"`` cost (and its
            imbalance in :meth:`EpochPlan.stats`).

    Without ``drop_last``, bins are cut between their sequences (the costliest first)
    until their number divides by ``num_replicas``; no sequence is lost or repeated.

    Raises:
        InvalidValueError: there are too few sequences to give every rank the same number
            of non-empty batches (pass ``drop_last=True``), or an invalid option.
    """
    planner = Planner(
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
    return planner.plan(epoch)


def _as_bool(value: object, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidTypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def _as_balance(value: object) -> Balance:
    if value is None:
        return None
    if value == "attention" or value == "tokens" or value == "flops":
        return value
    raise InvalidValueError(
        f"balance must be 'attention', 'tokens', 'flops' or None, got {value!r}"
    )


def _share_cuts(weight: Any, limit: Any, candidates: Any, cuts: int) -> dict[int, int]:
    """Pieces of each candidate after ``cuts`` cuts, each cut going to the candidate with
    the largest weight per piece (candidate ``c`` has at most ``limit[c]`` pieces)."""
    pieces = dict.fromkeys(candidates.tolist(), 1)
    heap = [(-float(weight[c]), c) for c in candidates.tolist()]
    heapq.heapify(heap)
    for _ in range(cuts):
        _, c = heapq.heappop(heap)
        pieces[c] += 1
        if pieces[c] < int(limit[c]):
            heapq.heappush(heap, (-float(weight[c]) / pieces[c], c))
    return pieces
