"""Evaluation passes: every document exactly once across ranks, with equal steps.

::

    sampler = EvaluationBatchSampler(lengths, max_tokens=8192)   # ranks from torch.distributed
    loader = DataLoader(EvaluationDataset(dataset), batch_sampler=sampler,
                        collate_fn=EvaluationCollator())
    losses = DocumentLosses(len(dataset))
    with torch.no_grad():
        for batch in loader:
            logits = model(**model_inputs(batch)).logits
            losses.add_batch(logits, batch)
    result = losses.reduce()        # result.loss, result.document_losses: the same on every rank

The sampler packs the documents and deals the bins in the Rust core, identically on every
rank and without shuffling; when the bins do not divide by the number of ranks, the last
step gives the ranks left without a bin an empty micro-batch, which
:class:`EvaluationCollator` turns into a one-token row with no label (marked
``padding_batch``), so every rank runs the model, and takes part in its collectives, the
same number of times. No bin is cut or repeated to even the ranks out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Sized
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import Dataset, Sampler

from tokenbatch import _core
from tokenbatch._convert import as_choice, as_int, as_lengths, replicas_and_rank
from tokenbatch.distribute import Balance
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.packing import Packing, pack
from tokenbatch.torch._items import item_tokens
from tokenbatch.torch._row import row_collator
from tokenbatch.torch._sampler_options import check_early
from tokenbatch.torch.collate import PackedCollator

__all__ = [
    "EMPTY_SLOT",
    "EVALUATION_KEYS",
    "EvaluationBatchSampler",
    "EvaluationCollator",
    "EvaluationDataset",
    "model_inputs",
]

#: The bin of a slot of :attr:`EvaluationBatchSampler.steps` where the rank runs an empty
#: micro-batch.
EMPTY_SLOT: int = _core.EMPTY_SLOT
#: The keys :class:`EvaluationCollator` adds to a row, which the model does not take.
EVALUATION_KEYS = ("document_ids", "empty_document_ids", "padding_batch")
#: Packing algorithms whose bins depend on the lengths alone.
_ALGORITHMS = ("bfd", "ffd", "next_fit")


class EvaluationBatchSampler(Sampler[list[int]]):
    """Batch sampler of an evaluation pass: every document exactly once across ranks, the
    same number of micro-batches on every rank.

    The documents are packed into bins of at most ``max_tokens`` tokens
    (:func:`tokenbatch.pack`) and the bins dealt costliest first, ``num_replicas`` per
    step, in the Rust core: the same plan on every rank, with no shuffling and no
    communication. When the number of bins does not divide by ``num_replicas``, the last
    step yields an empty batch (``[]``) on the ranks left without a bin; serve the batches
    with :class:`EvaluationDataset` and :class:`EvaluationCollator`, which turns an empty
    batch into a row the model can run on that holds no label.

    Args:
        lengths: token count of every document, in dataset order.
        max_tokens: token budget of one micro-batch; the longest document must fit (a
            document is never split, so that its loss is the loss of the whole document).
        num_replicas: number of data-parallel ranks; default: the world size of the
            initialized default process group, else 1.
        rank: this process's rank; default: its rank in the default group, else 0.
        algorithm: ``"bfd"``, ``"ffd"`` or ``"next_fit"`` (see :func:`tokenbatch.pack`).
        balance: the cost that orders the bins, so that the bins of one step cost about
            the same: ``"attention"``, ``"tokens"``, ``"flops"`` (needs ``hidden_size``)
            or ``None`` (packing order).
        max_seqs: at most this many documents in one micro-batch.
        pad_to_multiple_of: each document costs its length rounded up to this multiple
            (as :class:`~tokenbatch.torch.PackedCollator`'s ``pad_each_to_multiple_of``).
        hidden_size: the model's hidden size, for ``balance="flops"``.
        dataset: optional; when given, its length must equal ``len(lengths)``.

    Raises:
        InvalidValueError: no documents, ``rank >= num_replicas``, lengths that disagree
            with ``dataset``, or an invalid option.
        OversizeError: a document longer than ``max_tokens``.
    """

    def __init__(
        self,
        lengths: Sequence[int] | npt.NDArray[np.integer[Any]],
        max_tokens: int,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        algorithm: str = "bfd",
        balance: Balance = "attention",
        max_seqs: int | None = None,
        pad_to_multiple_of: int = 1,
        hidden_size: int | None = None,
        dataset: Sized | None = None,
    ) -> None:
        super().__init__()
        array = as_lengths(lengths)
        if len(array) == 0:
            raise InvalidValueError("an evaluation pass needs at least one document, got none")
        check_early(array, dataset, balance)
        self.num_replicas, self.rank = replicas_and_rank(num_replicas, rank)
        multiple = as_int(pad_to_multiple_of, "pad_to_multiple_of", minimum=1)
        self.packing: Packing = pack(
            array,
            as_int(max_tokens, "max_tokens", minimum=1),
            algorithm=as_choice(algorithm, "algorithm", _ALGORITHMS),  # type: ignore[arg-type]
            max_seqs=max_seqs,
            pad_to_multiple_of=multiple,
        )
        #: ``(n_steps, num_replicas)``: the bin of :attr:`packing` each rank runs at each
        #: step, or :data:`EMPTY_SLOT` (read-only; the same on every rank).
        self.steps: npt.NDArray[np.int64] = _core.evaluation_table(
            self.packing,
            self.num_replicas,
            balance=balance,
            pad_to_multiple_of=multiple,
            hidden_size=None if hidden_size is None else as_int(hidden_size, "hidden_size"),
        )
        self.steps.flags.writeable = False

    @property
    def n_documents(self) -> int:
        """Documents of the pass (``len(lengths)``)."""
        return int(self.packing.n_seqs)

    def __len__(self) -> int:
        """Micro-batches per rank (the same on every rank)."""
        return int(self.steps.shape[0])

    def __iter__(self) -> Iterator[list[int]]:
        for bin_index in self.steps[:, self.rank].tolist():
            yield [] if bin_index == EMPTY_SLOT else self.packing[bin_index].tolist()

    def rank_documents(self, rank: int | None = None) -> npt.NDArray[np.int64]:
        """The documents ``rank`` (default: this one) evaluates, in the order it runs them."""
        rank = self.rank if rank is None else as_int(rank, "rank", minimum=0)
        if rank >= self.num_replicas:
            raise InvalidValueError(
                f"rank must be smaller than num_replicas={self.num_replicas}, got {rank}"
            )
        bins = self.steps[:, rank]
        bins = bins[bins != EMPTY_SLOT]
        offsets = self.packing.bin_offsets
        if len(bins) == 0:
            return np.zeros(0, dtype=np.int64)
        # Segment ranges of the bins, gathered without a Python loop per bin.
        counts = offsets[bins + 1] - offsets[bins]
        starts = np.repeat(offsets[bins] - np.cumsum(counts) + counts, counts)
        return self.packing.indices[starts + np.arange(int(counts.sum()))]

    def __repr__(self) -> str:
        return (
            f"EvaluationBatchSampler(n_documents={self.n_documents}, "
            f"n_steps={len(self)}, num_replicas={self.num_replicas}, rank={self.rank})"
        )


class EvaluationDataset(Dataset[tuple[int, Any]]):
    """Serve ``(index, item)`` pairs of a map-style dataset, so that
    :class:`EvaluationCollator` knows which document each item is."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[int, Any]:
        return index, self.dataset[index]


class EvaluationCollator:
    """Collate the ``(index, item)`` pairs of an :class:`EvaluationDataset` into one
    padding-free row, marking which document each of its sequences is.

    The row is ``collator``'s (a :class:`~tokenbatch.torch.PackedCollator`, default
    settings unless given), with two keys added (:data:`EVALUATION_KEYS`):

    * ``document_ids``: int64 tensor, the document of each sequence of the row, in row
      order (the row's sequences after these are padding);
    * ``empty_document_ids``: int64 tensor, the documents of the batch without tokens,
      which have no sequence in the row (so that the pass still accounts for them);
    * ``padding_batch``: ``True`` for the empty batch that evens out the ranks' steps: its
      row is a single ``pad_token_id`` with no label and ``document_ids`` is empty, so the
      model runs on it and nothing enters the losses.
    """

    def __init__(self, collator: PackedCollator | None = None) -> None:
        self.collator = row_collator(collator)

    def __call__(self, pairs: Sequence[tuple[int, Any]]) -> dict[str, Any]:
        """Collate one batch of the sampler (an empty one into the padding row)."""
        collator = self.collator
        if not pairs:
            row = collator([{collator.input_key: [collator.pad_token_id]}])
            row["document_ids"] = torch.zeros(0, dtype=torch.int64)
            row["empty_document_ids"] = torch.zeros(0, dtype=torch.int64)
            row["padding_batch"] = True
            return row
        documents: list[int] = []
        empty: list[int] = []
        items: list[Any] = []
        for position, pair in enumerate(pairs):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise InvalidTypeError(
                    f"batch item {position} is a {type(pair).__name__}, not an (index, item) "
                    "pair: wrap the dataset in EvaluationDataset"
                )
            index, item = pair
            items.append(item)
            # The row collator skips empty documents: their ids go apart.
            has_tokens = len(item_tokens(item, collator.input_key, index)) > 0
            (documents if has_tokens else empty).append(as_int(index, "document index", minimum=0))
        row = collator(items)
        row["document_ids"] = torch.tensor(documents, dtype=torch.int64)
        row["empty_document_ids"] = torch.tensor(empty, dtype=torch.int64)
        row["padding_batch"] = False
        return row


def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of an evaluation row a model takes: all but :data:`EVALUATION_KEYS`."""
    return {key: value for key, value in batch.items() if key not in EVALUATION_KEYS}
