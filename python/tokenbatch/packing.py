"""Token-budget packing: the typed Python face of the Rust packing engine.

:class:`Packing` is a class of the Rust core: it owns its arrays and hands them to numpy
as read-only views, without copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_int, as_lengths, as_seed, as_str
from tokenbatch._core import Packing

__all__ = ["ALGORITHMS", "Algorithm", "OversizePolicy", "Packing", "batch_padded", "pack"]

Algorithm = Literal["bfd", "ffd", "next_fit", "first_fit_shuffled"]
#: The names :data:`Algorithm` allows, in order.
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
OversizePolicy = Literal["error", "truncate", "split", "drop"]
LengthsLike = Sequence[int] | npt.NDArray[np.integer[Any]]


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
    return _core.pack(
        array,
        budget,
        algorithm=as_str(algorithm, "algorithm"),
        max_seqs=None if max_seqs is None else as_int(max_seqs, "max_seqs"),
        pad_to_multiple_of=as_int(pad_to_multiple_of, "pad_to_multiple_of"),
        oversize=as_str(oversize, "oversize"),
        seed=as_seed(seed),
    )


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
    return _core.batch_padded(
        array,
        budget,
        max_seqs=None if max_seqs is None else as_int(max_seqs, "max_seqs"),
        pad_to_multiple_of=as_int(pad_to_multiple_of, "pad_to_multiple_of"),
        oversize=as_str(oversize, "oversize"),
    )
