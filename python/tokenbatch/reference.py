"""Pure-Python reference implementations of tokenbatch's packing algorithms.

They define the exact semantics the Rust engine must reproduce (the test suite compares
the two array for array) and serve as the baselines in ``benches/``. They are written for
clarity and are careful but slow: use :func:`tokenbatch.pack` for real work.

Semantics shared with :func:`tokenbatch.pack`:

* oversize policies turn sequences into segments (whole, truncated, split or dropped);
* each segment costs its length rounded up to ``pad_to_multiple_of``;
* ``bfd``/``ffd`` offer segments by decreasing cost, ties by segment order; best fit
  takes the bin with the least remaining room that fits, the one that reached that
  room last on ties; first fit takes the lowest-numbered bin that fits;
* bins are numbered in the order they are opened; inside a bin, segments are listed in
  input order.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenbatch.errors import InvalidValueError, OversizeError

__all__ = ["ReferencePacking", "SplitMix64", "mix_seed", "reference_batch_padded", "reference_pack"]

_MASK = (1 << 64) - 1


class SplitMix64:
    """The generator of ``rust/core/src/rng.rs``, bit for bit."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, bound: int) -> int:
        return (self.next_u64() * bound) >> 64

    def shuffle(self, items: list[int]) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]


def mix_seed(parts: Sequence[int]) -> int:
    """Combine integers into one seed, as the Rust core does."""
    rng = SplitMix64(0x5EED0F704B3BA7C4)
    acc = rng.next_u64()
    for part in parts:
        acc = SplitMix64(acc ^ (part & _MASK)).next_u64()
    return acc


@dataclass
class ReferencePacking:
    """The CSR arrays as plain lists, plus the policy counts."""

    bin_offsets: list[int]
    indices: list[int]
    starts: list[int]
    lengths: list[int]
    bin_tokens: list[int]
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Segment:
    index: int
    start: int
    length: int


def _cost(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def _segments(
    lengths: Sequence[int], max_tokens: int, multiple: int, oversize: str
) -> tuple[list[_Segment], dict[str, int]]:
    capacity = max_tokens // multiple * multiple
    counts = dict.fromkeys(
        ["dropped_seqs", "dropped_tokens", "truncated_seqs", "truncated_tokens", "split_seqs"], 0
    )
    counts["split_pieces"] = 0
    segments: list[_Segment] = []
    for index, length in enumerate(lengths):
        if length < 0:
            raise InvalidValueError(f"lengths[{index}] = {length} is negative")
        if length <= capacity:
            segments.append(_Segment(index, 0, length))
        elif oversize == "error":
            raise OversizeError(f"sequence {index} has {length} tokens")
        elif oversize == "truncate":
            counts["truncated_seqs"] += 1
            counts["truncated_tokens"] += length - capacity
            segments.append(_Segment(index, 0, capacity))
        elif oversize == "drop":
            counts["dropped_seqs"] += 1
            counts["dropped_tokens"] += length
        else:
            counts["split_seqs"] += 1
            for start in range(0, length, capacity):
                segments.append(_Segment(index, start, min(capacity, length - start)))
                counts["split_pieces"] += 1
    return segments, counts


def _best_fit(costs: list[int], max_tokens: int, max_seqs: int) -> list[int]:
    """Best fit over ``costs`` in the given order: sorted remaining capacities + bisect,
    with a stack of bins per capacity value."""
    capacities: list[int] = []  # sorted distinct remaining capacities with open bins
    stacks: dict[int, list[tuple[int, int]]] = {}  # capacity -> [(bin, count), ...]
    bin_of: list[int] = []
    n_bins = 0
    for cost in costs:
        where = bisect.bisect_left(capacities, cost)
        if where == len(capacities):
            remaining, (bin_id, count) = max_tokens, (n_bins, 0)
            n_bins += 1
        else:
            remaining = capacities[where]
            stack = stacks[remaining]
            bin_id, count = stack.pop()
            if not stack:
                del stacks[remaining]
                capacities.pop(where)
        count += 1
        if count < max_seqs:
            left = remaining - cost
            if left not in stacks:
                stacks[left] = []
                bisect.insort(capacities, left)
            stacks[left].append((bin_id, count))
        bin_of.append(bin_id)
    return bin_of


def _first_fit(costs: list[int], max_tokens: int, max_seqs: int) -> list[int]:
    remaining: list[int] = []
    counts: list[int] = []
    bin_of: list[int] = []
    for cost in costs:
        for bin_id, room in enumerate(remaining):
            if room >= cost and counts[bin_id] < max_seqs:
                break
        else:
            bin_id = len(remaining)
            remaining.append(max_tokens)
            counts.append(0)
        remaining[bin_id] -= cost
        counts[bin_id] += 1
        bin_of.append(bin_id)
    return bin_of


def _next_fit(costs: list[int], max_tokens: int, max_seqs: int) -> list[int]:
    bin_of: list[int] = []
    bin_id, room, count = -1, 0, max_seqs
    for cost in costs:
        if bin_id < 0 or cost > room or count >= max_seqs:
            bin_id, room, count = bin_id + 1, max_tokens, 0
        room -= cost
        count += 1
        bin_of.append(bin_id)
    return bin_of


def _padded(costs: list[int], max_tokens: int, max_seqs: int) -> tuple[list[int], list[int]]:
    bin_of: list[int] = []
    batch_cost: list[int] = []
    longest = count = 0
    for cost in costs:
        grown = max(longest, cost)
        if batch_cost and count < max_seqs and (count + 1) * grown <= max_tokens:
            longest, count = grown, count + 1
        else:
            batch_cost.append(0)
            longest, count = cost, 1
        batch_cost[-1] = count * longest
        bin_of.append(len(batch_cost) - 1)
    return bin_of, batch_cost


def _layout(
    segments: list[_Segment],
    segment_bin: list[int],
    multiple: int,
    counts: dict[str, int],
    padded_cost: list[int] | None,
) -> ReferencePacking:
    n_bins = max(segment_bin, default=-1) + 1
    members: list[list[_Segment]] = [[] for _ in range(n_bins)]
    for segment, bin_id in zip(segments, segment_bin, strict=True):
        members[bin_id].append(segment)  # segments are in input order
    offsets = [0]
    flat = [segment for bin_members in members for segment in bin_members]
    for bin_members in members:
        offsets.append(offsets[-1] + len(bin_members))
    tokens = [sum(_cost(s.length, multiple) for s in bin_members) for bin_members in members]
    return ReferencePacking(
        bin_offsets=offsets,
        indices=[s.index for s in flat],
        starts=[s.start for s in flat],
        lengths=[s.length for s in flat],
        bin_tokens=padded_cost if padded_cost is not None else tokens,
        counts=counts,
    )


def _offer_order(segments: list[_Segment], multiple: int, algorithm: str, seed: int) -> list[int]:
    ids = list(range(len(segments)))
    if algorithm in ("bfd", "ffd"):
        ids.sort(key=lambda i: -_cost(segments[i].length, multiple))  # stable: ties by id
    elif algorithm == "first_fit_shuffled":
        SplitMix64(mix_seed([seed])).shuffle(ids)
    elif algorithm != "next_fit":
        raise InvalidValueError(f"unknown algorithm {algorithm!r}")
    return ids


def reference_pack(
    lengths: Sequence[int],
    max_tokens: int,
    *,
    algorithm: str = "bfd",
    max_seqs: int | None = None,
    pad_to_multiple_of: int = 1,
    oversize: str = "error",
    seed: int = 0,
) -> ReferencePacking:
    """The reference of :func:`tokenbatch.pack` (same arguments, lists out)."""
    segments, counts = _segments(lengths, max_tokens, pad_to_multiple_of, oversize)
    order = _offer_order(segments, pad_to_multiple_of, algorithm, seed)
    costs = [_cost(segments[i].length, pad_to_multiple_of) for i in order]
    limit = max_seqs if max_seqs is not None else len(segments) + 1
    fit = {"bfd": _best_fit, "ffd": _first_fit, "next_fit": _next_fit}.get(algorithm, _first_fit)
    bin_of = fit(costs, max_tokens, limit)
    segment_bin = [0] * len(segments)
    for position, segment_id in enumerate(order):
        segment_bin[segment_id] = bin_of[position]
    return _layout(segments, segment_bin, pad_to_multiple_of, counts, None)


def reference_batch_padded(
    lengths: Sequence[int],
    max_tokens: int,
    *,
    max_seqs: int | None = None,
    pad_to_multiple_of: int = 1,
    oversize: str = "error",
) -> ReferencePacking:
    """The reference of :func:`tokenbatch.batch_padded`."""
    segments, counts = _segments(lengths, max_tokens, pad_to_multiple_of, oversize)
    order = _offer_order(segments, pad_to_multiple_of, "bfd", 0)
    costs = [_cost(segments[i].length, pad_to_multiple_of) for i in order]
    limit = max_seqs if max_seqs is not None else len(segments) + 1
    bin_of, batch_cost = _padded(costs, max_tokens, limit)
    segment_bin = [0] * len(segments)
    for position, segment_id in enumerate(order):
        segment_bin[segment_id] = bin_of[position]
    return _layout(segments, segment_bin, pad_to_multiple_of, counts, batch_cost)
