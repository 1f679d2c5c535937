"""The token-budget batch sampler for single- and multi-GPU training."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt
from torch.utils.data import Sampler

from tokenbatch import _core
from tokenbatch._convert import (
    as_bool,
    as_choice,
    as_int,
    as_lengths,
    as_seed,
    replicas_and_rank,
)
from tokenbatch.distribute import DEAL_FORMAT, Balance, Dealer, EpochDeal, Segment
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.integrations._sharding import accelerate_shards
from tokenbatch.mixture import Mixture, MixturePlan
from tokenbatch.packing import ALGORITHMS, Algorithm, OversizePolicy
from tokenbatch.schedule import BatchSchedule
from tokenbatch.torch._mixture import _mixture_dealer, _read_sources, _resized_start, _step_position
from tokenbatch.torch._sampler_options import (
    _OVERSIZE,
    _Option,
    _Options,
    check_early,
    read_extra_costs,
)
from tokenbatch.torch._sampler_state import _STATE_FORMAT, _Cursor, _read_state, _Runs

__all__ = ["BatchIndices", "TokenBudgetBatchSampler"]

#: What the sampler yields: sequence indices, or ``(index, start, length)`` segments when
#: sequences may be split or truncated (``oversize="split"`` or ``"truncate"``).
BatchIndices = list[int] | list[Segment]


class TokenBudgetBatchSampler(Sampler[BatchIndices]):
    """Batch sampler whose batches fill a token budget, for single- and multi-GPU training.

    Use it as ``DataLoader(dataset, batch_sampler=sampler, collate_fn=...)``. Each epoch,
    every rank builds the same plan from ``(lengths, seed, epoch)`` without communicating,
    and runs its column of it:

    * **Equal steps, nothing lost.** Every rank gets exactly ``len(sampler)`` batches and
      every sequence is used exactly once per epoch across all ranks. When the number of
      bins does not divide by ``num_replicas``, the costliest bins are cut between their
      sequences until it does (see :func:`tokenbatch.distribute.deal_epoch`); with
      ``oversize="split"``, sequences too are cut when that is the only way. Only
      ``drop_last=True`` leaves sequences out (the least-filled remainder bins), and
      :meth:`stats` says how many.
    * **Balanced steps.** ``balance="attention"`` puts bins of similar attention cost (sum
      of squared sequence lengths) side by side in one step, ``"tokens"`` bins of similar
      token count, ``"flops"`` bins of similar total FLOPs (matmuls and attention, for a
      model of ``hidden_size``), ``None`` keeps the packing order.
    * **Exact resume.** :meth:`state_dict` / :meth:`load_state_dict` restart mid-epoch with
      exactly the batches an uninterrupted run would have produced, by recomputing the
      plan and skipping ahead (no replay). A job restarted on another number of ranks
      finishes the epoch with the sequences not yet used, each exactly once
      (``load_state_dict(state, allow_resize=True)``).

    Args:
        lengths: token count of every dataset item, in dataset order; with ``mixture``,
            ``{source: lengths}`` of every source, whose datasets the dataset concatenates
            in this order (see :attr:`sources`).
        max_tokens: token budget of one micro-batch (per rank).
        mode: ``"packed"``: sequences are concatenated (cost = tokens, see
            :class:`PackedCollator`); ``"padded"``: sequences are padded to the longest of
            their batch (cost = count x longest, see :class:`PaddedCollator`).
        algorithm: packing algorithm of :func:`tokenbatch.pack` (``mode="packed"`` only).
            Deterministic algorithms fix each batch's composition, and ``shuffle`` changes
            the order of batches and ranks; ``"first_fit_shuffled"`` repacks every epoch
            with a fresh seed, so compositions change too.
        shuffle: reshuffle every epoch (see :meth:`set_epoch`).
        seed: must be the same on every rank.
        num_replicas: number of data-parallel ranks; default: the world size of the
            initialized default process group, else 1.
        rank: this process's rank; default: its rank in the default group, else 0.
        drop_last: leave out the remainder bins instead of splitting bins to make their
            number divide by ``num_replicas``.
        balance: ``"attention"``, ``"tokens"``, ``"flops"`` or ``None`` (see above).
        oversize: what to do with sequences longer than ``max_tokens``
            (see :func:`tokenbatch.pack`). With ``"split"`` or ``"truncate"`` the sampler
            yields ``(index, start, length)`` segments; wrap the dataset in
            :class:`SegmentDataset` to serve them.
        max_seqs: at most this many sequences in one batch.
        pad_to_multiple_of: each sequence costs its length rounded up to this multiple.
        dataset: optional; when given, its length must equal ``len(lengths)``.
        hidden_size: the model's hidden size: needed by ``balance="flops"``, where a
            sequence of ``L`` tokens costs ``L + L**2 / (12 * hidden_size)`` (a layer's
            matmuls against its causal attention); with it :meth:`stats` also reports
            the FLOPs imbalance.
        schedule: optional batch-size schedule (:mod:`tokenbatch.schedule`). Micro-batches
            are grouped into optimizer steps whose token totals follow it, continuing
            across epochs; :meth:`step_offsets` and :meth:`optimizer_step_ends` tell the
            training loop when to step the optimizer.
        mixture: a :class:`tokenbatch.mixture.Mixture` of the sources in ``lengths``: every
            optimizer step (of ``schedule``'s tokens, which it needs) takes each source's
            share of its tokens, sources mixed within bins; an epoch is one pass, until a
            source runs out (see the mixture). :meth:`mixture_plan` tells what every step
            takes from every source.
        groups: an integer id per sequence (``None``: every sequence on its own), as in
            :func:`tokenbatch.pack`: sequences sharing an id (a preference pair, the turns
            of one conversation) are placed whole in one batch, consecutively and in input
            order, and the deal never cuts a batch inside a group, so a group is served
            once, to one rank, in one micro-batch, across resumes and resizes too.
            ``oversize`` must be ``"error"`` or ``"drop"``; not with ``mixture``.
        extra_costs, max_extra_costs: budgets besides tokens (vision patches, images...):
            an ``n x k`` matrix of every sequence's costs and ``k`` budgets; every batch
            keeps every column within its budget, packed by :func:`tokenbatch.pack_costs`
            with the tokens as its first column (``mode="packed"``, the default
            ``algorithm``, ``oversize`` ``"error"`` or ``"drop"``; not with ``mixture``).
            ``balance`` weighs the tokens.

    Raises:
        InvalidValueError: ``rank >= num_replicas``, lengths that disagree with
            ``dataset``, too few sequences for ``num_replicas`` ranks without
            ``drop_last``, or an invalid option.
        OversizeError: a sequence longer than ``max_tokens`` with ``oversize="error"``.
    """

    lengths: _Option[npt.NDArray[np.int64]] = _Option()
    max_tokens: _Option[int] = _Option()
    mode: _Option[Literal["packed", "padded"]] = _Option()
    algorithm: _Option[Algorithm] = _Option()
    shuffle: _Option[bool] = _Option()
    seed: _Option[int] = _Option()
    num_replicas: _Option[int] = _Option()
    rank: _Option[int] = _Option()
    drop_last: _Option[bool] = _Option()
    balance: _Option[Balance] = _Option()
    oversize: _Option[OversizePolicy] = _Option()
    max_seqs: _Option[int | None] = _Option()
    pad_to_multiple_of: _Option[int] = _Option()
    hidden_size: _Option[int | None] = _Option()
    schedule: _Option[BatchSchedule | None] = _Option()
    groups: _Option[npt.NDArray[np.int64] | None] = _Option()
    extra_costs: _Option[npt.NDArray[np.int64] | None] = _Option()
    max_extra_costs: _Option[tuple[int, ...]] = _Option()

    def __init__(
        self,
        lengths: Sequence[int] | npt.NDArray[np.integer[Any]] | Mapping[str, Any],
        max_tokens: int,
        *,
        mode: Literal["packed", "padded"] = "packed",
        algorithm: Algorithm = "bfd",
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        balance: Balance = "attention",
        oversize: OversizePolicy = "error",
        max_seqs: int | None = None,
        pad_to_multiple_of: int = 1,
        dataset: Sized | None = None,
        hidden_size: int | None = None,
        schedule: BatchSchedule | None = None,
        mixture: Mixture | None = None,
        groups: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
        extra_costs: npt.ArrayLike | None = None,
        max_extra_costs: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        sources = None
        if mixture is None:
            array = np.array(as_lengths(lengths), dtype=np.int64)
        else:
            sources, array = _read_sources(lengths, mixture, schedule)
        array.flags.writeable = False
        check_early(array, dataset, balance)
        if schedule is not None and not isinstance(schedule, BatchSchedule):
            raise InvalidTypeError(
                f"schedule must be a tokenbatch.schedule schedule, got {type(schedule).__name__}"
            )
        replicas, position = replicas_and_rank(num_replicas, rank)
        costs, budgets = read_extra_costs(
            extra_costs,
            max_extra_costs,
            len(array),
            {
                f"mode={mode!r}": mode != "packed",
                f"algorithm={algorithm!r}": algorithm != "bfd",
                f"oversize={oversize!r}": oversize not in ("error", "drop"),
                "a mixture": mixture is not None,
            },
        )
        self._options = _Options(
            lengths=array,
            max_tokens=as_int(max_tokens, "max_tokens", minimum=1),
            mode=cast(Literal["packed", "padded"], as_choice(mode, "mode", ("packed", "padded"))),
            algorithm=cast(Algorithm, as_choice(algorithm, "algorithm", ALGORITHMS)),
            shuffle=as_bool(shuffle, "shuffle"),
            seed=as_seed(seed),
            num_replicas=replicas,
            rank=position,
            drop_last=as_bool(drop_last, "drop_last"),
            balance=balance,
            oversize=cast(OversizePolicy, as_choice(oversize, "oversize", _OVERSIZE)),
            max_seqs=None if max_seqs is None else as_int(max_seqs, "max_seqs", minimum=1),
            pad_to_multiple_of=as_int(pad_to_multiple_of, "pad_to_multiple_of", minimum=1),
            hidden_size=None
            if hidden_size is None
            else as_int(hidden_size, "hidden_size", minimum=1),
            schedule=schedule,
            mixture=sources,
            groups=_read_groups(groups, mixture),
            extra_costs=costs,
            max_extra_costs=budgets,
        )
        self._cursor = _Cursor()
        # Caches: the epoch-independent work for one packing, the current plan and its
        # optimizer steps. Each is keyed by what it is computed from.
        self._planner_cache: tuple[int, Dealer] | None = None
        self._plan_cache: tuple[tuple[int, _Runs], EpochDeal] | None = None
        self._offsets_cache: tuple[tuple[int, _Runs], npt.NDArray[np.int64]] | None = None
        self._mixture_cache: tuple[_core.MixtureDealer, dict[int, MixturePlan]] | None = None
        #: Real tokens trained on before an epoch, where no closed form gives them.
        self._tokens_before_cache: dict[int, int] = {0: 0}
        self._iter_start = 0  # where the current iterator started
        self._position = 0  # step of the epoch the current iterator has reached
        # Build epoch 0 now, so that oversize sequences and impossible distributions raise
        # here, on every rank, rather than inside the training loop.
        self.plan()

    @property
    def yields_segments(self) -> bool:
        """Batches are ``(index, start, length)`` segments rather than indices."""
        return self._options.oversize in ("split", "truncate")

    @property
    def epoch(self) -> int:
        """The epoch the next iteration yields (see :meth:`set_epoch`)."""
        return self._cursor.epoch

    # -- planning ---------------------------------------------------------------------

    def _planner(self, epoch: int) -> Dealer:
        """The planner of the packing ``epoch`` uses (cached: one packing at a time)."""
        packing_epoch = self._options.packing_epoch(epoch)
        if self._planner_cache is None or self._planner_cache[0] != packing_epoch:
            options = self._options
            self._planner_cache = (packing_epoch, options.planner(options.packing(packing_epoch)))
        return self._planner_cache[1]

    def _plan_at(self, cursor: _Cursor) -> EpochDeal:
        """The plan of ``cursor``'s epoch: the ordinary one, or what is left of it after
        runs on other world sizes, dealt to this one."""
        if self._plan_cache is not None and self._plan_cache[0] == cursor.plan_key:
            return self._plan_cache[1]
        if self._options.mixture is not None:
            return self._mixture_plan(cursor.epoch).deal
        planner = self._planner(cursor.epoch)
        if cursor.resized:
            return planner.deal_after(cursor.epoch, cursor.resized)
        return planner.deal(cursor.epoch)

    def plan(self) -> EpochDeal:
        """The plan of the current epoch (all ranks' batches)."""
        plan = self._plan_at(self._cursor)
        self._plan_cache = (self._cursor.plan_key, plan)
        return plan

    # -- mixtures ---------------------------------------------------------------------

    @property
    def sources(self) -> tuple[str, ...] | None:
        """Source names of a mixture, in the order of the global indices (``None``
        without a mixture): source ``s`` holds indices
        ``source_offsets[s]:source_offsets[s + 1]``."""
        mixture = self._options.mixture
        return None if mixture is None else mixture.names

    @property
    def source_offsets(self) -> npt.NDArray[np.int64] | None:
        """``n_sources + 1`` offsets of the sources in the global indices (``None``
        without a mixture): the dataset is the sources' datasets concatenated in the
        order of :attr:`sources` (``torch.utils.data.ConcatDataset``,
        ``datasets.concatenate_datasets``)."""
        mixture = self._options.mixture
        return None if mixture is None else mixture.offsets

    def mixture_plan(self) -> MixturePlan | None:
        """What every optimizer step of the current epoch takes from every source, and its
        micro-batches (``None`` without a mixture): see :class:`tokenbatch.mixture.MixturePlan`.
        """
        if self._options.mixture is None:
            return None
        return self._mixture_plan(self.epoch)

    def _mixture_dealer(self) -> _core.MixtureDealer:
        if self._mixture_cache is None:
            self._mixture_cache = (_mixture_dealer(self._options), {})
        return self._mixture_cache[0]

    def _mixture_plan(self, epoch: int) -> MixturePlan:
        """The plan of ``epoch`` of a mixture (cached: one epoch at a time)."""
        sources = self._options.mixture
        assert sources is not None
        dealer = self._mixture_dealer()
        plans = cast(tuple[Any, dict[int, MixturePlan]], self._mixture_cache)[1]
        if epoch not in plans:
            before = self._tokens_before(epoch)
            plan = MixturePlan(dealer.plan(epoch, before), sources.names)
            plans.clear()
            plans[epoch] = plan
            self._tokens_before_cache.setdefault(epoch + 1, before + plan.total_tokens)
        return plans[epoch]

    # -- optimizer steps under a batch-size schedule ----------------------------------

    def _tokens_before(self, epoch: int) -> int:
        """Real tokens all ranks trained on in the epochs before ``epoch``.

        Without ``drop_last`` every epoch uses every token the packing placed exactly once,
        and the oversize policy alone decides those tokens (not the algorithm or its seed):
        ``epoch x`` the packing's total. With ``drop_last`` an epoch leaves out a few
        bins; when the packing is the same every epoch so are they. Only a packing redone
        every epoch with ``drop_last`` leaves out other tokens every epoch: those totals
        are summed once per epoch, remembered, and saved in :meth:`state_dict`.
        """
        options = self._options
        if options.mixture is not None:
            # A mixture's passes end where a source runs out, which depends on the shares
            # at the tokens consumed before them: summed pass by pass.
            epoch_tokens: Callable[[int, int], int] = self._mixture_dealer().epoch_tokens
        elif not options.drop_last:
            return epoch * self._planner(self.epoch).packing.total_tokens
        elif not options.repacks_every_epoch:
            return epoch * self._planner(0).epoch_tokens
        else:

            def epoch_tokens(e: int, before: int) -> int:
                return self._planner(e).epoch_tokens

        known = self._tokens_before_cache
        start = max(e for e in known if e <= epoch)
        for e in range(start, epoch):
            known[e + 1] = known[e] + epoch_tokens(e, known[e])
        return known[epoch]

    def step_offsets(self) -> npt.NDArray[np.int64] | None:
        """Optimizer steps of the current epoch under ``schedule`` (``None`` without one).

        Step ``s`` is made of this epoch's micro-batches
        ``step_offsets[s]:step_offsets[s + 1]`` (on every rank): accumulate gradients over
        them, then step the optimizer. Steps follow
        ``schedule.batch_tokens_at(tokens consumed so far)``, counting the real tokens of
        all ranks and of earlier epochs (see :func:`tokenbatch.schedule.group_into_steps`).
        The same on every rank; it costs the same at any epoch (the tokens of earlier
        epochs are not recounted). With a mixture, the steps are those the mixture
        composed (:meth:`mixture_plan`).
        """
        schedule = self._options.schedule
        if schedule is None:
            return None
        if self._options.mixture is not None:
            return self._mixture_plan(self.epoch).step_offsets
        key = self._cursor.plan_key
        if self._offsets_cache is None or self._offsets_cache[0] != key:
            consumed = self._tokens_before(self.epoch)
            plan = self.plan()
            micro_batch_tokens = plan.real_tokens().reshape(-1)
            if self._cursor.resized:
                # Earlier runs of this epoch used what this plan does not hold (a resized
                # resume needs drop_last=False: the epoch holds every placed token).
                epoch_tokens = self._planner(self.epoch).packing.total_tokens
                consumed += epoch_tokens - int(micro_batch_tokens.sum())
            offsets = schedule.group_into_steps(
                micro_batch_tokens, self.num_replicas, consumed_tokens=consumed
            )
            offsets.flags.writeable = False
            self._offsets_cache = (key, offsets)
        return self._offsets_cache[1]

    def optimizer_step_ends(self) -> npt.NDArray[np.bool_] | None:
        """``ends[i]`` is true when micro-batch ``i`` of the current epoch (counted from the
        start of the epoch, also after a resume) completes an optimizer step; ``None``
        without a schedule::

            ends = sampler.optimizer_step_ends()
            for i, batch in enumerate(loader, start=sampler.start_step):
                loss_fn(model(batch)).backward()
                if ends[i]:
                    optimizer.step()
                    optimizer.zero_grad()
        """
        offsets = self.step_offsets()
        if offsets is None:
            return None
        ends = np.zeros(len(self), dtype=np.bool_)
        ends[offsets[1:] - 1] = True
        return ends

    @property
    def start_step(self) -> int:
        """Micro-batch of the current epoch the next iteration starts at (0, or the
        position restored by :meth:`load_state_dict`)."""
        return self._cursor.start

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batches the next iteration yields.

        Call it before each epoch, as with ``DistributedSampler``. Changing the epoch
        discards a position restored by :meth:`load_state_dict`; setting the same epoch
        keeps it.
        """
        epoch = as_int(epoch, "epoch", minimum=0)
        if epoch != self._cursor.epoch:
            self._cursor = _Cursor(epoch=epoch)
            self._iter_start = self._position = 0

    def __len__(self) -> int:
        """Batches per rank in the current epoch (exact, the same on every rank)."""
        return self.plan().n_steps

    def __iter__(self) -> Iterator[BatchIndices]:
        # A generator, so that the bookkeeping happens at the first ``next``: DataLoader
        # calls ``iter`` more than once per epoch and drops the iterators it never reads.
        self._refuse_second_sharding()
        plan = self.plan()
        start = self._cursor.start
        self._cursor = dataclasses.replace(self._cursor, start=0)
        self._iter_start = self._position = start
        for batch in plan.batches(self.rank, start, segments=self.yields_segments):
            self._position += 1
            yield batch

    def _refuse_second_sharding(self) -> None:
        """Raise when Accelerate shards this sampler's batches over its processes again
        (see :mod:`tokenbatch.integrations._sharding`): each rank would silently keep only
        1 of every ``P`` of its own batches."""
        processes = accelerate_shards(self)
        if processes > 1:
            raise InvalidValueError(
                f"accelerator.prepare() shards the batches of this TokenBudgetBatchSampler "
                f"again over {processes} processes, so each rank would keep 1 of every "
                f"{processes} of its own batches and most of the data would never be seen; "
                "the sampler is already rank-aware: prepare the loader with "
                "tokenbatch.integrations.accelerate.prepare_data_loader(accelerator, loader), "
                "or train with tokenbatch.integrations.transformers.TokenBudgetTrainer"
            )

    def stats(self) -> dict[str, int | float]:
        """Counts and balance of the current epoch's plan.

        Includes ``n_steps`` (batches per rank), ``dropped_seqs`` (sequences left out by
        ``drop_last`` or ``oversize="drop"``), ``split_bins`` (bins added to make the
        count divide by ``num_replicas``), ``padding_ratio``, and the per-step max/mean
        imbalance of tokens and of attention cost (``*_imbalance_max``,
        ``*_imbalance_mean``, ``*_sync_overhead``); see
        :meth:`tokenbatch.distribute.EpochDeal.stats`.
        """
        return self.plan().stats()

    # -- checkpointing ----------------------------------------------------------------

    def fingerprint(self) -> str:
        """Digest of the lengths and every option that shapes the plan but the number of
        ranks (which a state records, and a resized resume may change)."""
        return self._options.fingerprint

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """Position in the epoch, to resume exactly with :meth:`load_state_dict`.

        Args:
            consumed_batches: batches the training loop has taken from the current
                iteration (since the last ``iter(loader)``). Needed with DataLoader
                workers, which fetch batches ahead of the loop; without it the position
                is what the sampler has yielded, which is exact with ``num_workers=0``.

        The state is the same on every rank (steps are global), so saving rank 0's is
        enough. It holds ``epoch``, ``step`` (batches of the epoch already consumed per
        rank), the options, a fingerprint of the lengths and options, ``resized``: the
        ``[num_replicas, steps]`` runs of this epoch on other world sizes before a resized
        resume (empty otherwise), and ``deal_format``, the version of the dealing rules
        (:data:`tokenbatch.distribute.DEAL_FORMAT`): a state is only restored into deals of
        the same format. With a schedule it also holds ``tokens_before_epoch``.
        """
        if consumed_batches is None:
            step = self._position
        else:
            consumed = as_int(consumed_batches, "consumed_batches", minimum=0)
            yielded = self._position - self._iter_start
            if consumed > yielded:
                raise InvalidValueError(
                    f"consumed_batches={consumed} is more than the {yielded} batches the "
                    "sampler has yielded in this iteration"
                )
            step = self._iter_start + consumed
        state: dict[str, Any] = {
            "format": _STATE_FORMAT,
            "deal_format": DEAL_FORMAT,
            "epoch": self.epoch,
            "step": step,
            "n_steps": len(self),
            "n_seqs": len(self._options.lengths),
            "fingerprint": self.fingerprint(),
            "config": self._options.config(),
            "resized": [list(run) for run in self._cursor.resized],
        }
        if self._options.schedule is not None:
            state["tokens_before_epoch"] = self._tokens_before(self.epoch)
        if self._options.mixture is not None:
            state["mixture_step"] = _step_position(
                self._mixture_plan(self.epoch).step_offsets, step
            )
        return state

    def load_state_dict(self, state: Mapping[str, Any], *, allow_resize: bool = False) -> None:
        """Restore a position saved by :meth:`state_dict` (possibly from another rank).

        The next iteration starts at the saved step of the saved epoch; call
        :meth:`set_epoch` with that same epoch (or not at all) before iterating. The state
        is checked completely, and its plan built, before anything changes: a refused
        state leaves the sampler as it was.

        Args:
            state: a :meth:`state_dict`.
            allow_resize: accept a state saved with another ``num_replicas``. The epoch
                then finishes with the bins no rank had run, dealt again to this world
                size (bins are cut between their sequences, as when planning, to make
                their number divide): every sequence of the epoch is still used exactly
                once, but the batches differ from those of an uninterrupted run and
                :meth:`__len__` is the steps left. Later epochs are planned for this
                world size from the start. Needs ``drop_last=False`` with a schedule.
                A mixture's optimizer steps hold the same sequences on any world size:
                the epoch goes on with this world size's micro-batches of the steps the
                state had not begun (the state must be saved between optimizer steps).

        Raises:
            InvalidValueError: the state comes from other lengths or options (a
                different dataset, seed...; ``num_replicas`` unless ``allow_resize``), was
                written under another deal format, is malformed, or leaves too few
                sequences for this many ranks.
        """
        cursor, tokens_before = _read_state(
            self._options, state, as_bool(allow_resize, "allow_resize")
        )
        if tokens_before is not None:
            self._tokens_before_cache[cursor.epoch] = tokens_before
        if self._options.mixture is not None and cursor.resized:
            # A mixture's steps hold the same sequences on any world size: this one's plan
            # is run from the step the state stopped before.
            offsets = self._mixture_plan(cursor.epoch).step_offsets
            cursor = _Cursor(epoch=cursor.epoch, start=_resized_start(state, offsets))
        plan = self._plan_at(cursor)
        if cursor.start > plan.n_steps:
            raise InvalidValueError(
                f"state['step']={cursor.start} is beyond the {plan.n_steps} steps of epoch "
                f"{cursor.epoch}"
            )
        self._cursor = cursor
        self._plan_cache = (cursor.plan_key, plan)
        self._iter_start = self._position = cursor.start
        if tokens_before is not None:
            self._tokens_before_cache[cursor.epoch] = tokens_before

    def __getstate__(self) -> dict[str, Any]:
        # Plans and planners are caches of the Rust core: rebuilt, not pickled.
        state = self.__dict__.copy()
        state.update(
            _planner_cache=None, _plan_cache=None, _offsets_cache=None, _mixture_cache=None
        )
        return state

    def __repr__(self) -> str:
        return (
            f"TokenBudgetBatchSampler(n_seqs={len(self._options.lengths)}, "
            f"max_tokens={self.max_tokens}, mode={self.mode!r}, "
            f"num_replicas={self.num_replicas}, rank={self.rank}, epoch={self.epoch})"
        )


def _read_groups(
    groups: Sequence[int] | npt.NDArray[np.integer[Any]] | None, mixture: Mixture | None
) -> npt.NDArray[np.int64] | None:
    """The group ids, copied and frozen like the lengths (the packing checks them)."""
    if groups is None:
        return None
    if mixture is not None:
        raise InvalidValueError(
            "groups cannot be combined with a mixture yet: a mixture packs each step's "
            "sequences from several sources; pack the groups of one source without it"
        )
    ids = np.array(as_lengths(groups, "groups"), dtype=np.int64)
    ids.flags.writeable = False
    return ids
