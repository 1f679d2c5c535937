"""Packing of streams of unknown length with a bounded buffer.

:class:`StreamPacker` reads items from any iterable, keeps at most ``buffer_size``
sequences (or pieces of sequences) in memory, and repacks the buffer with the Rust core
whenever it fills up: the well-filled bins leave, the least-filled ones stay and are
repacked with the next items. Memory is independent of the stream length, and with a
buffer of a few thousand sequences the fill is within a fraction of a percent of packing
the whole stream at once.

:class:`StreamingDataset` is the ``torch.utils.data.IterableDataset`` around it: it
shards the stream by data-parallel rank and DataLoader worker (sequence ``p`` belongs to
shard ``p mod n_shards``), collates every bin, and resumes from a small state dict.

Both are deterministic: the same stream, options and seed give the same bins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from tokenbatch._convert import as_choice, as_int, as_seed, check_same_config, replicas_and_rank
from tokenbatch.distribute import _permutation, mix_seed
from tokenbatch.errors import InvalidTypeError, InvalidValueError, OversizeError
from tokenbatch.packing import ALGORITHMS, Algorithm, pack

if TYPE_CHECKING:
    from torch.utils.data import IterableDataset

__all__ = ["StreamPacker", "StreamingDataset"]

#: A piece of a stream item: ``(position, start, length)``, tokens ``start:start + length``
#: of the item at ``position`` in the stream (counted from 0 over the whole stream).
StreamSegment = tuple[int, int, int]
StreamOversize = Literal["error", "truncate", "split", "drop"]

_STATE_FORMAT = "tokenbatch.StreamPacker/1"
_DATASET_STATE_FORMAT = "tokenbatch.StreamingDataset/1"
_OVERSIZE = ("error", "truncate", "split", "drop")
# A bin this full leaves the buffer even when there is room to keep it: repacking it could
# gain at most this fraction of a bin.
_FULL_ENOUGH = 0.995


class StreamPacker:
    """Pack a stream of token sequences into bins of at most ``max_tokens`` tokens.

    Iterating yields one bin at a time: the list of its items (or, with
    ``output="segments"``, of its ``(position, start, length)`` segments), in stream order
    inside the bin. Items are mappings holding ``key`` (lists, arrays or tensors of
    tokens) or token sequences themselves; a piece of a split item is the item with its
    token fields (``token_keys``) cut to the piece.

    How it packs: items enter a buffer; when it holds ``buffer_size`` segments, the buffer
    is packed with :func:`tokenbatch.pack` (best-fit decreasing by default). Bins at least
    99.5% full, and then the fullest others, leave the buffer until at most half of it is
    still occupied; the least-filled bins stay, to be repacked with the next items. At the
    end of the stream everything left is packed and emitted. With ``shuffle=True`` the
    bins that leave together are yielded in a seeded random order.

    Args:
        source: an iterable of items. A sized, indexable source (a list, a Hugging Face
            ``Dataset``) is read by index, so that a shard reads only its own items and a
            resume reads only what it needs; any other iterable is read from its start.
        max_tokens: token budget of one bin.
        buffer_size: segments held at most (the memory bound); at least 2.
        algorithm: packing algorithm of :func:`tokenbatch.pack` for each buffer.
        max_seqs: at most this many segments per bin.
        oversize: items longer than ``max_tokens``: ``"split"`` into pieces of
            ``max_tokens`` (no token lost), ``"truncate"`` to their first ``max_tokens``
            tokens, ``"drop"``, or ``"error"`` (raises :class:`OversizeError`).
        key: the token field of mapping items (lengths are ``len(item[key])``).
        token_keys: the fields cut when an item is split or truncated (default: ``key``
            and ``"labels"``, those present).
        length_fn: computes an item's length instead of ``len(item[key])``.
        shuffle: yield the bins that leave the buffer together in a random order.
        seed: seed of that order.
        num_shards, shard: read only the items at positions ``p`` with
            ``p % num_shards == shard`` (data-parallel ranks times loader workers).
        output: ``"items"`` (default) or ``"segments"``.

    Raises:
        InvalidValueError: invalid options, or an item without ``key``.
        OversizeError: an item longer than ``max_tokens`` with ``oversize="error"``.
    """

    def __init__(
        self,
        source: Iterable[Any],
        max_tokens: int,
        *,
        buffer_size: int = 4096,
        algorithm: Algorithm = "bfd",
        max_seqs: int | None = None,
        oversize: StreamOversize = "split",
        key: str = "input_ids",
        token_keys: Sequence[str] | None = None,
        length_fn: Callable[[Any], int] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        num_shards: int = 1,
        shard: int = 0,
        output: Literal["items", "segments"] = "items",
    ) -> None:
        if not isinstance(source, Iterable):
            raise InvalidTypeError(f"source must be iterable, got {type(source).__name__}")
        self.source = source
        self.max_tokens = as_int(max_tokens, "max_tokens", minimum=1)
        self.buffer_size = as_int(buffer_size, "buffer_size", minimum=2)
        self.algorithm = as_choice(algorithm, "algorithm", ALGORITHMS)
        self.max_seqs = None if max_seqs is None else as_int(max_seqs, "max_seqs", minimum=1)
        self.oversize = as_choice(oversize, "oversize", _OVERSIZE)
        if not isinstance(key, str):
            raise InvalidTypeError(f"key must be a string, got {key!r}")
        self.key = key
        if isinstance(token_keys, str):
            raise InvalidTypeError("token_keys must be a sequence of field names, not a string")
        self.token_keys = (key, "labels") if token_keys is None else tuple(token_keys)
        self.length_fn = length_fn
        if not isinstance(shuffle, (bool, np.bool_)):
            raise InvalidTypeError(f"shuffle must be a bool, got {shuffle!r}")
        self.shuffle = bool(shuffle)
        self.seed = as_seed(seed)
        self.num_shards = as_int(num_shards, "num_shards", minimum=1)
        self.shard = as_int(shard, "shard", minimum=0)
        if self.shard >= self.num_shards:
            raise InvalidValueError(
                f"shard must be in [0, num_shards - 1] = [0, {self.num_shards - 1}], "
                f"got shard={self.shard}"
            )
        self.output = as_choice(output, "output", ("items", "segments"))
        self._restoring = False
        self._reset()

    # -- state ---------------------------------------------------------------------------

    def _reset(self) -> None:
        self._next_position = self.shard  # next stream position this shard reads
        self._round = 0  # buffer repacks so far
        self._buffer: list[StreamSegment] = []
        self._pending: list[list[StreamSegment]] = []  # packed bins not yet yielded
        self._items: dict[int, Any] = {}  # items with segments in the buffer or pending
        self._refs: dict[int, int] = {}  # segments of each item not yet yielded
        self._dropped = 0
        self._yielded = 0
        self._restoring = False

    def _config(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "buffer_size": self.buffer_size,
            "algorithm": self.algorithm,
            "max_seqs": self.max_seqs,
            "oversize": self.oversize,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "num_shards": self.num_shards,
            "shard": self.shard,
        }

    def state_dict(self) -> dict[str, Any]:
        """Position after the last bin yielded, to resume with :meth:`load_state_dict`.

        Small: the next stream position to read and the ``(position, start, length)`` of
        the segments still buffered, at most ``buffer_size`` of them, never the tokens.
        """
        return {
            "format": _STATE_FORMAT,
            "config": self._config(),
            "next_position": self._next_position,
            "round": self._round,
            "yielded_bins": self._yielded,
            "dropped_seqs": self._dropped,
            "buffer": [list(segment) for segment in self._buffer],
            "pending": [[list(segment) for segment in bin_] for bin_ in self._pending],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state saved by :meth:`state_dict`; the next iteration continues with
        the bin that would have followed, re-reading the buffered items from the source.

        Raises:
            InvalidValueError: the state was saved with other options or is malformed.
        """
        if not isinstance(state, Mapping):
            raise InvalidTypeError(f"state must be a mapping, got {type(state).__name__}")
        if state.get("format") != _STATE_FORMAT:
            raise InvalidValueError(
                f"state is not a StreamPacker state (format={state.get('format')!r})"
            )
        config = state.get("config")
        if not isinstance(config, Mapping):
            raise InvalidValueError("state has no 'config' mapping")
        check_same_config(config, self._config(), "packer")
        try:
            buffer = [_segment(segment) for segment in state["buffer"]]
            pending = [[_segment(segment) for segment in bin_] for bin_ in state["pending"]]
            next_position = as_int(state["next_position"], "state['next_position']", minimum=0)
            rounds = as_int(state["round"], "state['round']", minimum=0)
            yielded = as_int(state["yielded_bins"], "state['yielded_bins']", minimum=0)
            dropped = as_int(state["dropped_seqs"], "state['dropped_seqs']", minimum=0)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidValueError(f"malformed StreamPacker state: {exc}") from exc
        self._reset()
        self._next_position = next_position
        self._round = rounds
        self._yielded = yielded
        self._dropped = dropped
        self._buffer = buffer
        self._pending = pending
        self._restoring = True

    @property
    def dropped_seqs(self) -> int:
        """Items left out so far (``oversize="drop"``)."""
        return self._dropped

    # -- reading -------------------------------------------------------------------------

    def _length(self, item: Any, position: int) -> int:
        if self.length_fn is not None:
            return as_int(self.length_fn(item), f"length of stream item {position}", minimum=0)
        tokens = item
        if isinstance(item, Mapping):
            if self.key not in item:
                raise InvalidValueError(
                    f"stream item {position} has no {self.key!r} field "
                    f"(fields: {', '.join(map(repr, item))})"
                )
            tokens = item[self.key]
        try:
            return len(tokens)
        except TypeError:
            raise InvalidTypeError(
                f"stream item {position}: {type(tokens).__name__} has no length; items must "
                f"be token sequences or mappings holding {self.key!r}"
            ) from None

    def _open(self, needed: set[int]) -> Iterator[tuple[int, Any]]:
        """Fetch the items at ``needed`` positions (buffered before a resume) into
        ``_items``, and return the ``(position, item)`` of this shard from
        ``_next_position`` on."""
        source = self.source
        start = self._next_position
        if _indexable(source):
            indexable: Any = source
            total = len(indexable)
            for position in sorted(needed):
                if position >= total:
                    raise InvalidValueError(
                        f"the source has {total} items, but the saved state refers to "
                        f"position {position}"
                    )
                self._items[position] = indexable[position]
            return ((p, indexable[p]) for p in range(start, total, self.num_shards))
        items = enumerate(source)
        if start > 0 or needed:
            for position, item in items:
                if position in needed:
                    self._items[position] = item
                if position >= start - 1:
                    break
            missing = needed - self._items.keys()
            if missing:
                raise InvalidValueError(
                    "the source has fewer items than the saved state refers to "
                    f"(position {min(missing)} is missing)"
                )
        return ((p, item) for p, item in items if p >= start and p % self.num_shards == self.shard)

    # -- packing -------------------------------------------------------------------------

    def _admit(self, position: int, length: int) -> None:
        budget = self.max_tokens
        if length <= budget:
            self._buffer.append((position, 0, length))
        elif self.oversize == "split":
            self._buffer.extend(
                (position, start, min(budget, length - start)) for start in range(0, length, budget)
            )
        elif self.oversize == "truncate":
            self._buffer.append((position, 0, budget))
        elif self.oversize == "drop":
            self._dropped += 1
        else:
            raise OversizeError(
                f"stream item {position} has {length} tokens, more than max_tokens={budget}; "
                "pass oversize='truncate', 'split' or 'drop' to handle it"
            )

    def _repack(self, final: bool) -> None:
        """Pack the buffer; move the bins that leave into ``_pending``."""
        buffer = self._buffer
        if not buffer:
            return
        lengths = np.fromiter((segment[2] for segment in buffer), dtype=np.int64, count=len(buffer))
        packing = pack(lengths, self.max_tokens, algorithm=self.algorithm, max_seqs=self.max_seqs)  # type: ignore[arg-type]
        offsets = packing.bin_offsets.tolist()
        members = packing.indices.tolist()
        fill = packing.bin_tokens / self.max_tokens
        # Fullest first; the stable sort keeps the packing's order among equals.
        order = np.argsort(-fill, kind="stable").tolist()
        leaving = len(order)
        if not final:
            keep_limit = self.buffer_size // 2
            kept = 0
            for rank in range(len(order) - 1, -1, -1):
                bin_index = order[rank]
                size = offsets[bin_index + 1] - offsets[bin_index]
                if fill[bin_index] >= _FULL_ENOUGH or kept + size > keep_limit:
                    break
                kept += size
                leaving = rank
        bins = [[buffer[j] for j in members[offsets[b] : offsets[b + 1]]] for b in order[:leaving]]
        if self.shuffle and len(bins) > 1:
            permutation = _permutation(mix_seed(self.seed, self.shard, self._round), len(bins))
            bins = [bins[i] for i in permutation.tolist()]
        self._pending.extend(sorted(bin_) for bin_ in bins)
        self._buffer = [
            buffer[j] for b in order[leaving:] for j in members[offsets[b] : offsets[b + 1]]
        ]
        self._round += 1

    def _emit(self, bin_: list[StreamSegment]) -> list[Any]:
        self._yielded += 1
        if self.output == "segments":
            return list(bin_)
        items = self._items
        result = [self._cut(items[p], p, start, length) for p, start, length in bin_]
        refs = self._refs
        for position, _, _ in bin_:
            refs[position] -= 1
            if not refs[position]:
                del refs[position]
                del items[position]
        return result

    def _cut(self, item: Any, position: int, start: int, length: int) -> Any:
        if start == 0 and length == self._length(item, position):
            return item
        stop = start + length
        if isinstance(item, Mapping):
            cut = dict(item)
            for name in self.token_keys:
                if name in item and item[name] is not None:
                    cut[name] = item[name][start:stop]
            return cut
        return item[start:stop]

    def __iter__(self) -> Iterator[list[Any]]:
        """Yield the bins of the rest of the stream (from a restored state if any)."""
        if not self._restoring:
            self._reset()
        self._restoring = False
        self._items = {}
        self._refs = {}
        for segment in self._buffer:
            self._refs[segment[0]] = self._refs.get(segment[0], 0) + 1
        for bin_ in self._pending:
            for segment in bin_:
                self._refs[segment[0]] = self._refs.get(segment[0], 0) + 1
        reader = self._open(set(self._refs) if self.output == "items" else set())
        keep_items = self.output == "items"
        while True:
            while self._pending:
                yield self._emit(self._pending.pop(0))
            if len(self._buffer) >= self.buffer_size:
                self._repack(final=False)
                continue
            entry = next(reader, None)
            if entry is None:
                break
            position, item = entry
            self._next_position = position + self.num_shards
            before = len(self._buffer)
            self._admit(position, self._length(item, position))
            if keep_items and len(self._buffer) > before:
                self._items[position] = item
                self._refs[position] = len(self._buffer) - before
        self._repack(final=True)
        while self._pending:
            yield self._emit(self._pending.pop(0))

    def __repr__(self) -> str:
        return (
            f"StreamPacker(max_tokens={self.max_tokens}, buffer_size={self.buffer_size}, "
            f"shard={self.shard}/{self.num_shards}, yielded_bins={self._yielded})"
        )


class _StreamingDatasetImpl:
    """Everything of :class:`StreamingDataset` except its torch base class, so that this
    module imports without torch (the class itself is created on first use)."""

    def __init__(
        self,
        source: Iterable[Any],
        max_tokens: int,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        buffer_size: int = 4096,
        algorithm: Algorithm = "bfd",
        max_seqs: int | None = None,
        oversize: StreamOversize = "split",
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
        self._live: StreamPacker | None = None  # the packer iterated in this process

    def _packer(self, num_shards: int, shard: int) -> StreamPacker:
        return StreamPacker(
            self.source, self.max_tokens, num_shards=num_shards, shard=shard, **self._options
        )

    def __iter__(self) -> Iterator[Any]:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        skip = 0
        role = worker  # which shard this worker reads
        resume, self._resume = self._resume, None
        if resume is not None:
            saved_workers = max(1, resume["num_workers"])
            if saved_workers != workers:
                raise InvalidValueError(
                    f"the state was saved with num_workers={resume['num_workers']}; resume "
                    f"with the same number of DataLoader workers (this loader: "
                    f"{0 if info is None else workers})"
                )
            if resume.get("packer") is None:
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
        the positions of its buffered items (see :meth:`StreamPacker.state_dict`). With
        workers, it is the count of consumed batches: on resume each worker repacks its
        shard from the start and skips the bins it had delivered (the loader takes
        batches from its workers in turn, so this is exact while no worker's shard has run
        out).
        """
        workers = as_int(num_workers, "num_workers", minimum=0)
        state: dict[str, Any] = {
            "format": _DATASET_STATE_FORMAT,
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
            if consumed_batches is not None and consumed_batches != live._yielded:
                raise InvalidValueError(
                    f"consumed_batches={consumed_batches} but {live._yielded} batches were "
                    "yielded; without workers the state is the position after the last batch"
                )
            state["consumed_batches"] = live._yielded
            state["packer"] = live.state_dict()
            return state
        if consumed_batches is None:
            raise InvalidValueError("with DataLoader workers, pass consumed_batches=")
        state["consumed_batches"] = as_int(consumed_batches, "consumed_batches", minimum=0)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration continues after the last
        consumed batch.

        Raises:
            InvalidValueError: the state belongs to another rank layout or is malformed.
        """
        if not isinstance(state, Mapping) or state.get("format") != _DATASET_STATE_FORMAT:
            raise InvalidValueError("state is not a StreamingDataset state")
        for name in ("num_replicas", "rank"):
            if state.get(name) != getattr(self, name):
                raise InvalidValueError(
                    f"state was saved with {name}={state.get(name)!r}, "
                    f"this dataset has {name}={getattr(self, name)!r}"
                )
        as_int(state.get("num_workers"), "state['num_workers']", minimum=0)
        if state.get("packer") is not None:
            # Check it against this configuration now rather than in a worker.
            self._packer(self.num_replicas, self.rank).load_state_dict(state["packer"])
        else:
            as_int(state.get("consumed_batches"), "state['consumed_batches']", minimum=0)
        self._resume = dict(state)


if TYPE_CHECKING:

    class StreamingDataset(_StreamingDatasetImpl, IterableDataset[Any]):
        """See :class:`_StreamingDatasetImpl`."""


_dataset_class: type[Any] | None = None


def __getattr__(name: str) -> Any:
    """Create :class:`StreamingDataset` (a ``torch.utils.data.IterableDataset``) on first
    use, so that importing this module does not import torch."""
    global _dataset_class
    if name != "StreamingDataset":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _dataset_class is None:
        from torch.utils.data import IterableDataset

        _dataset_class = type(
            "StreamingDataset",
            (_StreamingDatasetImpl, IterableDataset),
            {"__module__": __name__, "__doc__": _STREAMING_DATASET_DOC},
        )
    return _dataset_class


_STREAMING_DATASET_DOC = """A ``torch.utils.data.IterableDataset`` that packs a stream with
:class:`StreamPacker` and yields one collated bin per iteration step.

Use it with ``DataLoader(dataset, batch_size=None, num_workers=...)``: each bin is already
a micro-batch. The stream is sharded by data-parallel rank and DataLoader worker: shard
``worker * num_replicas + rank`` of ``num_replicas * num_workers`` reads the items at
positions ``p`` with ``p % n_shards == shard`` (so rank ``r`` gets the items with
``p % num_replicas == r``); no item is read by two shards and none is skipped.
``num_replicas`` and ``rank`` default to the initialized process group.

Args:
    source, max_tokens: as for :class:`StreamPacker` (an indexable source lets each shard
        read only its own items).
    collate_fn: applied to each bin's list of items in the worker (for example
        :class:`tokenbatch.torch.PackedCollator`); ``None`` yields the lists.
    num_replicas, rank: data-parallel layout.
    Other arguments: those of :class:`StreamPacker`.

Shards hold different numbers of bins, since the stream's length is unknown: train for a
fixed number of steps, or iterate through :func:`tokenbatch.torch.stop_together` so that
all ranks stop when one runs out.
"""


def _indexable(source: object) -> bool:
    """Sized and indexable by position (a Hugging Face ``Dataset``, a numpy array...)."""
    if isinstance(source, (str, bytes, Mapping, Iterator)):
        return False
    return hasattr(source, "__len__") and hasattr(source, "__getitem__")


def _segment(value: Any) -> StreamSegment:
    position, start, length = value
    return (
        as_int(position, "segment position", minimum=0),
        as_int(start, "segment start", minimum=0),
        as_int(length, "segment length", minimum=0),
    )
