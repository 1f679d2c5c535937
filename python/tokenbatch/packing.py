"""Token-budget packing: the typed Python face of the Rust packing engine."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_int, as_lengths, as_seed

__all__ = ["ALGORITHMS", "Algorithm", "OversizePolicy", "Packing", "batch_padded", "pack"]

Algorithm = Literal["bfd", "ffd", "next_fit", "first_fit_shuffled"]
#: The names :data:`Algorithm` allows, in order.
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
OversizePolicy = Literal["error", "truncate", "split", "drop"]
LengthsLike = Sequence[int] | npt.NDArray[np.integer[Any]]

_I64 = npt.NDArray[np.int64]


class Packing:
    """A packing in CSR form: bin ``i`` holds segments ``bin_offsets[i]:bin_offsets[i + 1]``.

    A segment is a run of tokens of one input sequence: ``indices[j]`` is the sequence,
    ``starts[j]`` the token offset inside it (0 unless the sequence was split) and
    ``lengths[j]`` the number of tokens. Bins are numbered in the order the algorithm
    opened them; inside a bin, segments are listed in input order. All arrays are
    read-only int64 numpy arrays owned by this object (produced by the Rust core without
    a copy).

    ``bin_tokens[i]`` is bin ``i``'s cost against the budget: its tokens, each segment
    rounded up to ``pad_to_multiple_of``; for :func:`batch_padded`, ``count x longest``.
    """

    __slots__ = (
        "_counts",
        "bin_offsets",
        "bin_tokens",
        "indices",
        "kind",
        "lengths",
        "max_tokens",
        "n_seqs",
        "starts",
    )

    bin_offsets: _I64
    indices: _I64
    starts: _I64
    lengths: _I64
    bin_tokens: _I64
    max_tokens: int
    n_seqs: int
    kind: Literal["packed", "padded"]

    def __init__(
        self,
        raw: tuple[_I64, _I64, _I64, _I64, _I64, dict[str, int]],
        *,
        max_tokens: int,
        n_seqs: int,
        kind: Literal["packed", "padded"],
    ) -> None:
        bin_offsets, indices, starts, lengths, bin_tokens, counts = raw
        for array in (bin_offsets, indices, starts, lengths, bin_tokens):
            array.flags.writeable = False
        self.bin_offsets = bin_offsets
        self.indices = indices
        self.starts = starts
        self.lengths = lengths
        self.bin_tokens = bin_tokens
        self.max_tokens = max_tokens
        self.n_seqs = n_seqs
        self.kind = kind
        self._counts = counts

    @property
    def n_bins(self) -> int:
        """Number of bins."""
        return len(self.bin_offsets) - 1

    @property
    def n_segments(self) -> int:
        """Number of segments (sequences, or pieces of split sequences, that were placed)."""
        return len(self.indices)

    def __len__(self) -> int:
        return self.n_bins

    def __getitem__(self, bin_index: int) -> _I64:
        """Sequence indices in bin ``bin_index`` (a read-only view, negative indices allowed)."""
        lo, hi = self._bounds(bin_index)
        return self.indices[lo:hi]

    def __iter__(self) -> Iterator[_I64]:
        offsets = self.bin_offsets.tolist()
        for lo, hi in itertools.pairwise(offsets):
            yield self.indices[lo:hi]

    def segments(self, bin_index: int) -> tuple[_I64, _I64, _I64]:
        """``(indices, starts, lengths)`` of the segments in bin ``bin_index``."""
        lo, hi = self._bounds(bin_index)
        return self.indices[lo:hi], self.starts[lo:hi], self.lengths[lo:hi]

    def _bounds(self, bin_index: int) -> tuple[int, int]:
        n_bins = self.n_bins
        position = as_int(bin_index, "bin index")
        if position < 0:
            position += n_bins
        if not 0 <= position < n_bins:
            raise IndexError(f"bin index {bin_index} out of range for a packing of {n_bins} bins")
        return int(self.bin_offsets[position]), int(self.bin_offsets[position + 1])

    @property
    def total_tokens(self) -> int:
        """Real (non-padding) tokens placed in bins."""
        return int(self.lengths.sum())

    @property
    def efficiency(self) -> float:
        """Real tokens / (n_bins x max_tokens); 1.0 for an empty packing."""
        if self.n_bins == 0:
            return 1.0
        return self.total_tokens / (self.n_bins * self.max_tokens)

    @property
    def lower_bound(self) -> int:
        """Fewest bins any packing could use: ceil(total cost / max_tokens), or more when
        ``max_seqs`` forces it."""
        return self._counts["lower_bound"]

    def stats(self) -> dict[str, int | float]:
        """Summary counts.

        ``padding_tokens`` is padding that is actually materialized (rounding segments up
        to ``pad_to_multiple_of``, or padding to the longest for padded batches);
        ``unused_tokens`` is budget left empty in bins (``n_bins x max_tokens`` minus
        costs). ``efficiency`` is ``total_tokens / (n_bins x max_tokens)``.
        """
        total_tokens = self.total_tokens
        total_cost = int(self.bin_tokens.sum())
        counts = self._counts
        return {
            "n_seqs": self.n_seqs,
            "n_segments": self.n_segments,
            "n_bins": self.n_bins,
            "lower_bound": counts["lower_bound"],
            "max_tokens": self.max_tokens,
            "input_tokens": counts["input_tokens"],
            "total_tokens": total_tokens,
            "padding_tokens": total_cost - total_tokens,
            "unused_tokens": self.n_bins * self.max_tokens - total_cost,
            "efficiency": self.efficiency,
            "dropped_seqs": counts["dropped_seqs"],
            "dropped_tokens": counts["dropped_tokens"],
            "truncated_seqs": counts["truncated_seqs"],
            "truncated_tokens": counts["truncated_tokens"],
            "split_seqs": counts["split_seqs"],
            "split_pieces": counts["split_pieces"],
        }

    def __repr__(self) -> str:
        return (
            f"Packing(kind={self.kind!r}, n_seqs={self.n_seqs}, n_bins={self.n_bins}, "
            f"max_tokens={self.max_tokens}, efficiency={self.efficiency:.4f})"
        )


def pack(
    lengths: LengthsLike,
    max_tokens: int,
    *,
    algorithm: Algorithm = "bfd",
    max_seqs: int | None = None,
    pad_to_multiple_of: int = 1,
    oversize: OversizePolicy = "error",
    seed: int = 0,
) -> Packing:
    """Pack variable-length sequences into bins of at most ``max_tokens`` tokens.

    Args:
        lengths: token count of each sequence: a list or 1-D numpy array of any integer
            dtype. C-contiguous int32/int64 arrays are read in place; anything else is
            converted to int64 once.
        max_tokens: the token budget of one bin.
        algorithm: ``"bfd"`` best-fit decreasing (fewest bins), ``"ffd"`` first-fit
            decreasing, ``"next_fit"`` (keeps input order, one open bin) or
            ``"first_fit_shuffled"`` (first fit over a seeded random order, so bins are
            random in composition).
        max_seqs: at most this many segments in one bin (``None``: no limit).
        pad_to_multiple_of: each segment costs its length rounded up to a multiple of
            this; the longest segment that fits is ``max_tokens`` rounded down to it.
        oversize: what to do with a sequence that does not fit a bin: ``"error"`` raise
            :class:`~tokenbatch.errors.OversizeError`, ``"truncate"`` keep its first
            tokens, ``"split"`` cut it into pieces (no token lost), ``"drop"`` leave it out
            (counted in :meth:`Packing.stats`).
        seed: seed of ``"first_fit_shuffled"``'s order; other algorithms ignore it.

    Zero-length sequences are placed like any other: they cost no tokens but take a
    ``max_seqs`` slot, so every input index appears exactly once. The result is
    deterministic: the same arguments give the same arrays on every machine.

    Raises:
        InvalidTypeError: ``lengths`` is not a 1-D integer sequence.
        InvalidValueError: a negative length or an invalid option.
        OversizeError: a sequence longer than the budget with ``oversize="error"``.
        TokenBatchOverflowError: lengths summing beyond 2**63 - 1.
    """
    array = as_lengths(lengths)
    budget = as_int(max_tokens, "max_tokens")
    raw = _core.pack(
        array,
        budget,
        algorithm=_as_choice(algorithm, "algorithm"),
        max_seqs=None if max_seqs is None else as_int(max_seqs, "max_seqs"),
        pad_to_multiple_of=as_int(pad_to_multiple_of, "pad_to_multiple_of"),
        oversize=_as_choice(oversize, "oversize"),
        seed=as_seed(seed),
    )
    return Packing(raw, max_tokens=budget, n_seqs=len(array), kind="packed")


def batch_padded(
    lengths: LengthsLike,
    max_tokens: int,
    *,
    max_seqs: int | None = None,
    pad_to_multiple_of: int = 1,
    oversize: OversizePolicy = "error",
) -> Packing:
    """Padded token-budget batching with fairseq's ``batch_by_size`` semantics.

    A batch of ``n`` sequences costs ``n x`` its longest length (rounded up to
    ``pad_to_multiple_of``) and that cost stays within ``max_tokens``. Sequences are
    sorted by decreasing length (ties by index) and cut into consecutive batches, so
    batch-mates have similar lengths and padding stays small. Arguments, errors and the
    oversize policies are those of :func:`pack`; ``Packing.bin_tokens`` holds the padded
    cost of each batch.
    """
    array = as_lengths(lengths)
    budget = as_int(max_tokens, "max_tokens")
    raw = _core.batch_padded(
        array,
        budget,
        max_seqs=None if max_seqs is None else as_int(max_seqs, "max_seqs"),
        pad_to_multiple_of=as_int(pad_to_multiple_of, "pad_to_multiple_of"),
        oversize=_as_choice(oversize, "oversize"),
    )
    return Packing(raw, max_tokens=budget, n_seqs=len(array), kind="padded")


def _as_choice(value: object, name: str) -> str:
    if not isinstance(value, str):
        from tokenbatch.errors import InvalidTypeError

        raise InvalidTypeError(f"{name} must be a string, got {value!r}")
    return value
