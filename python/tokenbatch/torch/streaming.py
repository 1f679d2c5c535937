"""A ``torch.utils.data.IterableDataset`` that packs a stream: :class:`StreamingDataset`."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableSequence, Sequence
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from tokenbatch import _core
from tokenbatch._convert import as_int, check_state_format, replicas_and_rank
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.packing import Algorithm, OversizePolicy
from tokenbatch.stream import StreamPacker

__all__ = ["StreamingDataset"]

#: Follows the stream packer's version: a count of consumed bins names other bins under
#: another packer.
_STATE_FORMAT = f"tokenbatch.StreamingDataset/{_core.StreamBuffer.STATE_VERSION}"


class StreamingDataset(IterableDataset[Any]):
    """A ``torch.utils.data.IterableDataset`` that packs a stream with
    :class:`tokenbatch.StreamPacker` and yields one collated bin per iteration step.

    Use it with ``DataLoader(dataset, batch_size=None, num_workers=...)``: each bin is
    already a micro-batch. The stream is sharded by data-parallel rank and DataLoader
    worker: shard ``worker * num_replicas + rank`` of ``num_replicas * num_workers`` reads
    the items at positions ``p`` with ``p % n_shards == shard`` (so rank ``r`` gets the
    items with ``p % num_replicas == r``); no item is read by two shards and none is
    skipped. ``num_replicas`` and ``rank`` default to the initialized process group.

    Args:
        source, max_tokens: as for :class:`tokenbatch.StreamPacker` (an indexable source
            lets each shard read only its own items).
        collate_fn: applied to each bin's list of items in the worker (for example
            :class:`tokenbatch.torch.PackedCollator`); ``None`` yields the lists.
        num_replicas, rank: data-parallel layout.
        Other arguments: those of :class:`tokenbatch.StreamPacker`.

    Shards hold different numbers of bins, since the stream's length is unknown: train
    for a fixed number of steps, or iterate through :func:`tokenbatch.torch.stop_together`
    so that all ranks stop when one runs out.
    """

    def __init__(
        self,
        source: Iterable[Any],
        max_tokens: int,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        buffer_size: int = 4096,
        algorithm: Algorithm = "bfd",
        max_seqs: int | None = None,
        oversize: OversizePolicy = "split",
        key: str = "input_ids",
        token_keys: Sequence[str] | None = None,
        length_fn: Callable[[Any], int] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        self.num_replicas, self.rank = replicas_and_rank(num_replicas, rank)
        self.collate_fn = collate_fn
        self._options: dict[str, Any] = {
            "buffer_size": buffer_size,
            "algorithm": algorithm,
            "max_seqs": max_seqs,
            "oversize": oversize,
            "key": key,
            "token_keys": token_keys,
            "length_fn": length_fn,
            "shuffle": shuffle,
            "seed": seed,
        }
        self.source = source
        self.max_tokens = max_tokens
        # Validate every option now, in the main process, not in a loader worker.
        self._packer(self.num_replicas, self.rank)
        self._resume: Mapping[str, Any] | None = None
        # Which workers already started from ``_resume`` (see ``_claim_resume``).
        self._resume_claims: MutableSequence[int] | None = None
        self._live: StreamPacker | None = None  # the packer iterated in this process

    def _packer(self, num_shards: int, shard: int) -> StreamPacker:
        return StreamPacker(
            self.source, self.max_tokens, num_shards=num_shards, shard=shard, **self._options
        )

    def _claim_resume(self, worker: int, workers: int) -> Mapping[str, Any] | None:
        """The loaded state, for the first iteration after :meth:`load_state_dict` only.

        Iteration runs in DataLoader workers, on copies of this object that die with the
        iteration, so clearing the state in the copy would leave it set here and every
        later epoch would skip batches again. Instead each worker marks its slot in
        memory shared with this process (and with the workers of later epochs) when it
        starts from the state; a worker that finds its slot marked starts afresh.
        """
        resume, claims = self._resume, self._resume_claims
        if resume is None or claims is None:
            return None
        if max(1, resume["num_workers"]) != workers:
            raise InvalidValueError(
                f"the state was saved with num_workers={resume['num_workers']}; resume "
                "with the same number of DataLoader workers"
            )
        if claims[worker]:
            return None
        claims[worker] = 1
        return resume

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        skip = 0
        role = worker  # which shard this worker reads
        resume = self._claim_resume(worker, workers)
        if resume is not None and resume.get("packer") is None:
            # The loader takes batches from workers 0, 1, ... in turn, so the next batch
            # of the interrupted run came from worker ``consumed % workers``: that shard
            # goes to worker 0 now, the next one to worker 1, and so on.
            consumed = resume["consumed_batches"]
            role = (worker + consumed) % workers
            skip = (consumed - role + workers - 1) // workers
        # Shard ``role * num_replicas + rank``: item ``p`` goes to rank ``p % num_replicas``
        # whatever the number of workers.
        packer = self._packer(self.num_replicas * workers, role * self.num_replicas + self.rank)
        if resume is not None and resume.get("packer") is not None:
            packer.load_state_dict(resume["packer"])
        self._live = packer if info is None else None
        collate = self.collate_fn
        for bin_ in packer:
            if skip:
                skip -= 1
                continue
            yield bin_ if collate is None else collate(bin_)

    def state_dict(
        self, consumed_batches: int | None = None, *, num_workers: int = 0
    ) -> dict[str, Any]:
        """The position of this rank's stream, to resume with :meth:`load_state_dict`.

        Args:
            consumed_batches: batches this rank's training loop has taken from the stream
                in total (counting those before an earlier resume); needed with DataLoader
                workers (``num_workers > 0``), which run ahead of the loop.
            num_workers: the DataLoader's ``num_workers``.

        With ``num_workers=0`` the state is exact and small: the packer's position and
        the positions of its buffered items (see :meth:`tokenbatch.StreamPacker.state_dict`).
        With workers, it is the count of consumed batches: on resume each worker repacks
        its shard from the start and skips the bins it had delivered (the loader takes
        batches from its workers in turn, so this is exact while no worker's shard has run
        out).
        """
        workers = as_int(num_workers, "num_workers", minimum=0)
        state: dict[str, Any] = {
            "format": _STATE_FORMAT,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "num_workers": workers,
            "consumed_batches": None,
            "packer": None,
        }
        if workers == 0:
            live = self._live
            if live is None:
                raise InvalidValueError(
                    "this dataset was not iterated in this process; with DataLoader workers "
                    "pass num_workers= and consumed_batches="
                )
            if consumed_batches is not None and consumed_batches != live.yielded_bins:
                raise InvalidValueError(
                    f"consumed_batches={consumed_batches} but {live.yielded_bins} batches were "
                    "yielded; without workers the state is the position after the last batch"
                )
            state["consumed_batches"] = live.yielded_bins
            state["packer"] = live.state_dict()
            return state
        if consumed_batches is None:
            raise InvalidValueError("with DataLoader workers, pass consumed_batches=")
        state["consumed_batches"] = as_int(consumed_batches, "consumed_batches", minimum=0)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration (the next epoch's loader)
        continues after the last consumed batch; the iterations after it start from the
        beginning of the stream again.

        Raises:
            InvalidValueError: the state belongs to another rank layout, to another format
                version, or is malformed.
        """
        if not isinstance(state, Mapping):
            raise InvalidTypeError(f"state must be a mapping, got {type(state).__name__}")
        check_state_format(state.get("format"), _STATE_FORMAT, "StreamingDataset")
        for name in ("num_replicas", "rank"):
            if state.get(name) != getattr(self, name):
                raise InvalidValueError(
                    f"state was saved with {name}={state.get(name)!r}, "
                    f"this dataset has {name}={getattr(self, name)!r}"
                )
        workers = as_int(state.get("num_workers"), "state['num_workers']", minimum=0)
        if state.get("packer") is not None:
            # Check it against this configuration now rather than in a worker.
            self._packer(self.num_replicas, self.rank).load_state_dict(state["packer"])
        else:
            as_int(state.get("consumed_batches"), "state['consumed_batches']", minimum=0)
        self._resume = dict(state)
        self._resume_claims = _shared_claims(bytes(max(1, workers)))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        claims = state["_resume_claims"]
        if claims is not None and multiprocessing.context.get_spawning_popen() is None:
            # A copy (pickle, deepcopy), not a worker being started: it shares no memory
            # with this object, and gets shared claims of its own (``__setstate__``).
            state["_resume_claims"] = bytes(claims)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["_resume_claims"], bytes):
            state["_resume_claims"] = _shared_claims(state["_resume_claims"])
        self.__dict__.update(state)


def _shared_claims(values: bytes) -> MutableSequence[int]:
    """Flags in memory shared with the DataLoader's worker processes: inherited through
    fork, or passed along when a spawned worker receives the dataset."""
    claims: MutableSequence[int] = multiprocessing.RawArray("b", values)
    return claims
