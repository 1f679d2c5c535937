"""Packing of streams of unknown length with a bounded buffer.

:class:`StreamPacker` reads items from any iterable, keeps at most ``buffer_size``
sequences (or pieces of sequences) in memory, and repacks the buffer with the Rust core
whenever it fills up: the well-filled bins leave, the least-filled ones stay and are
repacked with the next items. Memory is independent of the stream length, and with a
buffer of a few thousand sequences the fill is within a fraction of a percent of packing
the whole stream at once.

:class:`tokenbatch.torch.StreamingDataset` is the ``torch.utils.data.IterableDataset``
around it: it shards the stream by data-parallel rank and DataLoader worker, collates
every bin, and resumes from a small state dict. This module does not import torch.

The packer is deterministic: the same stream, options and seed give the same bins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

from tokenbatch import _core
from tokenbatch._convert import (
    as_bool,
    as_choice,
    as_int,
    as_seed,
    as_str,
    check_same_config,
    check_state_format,
)
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.packing import Algorithm, OversizePolicy

__all__ = ["StreamPacker"]

#: A piece of a stream item: ``(position, start, length)``, tokens ``start:start + length``
#: of the item at ``position`` in the stream (counted from 0 over the whole stream).
StreamSegment = tuple[int, int, int]

_INT64_MAX = 2**63 - 1
_STATE_KIND = "tokenbatch.StreamPacker"
#: The state format: the version is that of the core's buffer policy and shuffle.
_STATE_FORMAT = f"{_STATE_KIND}/{_core.StreamBuffer.STATE_VERSION}"


class StreamPacker:
    """Pack a stream of token sequences into bins of at most ``max_tokens`` tokens.

    Iterating yields one bin at a time: the list of its items (or, with
    ``output="segments"``, of its ``(position, start, length)`` segments), in stream order
    inside the bin. Items are mappings holding ``key`` (lists, arrays or tensors of
    tokens) or token sequences themselves; a piece of a split item is the item with its
    token fields (``token_keys``) cut to the piece.

    How it packs (in the Rust core; this class reads the source and hands over lengths):
    items enter a buffer; when it holds ``buffer_size`` segments, the buffer is packed
    like :func:`tokenbatch.pack` does (best-fit decreasing by default). Bins at least
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
            tokens, ``"drop"``, or ``"error"`` (raises :class:`OversizeError`), exactly as
            :func:`tokenbatch.pack` does.
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
        oversize: OversizePolicy = "split",
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
        self.max_tokens = as_int(max_tokens, "max_tokens")
        self.buffer_size = as_int(buffer_size, "buffer_size")
        self.algorithm = as_str(algorithm, "algorithm")
        self.max_seqs = None if max_seqs is None else as_int(max_seqs, "max_seqs")
        self.oversize = as_str(oversize, "oversize")
        self.key = as_str(key, "key")
        if isinstance(token_keys, str):
            raise InvalidTypeError("token_keys must be a sequence of field names, not a string")
        self.token_keys = (key, "labels") if token_keys is None else tuple(token_keys)
        self.length_fn = length_fn
        self.shuffle = as_bool(shuffle, "shuffle")
        self.seed = as_seed(seed)
        self.num_shards = as_int(num_shards, "num_shards")
        self.shard = as_int(shard, "shard")
        self.output = as_choice(output, "output", ("items", "segments"))
        self._buffer = self._new_buffer()  # the core checks the values
        self._restoring = False

    def _new_buffer(self) -> _core.StreamBuffer:
        return _core.StreamBuffer(
            self.max_tokens,
            buffer_size=self.buffer_size,
            algorithm=self.algorithm,
            max_seqs=self.max_seqs,
            oversize=self.oversize,
            shuffle=self.shuffle,
            seed=self.seed,
            num_shards=self.num_shards,
            shard=self.shard,
        )

    # -- state ---------------------------------------------------------------------------

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

        Small, plain JSON: the format version, the options, the next stream position to
        read and the ``(position, start, length)`` of the segments still buffered (at most
        ``buffer_size``) or packed but not yielded, never the tokens.
        """
        state = self._buffer.state()
        return {
            "format": _STATE_FORMAT,
            "config": self._config(),
            "next_position": state["next_position"],
            "round": state["round"],
            "yielded_bins": state["yielded_bins"],
            "dropped_seqs": state["dropped_seqs"],
            "buffer": [list(segment) for segment in state["buffer"]],
            "pending": [[list(segment) for segment in bin_] for bin_ in state["pending"]],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state saved by :meth:`state_dict`; the next iteration continues with
        the bin that would have followed, re-reading the buffered items from the source.

        Raises:
            InvalidValueError: the state was saved with other options, by another format
                version (which would not continue the same stream), or is malformed.
        """
        if not isinstance(state, Mapping):
            raise InvalidTypeError(f"state must be a mapping, got {type(state).__name__}")
        check_state_format(state.get("format"), _STATE_FORMAT, "StreamPacker")
        config = state.get("config")
        if not isinstance(config, Mapping):
            raise InvalidValueError("state has no 'config' mapping")
        check_same_config(config, self._config(), "packer")
        try:
            fields = {
                name: as_int(state[name], f"state[{name!r}]", minimum=0)
                for name in ("next_position", "round", "yielded_bins", "dropped_seqs")
            }
            buffer = [_segment(segment) for segment in state["buffer"]]
            pending = [[_segment(segment) for segment in bin_] for bin_ in state["pending"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidValueError(f"malformed StreamPacker state: {exc}") from exc
        self._buffer.restore(**fields, buffer=buffer, pending=pending)
        self._restoring = True

    @property
    def dropped_seqs(self) -> int:
        """Items left out so far (``oversize="drop"``)."""
        return self._buffer.dropped_seqs

    @property
    def yielded_bins(self) -> int:
        """Bins yielded so far, counting those before a restored state."""
        return self._buffer.yielded_bins

    # -- reading -------------------------------------------------------------------------

    def _length(self, item: Any, position: int) -> int:
        if self.length_fn is not None:
            length = self.length_fn(item)
            if type(length) is int and 0 <= length <= _INT64_MAX:  # the common case, fast
                return length
            return as_int(length, f"length of stream item {position}")
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

    def _open(
        self, held: list[int], items: dict[int, tuple[Any, int]]
    ) -> Iterator[tuple[int, Any]]:
        """Fetch the items at the ``held`` positions (buffered before a resume) into
        ``items``, and return the ``(position, item)`` of this shard from the next
        position on."""
        source = self.source
        start = self._buffer.next_position
        if _indexable(source):
            indexable: Any = source
            total = len(indexable)
            for position in held:
                if position >= total:
                    raise InvalidValueError(
                        f"the source has {total} items, but the saved state refers to "
                        f"position {position}"
                    )
                item = indexable[position]
                items[position] = (item, self._length(item, position))
            return ((p, indexable[p]) for p in range(start, total, self.num_shards))
        needed = set(held)
        stream = enumerate(source)
        if start > 0 or needed:
            for position, item in stream:
                if position in needed:
                    items[position] = (item, self._length(item, position))
                if position >= start - 1:
                    break
            missing = needed - items.keys()
            if missing:
                raise InvalidValueError(
                    "the source has fewer items than the saved state refers to "
                    f"(position {min(missing)} is missing)"
                )
        return ((p, item) for p, item in stream if p >= start and p % self.num_shards == self.shard)

    # -- packing -------------------------------------------------------------------------

    def _emit(self, taken: _core.StreamBin, items: dict[int, tuple[Any, int]]) -> list[Any]:
        if self.output == "segments":
            return taken.segments
        result = [self._cut(items[p], start, length) for p, start, length in taken.segments]
        for position in taken.released:
            del items[position]
        return result

    def _cut(self, entry: tuple[Any, int], start: int, length: int) -> Any:
        item, full_length = entry
        if start == 0 and length == full_length:
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
            self._buffer = self._new_buffer()
        self._restoring = False
        buffer = self._buffer
        keep_items = self.output == "items"
        items: dict[int, tuple[Any, int]] = {}  # items with segments held by the buffer
        reader = self._open(buffer.held_positions() if keep_items else [], items)
        while True:
            while (taken := buffer.take_bin()) is not None:
                yield self._emit(taken, items)
            entry = next(reader, None)
            if entry is None:
                break
            position, item = entry
            length = self._length(item, position)
            if buffer.push(position, length) and keep_items:
                items[position] = (item, length)
        buffer.finish()
        while (taken := buffer.take_bin()) is not None:
            yield self._emit(taken, items)

    def __repr__(self) -> str:
        return (
            f"StreamPacker(max_tokens={self.max_tokens}, buffer_size={self.buffer_size}, "
            f"shard={self.shard}/{self.num_shards}, yielded_bins={self.yielded_bins})"
        )


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
