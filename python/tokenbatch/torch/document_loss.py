"""Per-document losses of packed rows, and their exact reduction across ranks.

:func:`document_losses` turns one packed row's logits and labels into each sequence's
summed token loss and label count; :class:`DocumentLosses` collects them by document over
an evaluation pass (see :class:`~tokenbatch.torch.EvaluationBatchSampler`) and reduces them
over the ranks into an :class:`EvaluationResult`: the corpus token-mean loss and every
document's own mean, the same on every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.torch.sync import collective_device

__all__ = ["DocumentLosses", "EvaluationResult", "document_losses"]


def _row(value: Any, name: str, ndim: int) -> torch.Tensor:
    """``value`` without its leading batch dimension of 1 (a packed row has one)."""
    if not isinstance(value, torch.Tensor):
        raise InvalidTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    tensor: torch.Tensor = value
    if tensor.dim() == ndim + 1:
        if tensor.shape[0] != 1:
            raise InvalidValueError(
                f"{name} has shape {tuple(tensor.shape)}: a packed batch is one row "
                f"(a leading dimension of 1)"
            )
        tensor = tensor[0]
    if tensor.dim() != ndim:
        raise InvalidValueError(
            f"{name} must have {ndim} dimensions (or {ndim + 1} with a leading 1), "
            f"got shape {tuple(tensor.shape)}"
        )
    return tensor


def _sequence_starts(
    n_tokens: int, cu_seqlens: Any, position_ids: Any, device: torch.device
) -> torch.Tensor:
    """Offsets ``[0, ..., n_tokens]`` of the row's sequences, from either description."""
    if (cu_seqlens is None) == (position_ids is None):
        raise InvalidValueError("pass exactly one of cu_seqlens and position_ids")
    if cu_seqlens is not None:
        offsets = torch.as_tensor(cu_seqlens).to(device=device, dtype=torch.int64).reshape(-1)
        if (
            len(offsets) < 1
            or int(offsets[0]) != 0
            or int(offsets[-1]) != n_tokens
            or bool((offsets[1:] < offsets[:-1]).any())
        ):
            raise InvalidValueError(
                f"cu_seqlens must rise from 0 to the row's {n_tokens} tokens, got "
                f"{offsets.tolist()[:8]}{'...' if len(offsets) > 8 else ''}"
            )
        return offsets
    positions = _row(torch.as_tensor(position_ids), "position_ids", 1).to(device)
    if len(positions) != n_tokens:
        raise InvalidValueError(f"position_ids has {len(positions)} tokens, the row has {n_tokens}")
    # A sequence starts at the first token and wherever the positions do not count on.
    starts = torch.nonzero(positions[1:] != positions[:-1] + 1).reshape(-1) + 1
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    end = torch.full((1,), n_tokens, dtype=torch.int64, device=device)
    return torch.cat([zero, starts.to(torch.int64), end]) if n_tokens else zero


def document_losses(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    cu_seqlens: Any = None,
    position_ids: Any = None,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token cross-entropy and label count of every sequence of a packed row.

    Labels are unshifted, as Hugging Face causal LMs take them (and
    :class:`~tokenbatch.torch.PackedCollator` makes them): the logits of token ``t``
    predict ``labels[t + 1]``, and that loss belongs to the sequence of token ``t + 1``. A
    sequence's first label is never a target (it would be predicted from the previous
    sequence), whatever ``labels`` holds there.

    Args:
        logits: ``[1, T, V]`` or ``[T, V]``; computed on in at least float32.
        labels: ``[1, T]`` or ``[T]``, ``ignore_index`` where no loss is wanted.
        cu_seqlens: the ``n + 1`` offsets of the row's ``n`` sequences (the collator's
            ``cu_seqlens_padded``, which is its ``cu_seqlens`` unless each sequence is
            padded); or
        position_ids: ``[1, T]`` or ``[T]`` positions restarting with every sequence (a
            sequence starts wherever they do not count on by 1).
        ignore_index: the label of tokens without loss.

    Returns:
        ``(loss_sums, token_counts)``: float64 and int64 tensors of one entry per sequence
        of the row, on the logits' device.

    Raises:
        InvalidValueError: shapes that disagree, or offsets that do not cover the row.
    """
    logits = _row(logits, "logits", 2)
    labels = _row(labels, "labels", 1)
    n_tokens = logits.shape[0]
    if labels.shape[0] != n_tokens:
        raise InvalidValueError(f"logits have {n_tokens} tokens but labels have {labels.shape[0]}")
    device = logits.device
    offsets = _sequence_starts(n_tokens, cu_seqlens, position_ids, device)
    n_seqs = len(offsets) - 1
    sums = torch.zeros(n_seqs, dtype=torch.float64, device=device)
    counts = torch.zeros(n_seqs, dtype=torch.int64, device=device)
    if n_tokens < 2 or n_seqs == 0:
        return sums, counts
    targets = labels[1:].to(device=device, dtype=torch.int64).clone()
    # The sequence of each target token (token t + 1), by the offsets.
    positions = torch.arange(1, n_tokens, device=device)
    sequence = torch.searchsorted(offsets, positions, right=True) - 1
    boundaries = offsets[1:-1]
    targets[boundaries[(boundaries > 0) & (boundaries < n_tokens)] - 1] = ignore_index
    kept = targets != ignore_index
    dtype = torch.promote_types(logits.dtype, torch.float32)
    losses = torch.nn.functional.cross_entropy(
        logits[:-1][kept].to(dtype), targets[kept], reduction="none"
    )
    sums.index_add_(0, sequence[kept], losses.to(torch.float64))
    counts.index_add_(0, sequence[kept], torch.ones_like(sequence[kept]))
    return sums, counts


@dataclasses.dataclass(frozen=True)
class EvaluationResult:
    """The losses of an evaluation pass, reduced over all ranks.

    Attributes:
        loss: the corpus token-mean loss: every document's summed token loss over all label
            tokens (``nan`` when there are none).
        tokens: label tokens of the whole corpus.
        document_losses: float64, each document's own token-mean loss (``nan`` for a
            document without label tokens).
        document_loss_sums: float64, each document's summed token loss.
        document_tokens: int64, each document's label tokens.
    """

    loss: float
    tokens: int
    document_losses: npt.NDArray[np.float64]
    document_loss_sums: npt.NDArray[np.float64]
    document_tokens: npt.NDArray[np.int64]

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        """``{prefix}_loss`` and ``{prefix}_tokens``, for a trainer's log."""
        return {f"{prefix}_loss": self.loss, f"{prefix}_tokens": float(self.tokens)}


class DocumentLosses:
    """Collects the summed loss and label tokens of every document of an evaluation pass on
    one rank, and reduces them over all ranks.

    Every document must be added exactly once over all ranks: adding one twice raises at
    once (on its rank), and :meth:`reduce` refuses a pass that missed or repeated one.

    Args:
        n_documents: documents of the pass (``EvaluationBatchSampler.n_documents``).
    """

    def __init__(self, n_documents: int) -> None:
        n = as_int(n_documents, "n_documents", minimum=1)
        self.n_documents = n
        # Rows: loss sums, label tokens, times added. float64 holds the counts exactly
        # (below 2**53), so one all-reduce carries all three.
        self._table = np.zeros((3, n), dtype=np.float64)

    def add(self, document_ids: Any, loss_sums: Any, token_counts: Any) -> None:
        """Add the losses of one row: ``loss_sums[k]`` and ``token_counts[k]`` belong to
        document ``document_ids[k]``; entries past ``len(document_ids)`` are the row's
        padding and must have no label token.

        Raises:
            InvalidValueError: an unknown or repeated document, label tokens in the
                padding, or arrays of different lengths.
        """
        ids = np.asarray(_numpy(document_ids), dtype=np.int64).reshape(-1)
        sums = np.asarray(_numpy(loss_sums), dtype=np.float64).reshape(-1)
        counts = np.asarray(_numpy(token_counts), dtype=np.int64).reshape(-1)
        if len(sums) != len(counts) or len(sums) < len(ids):
            raise InvalidValueError(
                f"{len(ids)} document ids, {len(sums)} loss sums and {len(counts)} token "
                "counts: every document needs its loss sum and token count"
            )
        if counts[len(ids) :].any():
            raise InvalidValueError(
                "the row has label tokens after its last document: the sequences of the "
                "row and its document_ids disagree"
            )
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n_documents):
            raise InvalidValueError(
                f"document ids must be in [0, {self.n_documents}), got {ids.min()}..{ids.max()}"
            )
        table = self._table
        twice = ids[table[2, ids] > 0]
        if len(twice) == 0 and len(np.unique(ids)) != len(ids):
            values, times = np.unique(ids, return_counts=True)
            twice = values[times > 1]
        if len(twice):
            raise InvalidValueError(
                f"document {int(twice[0])} was evaluated twice on this rank: an evaluation "
                "pass must hold every document once"
            )
        table[0, ids] = sums[: len(ids)]
        table[1, ids] = counts[: len(ids)]
        table[2, ids] = 1

    def add_batch(
        self, logits: torch.Tensor, batch: Mapping[str, Any], *, ignore_index: int = -100
    ) -> None:
        """Add one :class:`~tokenbatch.torch.EvaluationCollator` row from the logits the
        model gave for it (see :func:`document_losses`), and its empty documents."""
        labels, offsets = batch["labels"], batch["cu_seqlens_padded"]
        sums, counts = document_losses(
            logits, labels, cu_seqlens=offsets, ignore_index=ignore_index
        )
        self.add(batch["document_ids"], sums, counts)
        empty = batch["empty_document_ids"]
        self.add(empty, np.zeros(len(empty)), np.zeros(len(empty), dtype=np.int64))

    def reduce(
        self, *, group: Any = None, device: torch.device | str | None = None
    ) -> EvaluationResult:
        """Sum every rank's documents (one all-reduce; each document is on one rank, so the
        sum is exact) and compute the means: the same result on every rank.

        Outside an initialized process group this rank's documents are the pass. Every
        rank of ``group`` must call it.

        Args:
            group: the process group (default: the default group).
            device: where the all-reduce runs; default: the current CUDA device for the
                ``nccl`` backend, else the CPU.

        Raises:
            InvalidValueError: a document no rank added, or one added on several ranks.
        """
        table = self._table
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if device is None:
                device = collective_device(group)
            reduced = torch.from_numpy(table.copy()).to(device)
            torch.distributed.all_reduce(reduced, group=group)
            table = reduced.cpu().numpy()
        seen = table[2]
        if not (seen == 1).all():
            missing = np.flatnonzero(seen == 0)
            repeated = np.flatnonzero(seen > 1)
            raise InvalidValueError(
                f"an evaluation pass must hold every document exactly once: {len(missing)} "
                f"missing (first {missing[:5].tolist()}), {len(repeated)} on several ranks "
                f"(first {repeated[:5].tolist()})"
            )
        sums = table[0].copy()
        tokens = table[1].astype(np.int64)
        total = int(tokens.sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(tokens > 0, sums / np.maximum(tokens, 1), np.nan)
        loss = float(sums.sum() / total) if total else float("nan")
        return EvaluationResult(
            loss=loss,
            tokens=total,
            document_losses=means,
            document_loss_sums=sums,
            document_tokens=tokens,
        )


def _numpy(values: Any) -> Any:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return values
