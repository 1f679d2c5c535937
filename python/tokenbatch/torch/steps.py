"""Optimizer steps of an epoch, and the label tokens that normalize each step's loss.

With token budgets, micro-batches hold different numbers of label tokens, so a loss
averaged per micro-batch weighs tokens unequally across micro-batches and ranks. The
sampler's deal knows every micro-batch of every rank, so the number of label tokens of a
whole optimizer step across all ranks (Hugging Face's ``num_items_in_batch``) is known on
every rank in advance, without a collective. Dividing each micro-batch's summed token loss
by it, and undoing DDP's averaging over ranks, gives exactly the gradient of one process
over the whole global batch with a sum-over-tokens / total-tokens loss.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tokenbatch._convert import as_int, as_lengths
from tokenbatch.errors import InvalidValueError

if TYPE_CHECKING:
    from tokenbatch.distribute import EpochDeal
    from tokenbatch.torch.sampler import TokenBudgetBatchSampler

__all__ = ["OptimizerSteps", "optimizer_steps"]

_I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class OptimizerSteps:
    """The optimizer steps of one epoch of a :class:`TokenBudgetBatchSampler`.

    Micro-batches are counted from the start of the epoch on every rank (also after a
    resume, where iteration starts at ``sampler.start_step``). Build it with
    :func:`optimizer_steps`.

    Attributes:
        epoch: the sampler epoch these steps belong to.
        offsets: int64, ``len(self) + 1`` entries: step ``s`` is made of micro-batches
            ``offsets[s]:offsets[s + 1]`` (the same on every rank).
        label_tokens: int64, one per step: the label tokens (tokens whose next-token
            prediction is trained) of all micro-batches of the step on all ranks.
        num_replicas: the number of data-parallel ranks of the deal.
        sources: the source names of a mixture sampler (``None`` without a mixture).
        source_tokens: int64 ``(len(self), len(sources))`` with a mixture: the real tokens
            every step takes from every source, on all ranks (what the trainer
            integrations log); ``None`` without a mixture.
    """

    epoch: int
    offsets: _I64
    label_tokens: _I64
    num_replicas: int
    sources: tuple[str, ...] | None = None
    source_tokens: _I64 | None = None

    def __len__(self) -> int:
        """Optimizer steps in the epoch."""
        return len(self.offsets) - 1

    @property
    def n_micro_batches(self) -> int:
        """Micro-batches per rank in the epoch."""
        return int(self.offsets[-1])

    @property
    def ends(self) -> npt.NDArray[np.bool_]:
        """``ends[i]`` is true when micro-batch ``i`` completes an optimizer step."""
        ends = np.zeros(self.n_micro_batches, dtype=np.bool_)
        ends[self.offsets[1:] - 1] = True
        return ends

    def step_of(self, micro_batch: int) -> int:
        """The optimizer step micro-batch ``micro_batch`` belongs to."""
        index = self._micro_batch(micro_batch)
        return int(np.searchsorted(self.offsets, index, side="right")) - 1

    def step_ending_at(self, micro_batch: int) -> int | None:
        """The optimizer step micro-batch ``micro_batch`` completes, or ``None`` when the
        step goes on after it."""
        step = self.step_of(micro_batch)
        return step if int(self.offsets[step + 1]) == micro_batch + 1 else None

    def num_items_in_batch(self, micro_batch: int) -> int:
        """Label tokens, over all ranks, of the optimizer step holding ``micro_batch``.

        The normalizer of Hugging Face models' ``num_items_in_batch=`` argument: a causal
        LM given it returns the summed token loss divided by it. Under DDP, which
        averages gradients over ranks, multiply that loss by the number of ranks.
        """
        return int(self.label_tokens[self.step_of(micro_batch)])

    def _micro_batch(self, micro_batch: int) -> int:
        index = as_int(micro_batch, "micro_batch", minimum=0)
        if index >= self.n_micro_batches:
            raise InvalidValueError(
                f"micro_batch={index} is beyond the {self.n_micro_batches} micro-batches of "
                f"epoch {self.epoch}"
            )
        return index


def optimizer_steps(
    sampler: TokenBudgetBatchSampler,
    *,
    micro_batches_per_step: int = 1,
    label_counts: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
    epoch: int | None = None,
) -> OptimizerSteps:
    """Group an epoch's micro-batches into optimizer steps and count their label tokens.

    Steps follow the sampler's batch-size ``schedule`` when it has one
    (:meth:`TokenBudgetBatchSampler.step_offsets`), otherwise every
    ``micro_batches_per_step`` micro-batches make one step (gradient accumulation; the
    last step of the epoch may be shorter).

    A sequence of ``L`` tokens has ``L - 1`` label tokens: :class:`PackedCollator`
    ignores the first token of every sequence (and of every piece of a split sequence),
    and a causal LM predicts no token from before a padded row's start. Pass
    ``label_counts`` when the labels mask more (prompts, for example): ``label_counts[i]``
    is the number of tokens of sequence ``i`` after its first whose label is not
    ``ignore_index``.

    Args:
        sampler: the batch sampler; its current epoch (and restored position) is used
            unless ``epoch`` names another one.
        micro_batches_per_step: micro-batches per optimizer step, without a schedule.
        label_counts: label tokens of every sequence, in dataset order.
        epoch: count another epoch than the sampler's current one (the sampler is not
            changed).

    Raises:
        InvalidValueError: ``micro_batches_per_step > 1`` with a schedule, ``label_counts``
            of the wrong length or larger than a sequence allows, or ``label_counts`` with
            sequences split or truncated into segments.
    """
    per_step = as_int(micro_batches_per_step, "micro_batches_per_step", minimum=1)
    if epoch is not None and as_int(epoch, "epoch", minimum=0) != sampler.epoch:
        # A copy dealt for ``epoch``: set_epoch on the sampler itself would drop a
        # position restored by load_state_dict.
        sampler = copy.copy(sampler)
        sampler.set_epoch(epoch)
    deal = sampler.plan()
    n_micro = deal.n_steps
    if sampler.schedule is not None:
        if per_step != 1:
            raise InvalidValueError(
                f"micro_batches_per_step={per_step} with a schedule: the schedule decides how "
                "many micro-batches make each optimizer step"
            )
        offsets = sampler.step_offsets()
        assert offsets is not None  # a sampler with a schedule has step offsets
    else:
        offsets = np.append(np.arange(0, n_micro, per_step, dtype=np.int64), n_micro)
    offsets = np.array(offsets, dtype=np.int64)
    bins = _bin_label_tokens(deal, sampler.lengths, label_counts)
    per_micro_batch = bins[deal.steps].sum(axis=1) if n_micro else np.zeros(0, dtype=np.int64)
    label_tokens = _range_sums(per_micro_batch, offsets)
    source_tokens = _source_tokens(deal, sampler.source_offsets, offsets)
    for array in (offsets, label_tokens, source_tokens):
        if array is not None:
            array.flags.writeable = False
    return OptimizerSteps(
        epoch=sampler.epoch,
        offsets=offsets,
        label_tokens=label_tokens,
        num_replicas=sampler.num_replicas,
        sources=sampler.sources,
        source_tokens=source_tokens,
    )


def _source_tokens(deal: EpochDeal, bounds: _I64 | None, offsets: _I64) -> _I64 | None:
    """Real tokens of every source in every step (``bounds``: the sources' offsets in the
    global indices), or ``None`` without sources."""
    if bounds is None:
        return None
    n_sources = len(bounds) - 1
    n_bins = len(deal.bin_offsets) - 1
    source = np.searchsorted(bounds, deal.indices, side="right") - 1
    bin_of = np.repeat(np.arange(n_bins), np.diff(deal.bin_offsets))
    # Float sums of integers are exact below 2**53 tokens.
    per_bin = np.bincount(
        bin_of * n_sources + source, weights=deal.lengths, minlength=n_bins * n_sources
    )
    per_bin = per_bin.astype(np.int64).reshape(n_bins, n_sources)
    per_micro_batch = per_bin[deal.steps].sum(axis=1)
    return _range_sums(per_micro_batch.reshape(-1, n_sources), offsets)


def _bin_label_tokens(
    deal: EpochDeal,
    lengths: _I64,
    label_counts: Sequence[int] | npt.NDArray[np.integer[Any]] | None,
) -> _I64:
    """Label tokens of every bin of ``deal``."""
    if label_counts is None:
        per_segment = np.maximum(deal.lengths - 1, 0)
    else:
        counts = np.asarray(as_lengths(label_counts, "label_counts"), dtype=np.int64)
        if len(counts) != len(lengths):
            raise InvalidValueError(
                f"label_counts has {len(counts)} entries, the sampler has {len(lengths)} sequences"
            )
        too_many = np.flatnonzero(counts > np.maximum(lengths - 1, 0))
        if len(too_many):
            i = int(too_many[0])
            raise InvalidValueError(
                f"label_counts[{i}] = {int(counts[i])}, but sequence {i} of {int(lengths[i])} "
                "tokens has at most length - 1 label tokens (the first token is never predicted)"
            )
        whole = (deal.starts == 0) & (deal.lengths == lengths[deal.indices])
        if not whole.all():
            raise InvalidValueError(
                "label_counts needs whole sequences, but the deal splits or truncates some "
                "(oversize='split' or 'truncate'): count the labels of each segment instead"
            )
        per_segment = counts[deal.indices]
    return _range_sums(per_segment.astype(np.int64, copy=False), deal.bin_offsets)


def _range_sums(values: _I64, offsets: _I64) -> _I64:
    """``values[offsets[i]:offsets[i + 1]].sum(axis=0)`` for every ``i`` (empty ranges sum
    to 0)."""
    cumulative = np.zeros((len(values) + 1, *values.shape[1:]), dtype=np.int64)
    np.cumsum(values, axis=0, out=cumulative[1:])
    sums: _I64 = cumulative[offsets[1:]] - cumulative[offsets[:-1]]
    return sums
