"""The token-budget batch sampler for single- and multi-GPU training."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence, Sized
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from torch.utils.data import Sampler

from tokenbatch._convert import (
    as_choice,
    as_int,
    as_lengths,
    as_seed,
    check_same_config,
    replicas_and_rank,
)
from tokenbatch.distribute import Balance, EpochPlan, Planner, Segment, mix_seed
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.packing import ALGORITHMS, Algorithm, OversizePolicy, Packing, batch_padded, pack
from tokenbatch.schedule import BatchSchedule

__all__ = ["BatchIndices", "TokenBudgetBatchSampler"]

#: What the sampler yields: sequence indices, or ``(index, start, length)`` segments when
#: sequences may be split or truncated (``oversize="split"`` or ``"truncate"``).
BatchIndices = list[int] | list[Segment]

_STATE_FORMAT = "tokenbatch.TokenBudgetBatchSampler/1"
#: Seed stream of the plans that finish an epoch after a change of world size.
_RESIZE_STREAM = 0x7265_7369_7A65
_OVERSIZE = ("error", "truncate", "split", "drop")


class TokenBudgetBatchSampler(Sampler[BatchIndices]):
    """Batch sampler whose batches fill a token budget, for single- and multi-GPU training.

    Use it as ``DataLoader(dataset, batch_sampler=sampler, collate_fn=...)``. Each epoch,
    every rank builds the same plan from ``(lengths, seed, epoch)`` without communicating,
    and runs its column of it:

    * **Equal steps, nothing lost.** Every rank gets exactly ``len(sampler)`` batches and
      every sequence is used exactly once per epoch across all ranks. When the number of
      bins does not divide by ``num_replicas``, the costliest bins are cut between their
      sequences until it does (see :func:`tokenbatch.distribute.plan_epoch`); with
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
        lengths: token count of every dataset item, in dataset order.
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

    Raises:
        InvalidValueError: ``rank >= num_replicas``, lengths that disagree with
            ``dataset``, too few sequences for ``num_replicas`` ranks without
            ``drop_last``, or an invalid option.
        OversizeError: a sequence longer than ``max_tokens`` with ``oversize="error"``.
    """

    def __init__(
        self,
        lengths: Sequence[int] | npt.NDArray[np.integer[Any]],
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
    ) -> None:
        super().__init__()
        array = np.array(as_lengths(lengths), dtype=np.int64)
        array.flags.writeable = False
        if dataset is not None and len(dataset) != len(array):
            raise InvalidValueError(
                f"lengths has {len(array)} entries but the dataset has {len(dataset)} items; "
                "lengths must give the token count of every dataset item, in order"
            )
        self.lengths: npt.NDArray[np.int64] = array
        self.max_tokens = as_int(max_tokens, "max_tokens", minimum=1)
        self.mode = as_choice(mode, "mode", ("packed", "padded"))
        self.algorithm = as_choice(algorithm, "algorithm", ALGORITHMS)
        self.shuffle = _as_bool(shuffle, "shuffle")
        self.seed = as_seed(seed)
        self.drop_last = _as_bool(drop_last, "drop_last")
        if balance is not None:
            as_choice(balance, "balance", ("attention", "tokens", "flops"))
        self.balance: Balance = balance
        self.hidden_size = (
            None if hidden_size is None else as_int(hidden_size, "hidden_size", minimum=1)
        )
        self.oversize = as_choice(oversize, "oversize", _OVERSIZE)
        self.max_seqs = None if max_seqs is None else as_int(max_seqs, "max_seqs", minimum=1)
        self.pad_to_multiple_of = as_int(pad_to_multiple_of, "pad_to_multiple_of", minimum=1)
        self.num_replicas, self.rank = replicas_and_rank(num_replicas, rank)
        if schedule is not None and not isinstance(schedule, BatchSchedule):
            raise InvalidTypeError(
                f"schedule must be a tokenbatch.schedule schedule, got {type(schedule).__name__}"
            )
        self.schedule = schedule
        self._epoch_tokens: dict[int, int] = {}
        self._step_offsets: tuple[int, npt.NDArray[np.int64]] | None = None
        #: Batches are ``(index, start, length)`` segments rather than indices.
        self.yields_segments = self.oversize in ("split", "truncate")
        self.epoch = 0
        # Runs of the current epoch on other world sizes before a resized resume:
        # ``(num_replicas, steps run)`` in order (see load_state_dict).
        self._resized: tuple[tuple[int, int], ...] = ()
        self._resized_tokens = 0  # real tokens those runs consumed
        self._planner: tuple[int, Planner] | None = None
        self._plan: EpochPlan | None = None
        self._plan_key: tuple[int, tuple[tuple[int, int], ...]] | None = None
        self._fingerprint: str | None = None
        self._pending_start = 0  # where the next iterator starts (set by load_state_dict)
        self._iter_start = 0  # where the current iterator started
        self._position = 0  # steps of this epoch yielded so far by the current iterator
        # Build epoch 0 now, so that oversize sequences and impossible distributions raise
        # here, on every rank, rather than inside the training loop.
        self._epoch_plan(0)

    # -- planning ---------------------------------------------------------------------

    def _repacks_every_epoch(self) -> bool:
        return self.mode == "packed" and self.algorithm == "first_fit_shuffled" and self.shuffle

    def _packing(self, epoch: int) -> Packing:
        if self.mode == "padded":
            return batch_padded(
                self.lengths,
                self.max_tokens,
                max_seqs=self.max_seqs,
                pad_to_multiple_of=self.pad_to_multiple_of,
                oversize=self.oversize,  # type: ignore[arg-type]
            )
        return pack(
            self.lengths,
            self.max_tokens,
            algorithm=self.algorithm,  # type: ignore[arg-type]
            max_seqs=self.max_seqs,
            pad_to_multiple_of=self.pad_to_multiple_of,
            oversize=self.oversize,  # type: ignore[arg-type]
            seed=mix_seed(self.seed, epoch) if self._repacks_every_epoch() else self.seed,
        )

    def _epoch_plan(self, epoch: int) -> EpochPlan:
        resized = self._resized if epoch == self.epoch else ()
        if self._plan is not None and self._plan_key == (epoch, resized):
            return self._plan
        # A schedule of batch sizes would regroup consecutive steps of this plan into
        # optimizer steps; the plan itself (one bin per rank per step) would not change.
        packing_epoch = self._packing_epoch(epoch)
        if resized:
            plan = self._plan_after_resizes(epoch, resized)
        else:
            if self._planner is None or self._planner[0] != packing_epoch:
                self._planner = (packing_epoch, self._new_planner(packing_epoch))
            plan = self._planner[1].plan(epoch)
        self._plan, self._plan_key = plan, (epoch, resized)
        return plan

    def _plan_after_resizes(self, epoch: int, resized: tuple[tuple[int, int], ...]) -> EpochPlan:
        """What is left of ``epoch`` after runs of ``(num_replicas, steps)`` on other world
        sizes, planned for this one: each run's unused bins are dealt again to the next."""
        packing = self._packing(self._packing_epoch(epoch))
        plan = self._planner_for(packing, resized[0][0], self.seed).plan(epoch)
        sizes = [replicas for replicas, _ in resized[1:]] + [self.num_replicas]
        consumed = 0
        for run, ((replicas, step), size) in enumerate(zip(resized, sizes, strict=True)):
            # Each plan is built for its run's number of ranks; only the steps can disagree.
            if step > plan.n_steps:
                raise InvalidValueError(
                    f"state['resized'] does not match the plan of epoch {epoch}: run {run} "
                    f"has {plan.n_steps} steps on {replicas} ranks, the state says {step}"
                )
            consumed += int(_bin_tokens(plan)[plan.steps[:step]].sum())
            try:
                seed = mix_seed(self.seed, _RESIZE_STREAM, run)
                planner = self._planner_for(plan.rest(step), size, seed)
            except InvalidValueError as error:
                raise InvalidValueError(
                    f"epoch {epoch} cannot be finished on {size} ranks after {step} of its "
                    f"{plan.n_steps} steps ran on {replicas}: {error}"
                ) from error
            plan = planner.plan(epoch)
        self._resized_tokens = consumed
        return plan

    def plan(self) -> EpochPlan:
        """The plan of the current epoch (all ranks' batches)."""
        return self._epoch_plan(self.epoch)

    # -- optimizer steps under a batch-size schedule ----------------------------------

    def _tokens_of(self, epoch: int) -> int:
        """Real tokens all ranks train on in ``epoch`` (cached; plans are deterministic)."""
        if epoch not in self._epoch_tokens:
            current = epoch == self.epoch and not self._resized
            plan = self._epoch_plan(epoch) if current else self._plan_of(epoch)
            self._epoch_tokens[epoch] = int(_bin_tokens(plan)[plan.steps].sum())
        return self._epoch_tokens[epoch]

    def _plan_of(self, epoch: int) -> EpochPlan:
        """The plan of another epoch, without disturbing the cached current one."""
        if not self._repacks_every_epoch() and self._planner is not None:
            return self._planner[1].plan(epoch)
        return self._new_planner(self._packing_epoch(epoch)).plan(epoch)

    def _packing_epoch(self, epoch: int) -> int:
        """The epoch whose packing ``epoch`` uses (0 unless every epoch repacks)."""
        return epoch if self._repacks_every_epoch() else 0

    def _new_planner(self, packing_epoch: int) -> Planner:
        return self._planner_for(self._packing(packing_epoch), self.num_replicas, self.seed)

    def _planner_for(self, packing: Packing, num_replicas: int, seed: int) -> Planner:
        """A planner with this sampler's options for ``packing`` on ``num_replicas`` ranks."""
        return Planner(
            packing,
            num_replicas,
            seed=seed,
            shuffle=self.shuffle,
            balance=self.balance,
            drop_last=self.drop_last,
            pad_to_multiple_of=self.pad_to_multiple_of,
            split_sequences=self.oversize == "split",
            hidden_size=self.hidden_size,
        )

    def step_offsets(self) -> npt.NDArray[np.int64] | None:
        """Optimizer steps of the current epoch under ``schedule`` (``None`` without one).

        Step ``s`` is made of this epoch's micro-batches
        ``step_offsets[s]:step_offsets[s + 1]`` (on every rank): accumulate gradients over
        them, then step the optimizer. Steps follow
        ``schedule.batch_tokens_at(tokens consumed so far)``, counting the real tokens of
        all ranks and of earlier epochs (see :func:`tokenbatch.schedule.group_into_steps`).
        The same on every rank.
        """
        if self.schedule is None:
            return None
        if self._step_offsets is None or self._step_offsets[0] != self.epoch:
            plan = self._epoch_plan(self.epoch)
            micro_batch_tokens = _bin_tokens(plan)[plan.steps].reshape(-1)
            consumed = sum(self._tokens_of(epoch) for epoch in range(self.epoch))
            consumed += self._resized_tokens if self._resized else 0
            offsets = self.schedule.group_into_steps(
                micro_batch_tokens, self.num_replicas, consumed_tokens=consumed
            )
            offsets.flags.writeable = False
            self._step_offsets = (self.epoch, offsets)
        return self._step_offsets[1]

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
        return self._pending_start

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batches the next iteration yields.

        Call it before each epoch, as with ``DistributedSampler``. Changing the epoch
        discards a position restored by :meth:`load_state_dict`; setting the same epoch
        keeps it.
        """
        epoch = as_int(epoch, "epoch", minimum=0)
        if epoch != self.epoch:
            self.epoch = epoch
            self._resized = ()
            self._step_offsets = None
            self._pending_start = self._iter_start = self._position = 0

    def __len__(self) -> int:
        """Batches per rank in the current epoch (exact, the same on every rank)."""
        return self._epoch_plan(self.epoch).n_steps

    def __iter__(self) -> Iterator[BatchIndices]:
        # A generator, so that the bookkeeping happens at the first ``next``: DataLoader
        # calls ``iter`` more than once per epoch and drops the iterators it never reads.
        plan = self._epoch_plan(self.epoch)
        start = self._pending_start
        self._pending_start = 0
        self._iter_start = self._position = start
        for batch in plan.batches(self.rank, start, segments=self.yields_segments):
            self._position += 1
            yield batch

    def stats(self) -> dict[str, int | float]:
        """Counts and balance of the current epoch's plan.

        Includes ``n_steps`` (batches per rank), ``dropped_seqs`` (sequences left out by
        ``drop_last`` or ``oversize="drop"``), ``split_bins`` (bins added to make the
        count divide by ``num_replicas``), ``padding_ratio``, and the per-step max/mean
        imbalance of tokens and of attention cost (``*_imbalance_max``,
        ``*_imbalance_mean``, ``*_sync_overhead``); see
        :meth:`tokenbatch.distribute.EpochPlan.stats`.
        """
        return self._epoch_plan(self.epoch).stats()

    # -- checkpointing ----------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "mode": self.mode,
            "algorithm": self.algorithm,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "drop_last": self.drop_last,
            "balance": self.balance,
            "oversize": self.oversize,
            "max_seqs": self.max_seqs,
            "pad_to_multiple_of": self.pad_to_multiple_of,
            "hidden_size": self.hidden_size,
            "schedule": None if self.schedule is None else repr(self.schedule),
        }

    def fingerprint(self) -> str:
        """Digest of the lengths and every option that shapes the plan but the number of
        ranks (which a state records, and a resized resume may change)."""
        if self._fingerprint is None:
            digest = hashlib.blake2b(digest_size=16)
            digest.update(self.lengths.astype("<i8", copy=False).tobytes())
            options = {k: v for k, v in self._config().items() if k != "num_replicas"}
            digest.update(repr(sorted(options.items())).encode())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """Position in the epoch, to resume exactly with :meth:`load_state_dict`.

        Args:
            consumed_batches: batches the training loop has taken from the current
                iteration (since the last ``iter(loader)``). Needed with DataLoader
                workers, which fetch batches ahead of the loop; without it the position
                is what the sampler has yielded, which is exact with ``num_workers=0``.

        The state is the same on every rank (steps are global), so saving rank 0's is
        enough. It holds ``epoch``, ``step`` (batches of the epoch already consumed per
        rank), the options, a fingerprint of the lengths and options, and ``resized``:
        the ``[num_replicas, steps]`` runs of this epoch on other world sizes before a
        resized resume (empty otherwise).
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
        return {
            "format": _STATE_FORMAT,
            "epoch": self.epoch,
            "step": step,
            "n_steps": len(self),
            "n_seqs": len(self.lengths),
            "fingerprint": self.fingerprint(),
            "config": self._config(),
            "resized": [list(run) for run in self._resized],
        }

    def load_state_dict(self, state: Mapping[str, Any], *, allow_resize: bool = False) -> None:
        """Restore a position saved by :meth:`state_dict` (possibly from another rank).

        The next iteration starts at the saved step of the saved epoch; call
        :meth:`set_epoch` with that same epoch (or not at all) before iterating.

        Args:
            state: a :meth:`state_dict`.
            allow_resize: accept a state saved with another ``num_replicas``. The epoch
                then finishes with the bins no rank had run, dealt again to this world
                size (bins are cut between their sequences, as when planning, to make
                their number divide): every sequence of the epoch is still used exactly
                once, but the batches differ from those of an uninterrupted run and
                :meth:`__len__` is the steps left. Later epochs are planned for this
                world size from the start. Needs ``drop_last=False`` with a schedule.

        Raises:
            InvalidValueError: the state comes from other lengths or options (a
                different dataset, seed...; ``num_replicas`` unless ``allow_resize``), is
                malformed, or leaves too few sequences for this many ranks.
        """
        if not isinstance(state, Mapping):
            raise InvalidTypeError(f"state must be a mapping, got {type(state).__name__}")
        if state.get("format") != _STATE_FORMAT:
            raise InvalidValueError(
                f"state is not a TokenBudgetBatchSampler state (format={state.get('format')!r})"
            )
        allow_resize = _as_bool(allow_resize, "allow_resize")
        config = state.get("config")
        saved_replicas = self.num_replicas
        if isinstance(config, Mapping):
            saved_replicas = as_int(config.get("num_replicas"), "state num_replicas", minimum=1)
            if saved_replicas != self.num_replicas and not allow_resize:
                raise InvalidValueError(
                    f"state was saved with num_replicas={saved_replicas}, this sampler has "
                    f"{self.num_replicas}; pass allow_resize=True to finish the epoch on this "
                    "world size with the sequences not yet used"
                )
            current = {**self._config(), "num_replicas": saved_replicas}
            check_same_config(config, current, "sampler")
        if state.get("n_seqs") != len(self.lengths):
            raise InvalidValueError(
                f"state was saved for a dataset of {state.get('n_seqs')} sequences, "
                f"this sampler has {len(self.lengths)}"
            )
        if state.get("fingerprint") != self.fingerprint():
            raise InvalidValueError(
                "state was saved for other sequence lengths (fingerprint mismatch): "
                "a different or modified dataset"
            )
        epoch = as_int(state.get("epoch"), "state['epoch']", minimum=0)
        step = as_int(state.get("step"), "state['step']", minimum=0)
        resized = _resize_history(state.get("resized", []))
        if saved_replicas != self.num_replicas:
            if self.schedule is not None and self.drop_last:
                raise InvalidValueError(
                    "a resized resume with a schedule needs drop_last=False (the tokens of "
                    "earlier epochs would depend on the world size)"
                )
            resized, step = (*resized, (saved_replicas, step)), 0
        previous = (self.epoch, self._resized)
        self.epoch, self._resized = epoch, resized
        try:
            n_steps = self._epoch_plan(epoch).n_steps
        except Exception:
            self.epoch, self._resized = previous
            raise
        if step > n_steps:
            self.epoch, self._resized = previous
            raise InvalidValueError(
                f"state['step']={step} is beyond the {n_steps} steps of epoch {epoch}"
            )
        self._step_offsets = None
        self._pending_start = self._iter_start = self._position = step

    def __repr__(self) -> str:
        return (
            f"TokenBudgetBatchSampler(n_seqs={len(self.lengths)}, max_tokens={self.max_tokens}, "
            f"mode={self.mode!r}, num_replicas={self.num_replicas}, rank={self.rank}, "
            f"epoch={self.epoch})"
        )


def _bin_tokens(plan: EpochPlan) -> npt.NDArray[np.int64]:
    """Real tokens of every bin of ``plan``."""
    if len(plan.bin_offsets) <= 1:
        return np.zeros(0, dtype=np.int64)
    return np.add.reduceat(plan.lengths, plan.bin_offsets[:-1]).astype(np.int64)


def _resize_history(value: object) -> tuple[tuple[int, int], ...]:
    """``state['resized']`` as ``(num_replicas, steps)`` pairs."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise InvalidValueError(f"state['resized'] must be a list of pairs, got {value!r}")
    runs = []
    for run in value:
        if not isinstance(run, Sequence) or isinstance(run, str) or len(run) != 2:
            raise InvalidValueError(f"state['resized'] holds {run!r}, not [num_replicas, steps]")
        runs.append(
            (
                as_int(run[0], "state['resized'] num_replicas", minimum=1),
                as_int(run[1], "state['resized'] steps", minimum=0),
            )
        )
    return tuple(runs)


def _as_bool(value: object, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidTypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)
