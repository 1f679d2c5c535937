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
from tokenbatch._convert import (
    as_cost_matrix,
    as_group_ids,
    as_int,
    as_lengths,
    as_seed,
    as_str,
)
from tokenbatch._core import Packing

__all__ = [
    "ALGORITHMS",
    "MAX_COST_COLUMNS",
    "Algorithm",
    "OversizePolicy",
    "Packing",
    "batch_padded",
    "pack",
    "pack_costs",
]

Algorithm = Literal["bfd", "ffd", "next_fit", "first_fit_shuffled"]
#: The names :data:`Algorithm` allows, in order.
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
OversizePolicy = Literal["error", "truncate", "split", "drop"]
LengthsLike = Sequence[int] | npt.NDArray[np.integer[Any]]
CostsLike = Sequence[Sequence[int]] | npt.NDArray[np.integer[Any]]
#: The most cost columns (budgets) :func:`pack_costs` takes.
MAX_COST_COLUMNS: int = _core.MAX_COST_COLUMNS


def pack(
    lengths: LengthsLike,
    max_tokens: int,
    *,
    algorithm: Algorithm = "bfd",
    max_seqs: int | None = None,
    pad_to_multiple_of: int = 1,
    oversize: OversizePolicy = "error",
    seed: int = 0,
    groups: LengthsLike | None = None,
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
        groups: an integer id per sequence (``None``: every sequence on its own).
            Sequences sharing an id form an atomic group, placed whole in one bin,
            consecutively and in input order (a preference pair, the turns of one
            conversation). The sequences of a group must be consecutive in the input; ids
            need not be sorted or contiguous. A group costs the sum of its members' costs;
            one over ``max_tokens`` (or with more members than ``max_seqs``) is refused
            (``oversize="error"``) or left out whole (``"drop"``, counted in
            :meth:`Packing.stats`); ``"split"`` and ``"truncate"`` are refused with
            groups. Groups are packed by ``algorithm`` as sequences are; with
            ``max_seqs`` set, bins are filled as :func:`pack_costs` fills them (the
            member count is a second budget).

    Zero-length sequences are placed like any other: they cost no tokens but take a
    ``max_seqs`` slot, so every input index appears exactly once. The result is
    deterministic: the same arguments give the same arrays on every machine.

    Raises:
        InvalidTypeError: ``lengths`` is not a 1-D integer sequence.
        InvalidValueError: a negative length or an invalid option.
        OversizeError: a sequence (or group) over the budget with ``oversize="error"``.
        TokenBatchOverflowError: lengths summing beyond 2**63 - 1.
        InvalidValueError (groups): a count of ids other than one per sequence, a group
            whose sequences are not consecutive (naming two of its positions), or
            ``oversize="split"``/``"truncate"``.
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
        groups=as_group_ids(groups),
    )


def batch_padded(
    lengths: LengthsLike,
    max_tokens: int,
    *,
    max_seqs: int | None = None,
    pad_to_multiple_of: int = 1,
    oversize: OversizePolicy = "error",
    groups: LengthsLike | None = None,
) -> Packing:
    """Padded token-budget batching with fairseq's ``batch_by_size`` semantics.

    A batch of ``n`` sequences costs ``n x`` its longest length (rounded up to
    ``pad_to_multiple_of``) and that cost stays within ``max_tokens``. Sequences are
    sorted by decreasing length (ties by index) and cut into consecutive batches, so
    batch-mates have similar lengths and padding stays small. Arguments, errors and the
    oversize policies are those of :func:`pack`; ``Packing.bin_tokens`` holds the padded
    cost of each batch. With ``groups``, each group is placed whole in one batch and costs
    its members times its longest member; groups are sorted by their longest member.
    """
    array = as_lengths(lengths)
    budget = as_int(max_tokens, "max_tokens")
    return _core.batch_padded(
        array,
        budget,
        max_seqs=None if max_seqs is None else as_int(max_seqs, "max_seqs"),
        pad_to_multiple_of=as_int(pad_to_multiple_of, "pad_to_multiple_of"),
        oversize=as_str(oversize, "oversize"),
        groups=as_group_ids(groups),
    )


def pack_costs(
    costs: CostsLike,
    max_costs: Sequence[int],
    *,
    groups: LengthsLike | None = None,
    max_seqs: int | None = None,
    pad_to_multiple_of: int = 1,
    oversize: Literal["error", "drop"] = "error",
) -> Packing:
    """Pack sequences under several budgets at once (tokens, vision patches, images...).

    Args:
        costs: an ``n x m`` integer matrix, one row per sequence and one column per budget
            (1 to :data:`MAX_COST_COLUMNS` columns). Column 0 is the sequence's tokens: it
            gives the segments' ``lengths``, is rounded up to ``pad_to_multiple_of``, and
            its budget is the packing's ``max_tokens``. A C-contiguous int64 array is read
            in place; anything else is converted once.
        max_costs: one budget per column, each at least 1.
        groups: atomic groups, as in :func:`pack`.
        max_seqs: at most this many sequences in one bin.
        pad_to_multiple_of: column 0 of each sequence costs its value rounded up to this.
        oversize: a sequence (or group) over any budget is refused (``"error"``, naming it,
            its column and cost) or left out (``"drop"``, counted in
            :meth:`Packing.stats`).

    Every column of every bin stays within its budget. Sequences (or groups) that cost
    something beyond column 0 are offered first, by decreasing *size*, the largest share of
    a budget any of their columns takes (``max_c costs[i, c] / max_costs[c]``), ties by
    input order; each goes to the first bin, in the order bins were opened, where every
    column fits: first-fit decreasing on that size. Those that cost only column 0 (text
    beside images) follow by decreasing tokens, each to the bin with the least token room
    that holds it (best fit, as :func:`pack`; with ``max_seqs`` every sequence costs a
    slot of it, so all go by first fit). ``Packing.lower_bound`` is the largest per-column bound
    ``ceil(sum(costs[:, c]) / max_costs[c])`` (and the ``max_seqs`` bound); the bins'
    totals per column are ``np.add.reduceat(costs[packing.indices], bin_offsets[:-1])``
    for a packing without empty bins.

    Raises:
        InvalidTypeError: ``costs`` is not a 2-D integer matrix.
        InvalidValueError: a negative cost, a budget below 1, a number of budgets other
            than the number of columns, more than 8 columns, a bad group, or an oversize
            policy other than ``"error"``/``"drop"``.
        OversizeError: a sequence or group over a budget with ``oversize="error"``.
    """
    matrix = as_cost_matrix(costs)
    budgets = [as_int(budget, f"max_costs[{c}]") for c, budget in enumerate(max_costs)]
    return _core.pack_costs(
        matrix,
        budgets,
        groups=as_group_ids(groups),
        max_seqs=None if max_seqs is None else as_int(max_seqs, "max_seqs"),
        pad_to_multiple_of=as_int(pad_to_multiple_of, "pad_to_multiple_of"),
        oversize=as_str(oversize, "oversize"),
    )
