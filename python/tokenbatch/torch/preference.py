"""Preference pairs (DPO and its relatives) in padding-free rows.

:class:`PreferenceCollator` packs the pairs of a batch into one row, as
:class:`~tokenbatch.torch.PackedCollator` does for plain sequences, and says which
sequences of the row are each pair's chosen and rejected completion;
:func:`sequence_logps` sums the log-probabilities of every sequence of a row from the
model's logits, and :func:`dpo_loss` is the DPO sigmoid loss of those sums::

    batch = PreferenceCollator()(pairs)
    logits = model(**{k: batch[k] for k in MODEL_KEYS}).logits
    logps = sequence_logps(logits, batch["labels"], batch["cu_seqlens_padded"])
    loss = dpo_loss(
        logps[batch["chosen_index"]], logps[batch["rejected_index"]],
        batch["ref_chosen_logps"], batch["ref_rejected_logps"],
        beta=0.1, num_pairs=pairs_in_the_optimizer_step,
    )
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.torch._items import as_int64
from tokenbatch.torch._row import row_collator
from tokenbatch.torch.collate import PackedCollator

__all__ = [
    "IncompletePairError",
    "PreferenceCollator",
    "dpo_loss",
    "pair_lengths",
    "sequence_logps",
]

_ROLES = ("chosen", "rejected")


class IncompletePairError(InvalidValueError):
    """A batch holds one sequence of a preference pair without the other: the pair is
    incomplete in the dataset, or its two sequence items were packed apart."""


#: A sequence of the row: its tokens and labels.
_Sequence = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]


@dataclass
class _Pair:
    """One pair read from the items: its two sequences, chosen first."""

    sequences: tuple[_Sequence, _Sequence]
    pair_id: int
    ref_logps: tuple[float, float] | None


class PreferenceCollator:
    """Collate preference pairs into one padding-free row, each pair's chosen and
    rejected sequences side by side.

    Items come in either of two forms (a batch may mix them):

    * **one item per pair**, as TRL's ``DPOTrainer`` tokenizes a preference dataset:
      ``prompt_ids`` (optional), ``chosen_ids`` and ``rejected_ids``. The pair becomes
      two sequences, prompt + chosen and prompt + rejected, whose prompt tokens have
      ``ignore_index`` labels; pack it by :func:`pair_lengths`, its two sequences' total;
    * **one item per sequence**, two consecutive items per pair (packed together):
      ``input_ids``, ``labels`` (optional; ``ignore_index`` on the prompt),
      ``pair_id`` (an integer shared by the two) and ``role`` (``"chosen"`` or
      ``"rejected"``, in either order).

    An item may carry its pair's reference log-probabilities, computed ahead of time
    (``ref_chosen_logps`` and ``ref_rejected_logps`` on a pair item, ``ref_logps`` on a
    sequence item); then every item of the batch must. The other key names are
    arguments (TRL 0.28 wrote ``prompt_input_ids``, ``chosen_input_ids`` and
    ``rejected_input_ids``); sequence items hold their tokens and labels under the
    collator's ``input_key`` and ``labels_key``.

    Returns what ``collator`` (by default a :class:`PackedCollator`) returns for the
    row's sequences, in order, chosen before rejected in every pair, and:

    * ``chosen_index``, ``rejected_index``: int64, one per pair: the positions of the
      pair's two sequences in the row (indices into ``cu_seqlens``, and into what
      :func:`sequence_logps` returns; the padding of ``pad_to_multiple_of``, when there
      is some, is one more sequence at the end, of no pair);
    * ``pair_ids``: int64, one per pair: its ``pair_id`` (``-1`` for a pair item without
      one);
    * ``ref_chosen_logps``, ``ref_rejected_logps``: float64, one per pair, when the items
      carry them.

    Raises:
        IncompletePairError: a sequence item without its mate next to it (the batch ends
            or starts in the middle of a pair, two consecutive items belong to different
            pairs or have the same role).
        InvalidValueError: an item of neither form, an empty sequence, labels of another
            length than the tokens, an unknown role, reference log-probabilities on some
            items only.
    """

    def __init__(
        self,
        *,
        collator: PackedCollator | None = None,
        prompt_key: str = "prompt_ids",
        chosen_key: str = "chosen_ids",
        rejected_key: str = "rejected_ids",
        pair_key: str = "pair_id",
        role_key: str = "role",
    ) -> None:
        self.collator = row_collator(collator)
        self.prompt_key = prompt_key
        self.chosen_key = chosen_key
        self.rejected_key = rejected_key
        self.pair_key = pair_key
        self.role_key = role_key

    def __call__(self, items: Sequence[Any]) -> dict[str, Any]:
        """Collate ``items`` (one batch of the sampler) into one row of pairs."""
        pairs = self._read_pairs(items)
        keys = (self.collator.input_key, self.collator.labels_key)
        batch = self.collator(
            [
                dict(zip(keys, sequence, strict=True))
                for pair in pairs
                for sequence in pair.sequences
            ]
        )
        chosen = torch.arange(0, 2 * len(pairs), 2, dtype=torch.int64)
        batch["chosen_index"] = chosen
        batch["rejected_index"] = chosen + 1
        batch["pair_ids"] = torch.tensor([pair.pair_id for pair in pairs], dtype=torch.int64)
        with_ref = [pair.ref_logps is not None for pair in pairs]
        if any(with_ref):
            if not all(with_ref):
                missing = with_ref.index(False)
                raise InvalidValueError(
                    f"pair {missing} of the batch has no reference log-probabilities, but others "
                    "have them; precompute them for every pair or for none"
                )
            ref = torch.tensor([pair.ref_logps for pair in pairs], dtype=torch.float64)
            batch["ref_chosen_logps"] = ref[:, 0].contiguous()
            batch["ref_rejected_logps"] = ref[:, 1].contiguous()
        return batch

    def _read_pairs(self, items: Sequence[Any]) -> list[_Pair]:
        pairs: list[_Pair] = []
        waiting: tuple[int, Mapping[str, Any]] | None = None  # a sequence item's position
        for position, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise InvalidTypeError(
                    f"items[{position}] is a {type(item).__name__}; preference items are "
                    "mappings (a pair, or one sequence of a pair)"
                )
            if self.chosen_key in item or self.rejected_key in item:
                if waiting is not None:
                    raise self._incomplete(*waiting, "is followed by a pair item")
                pairs.append(self._pair_item(position, item))
            elif waiting is None:
                waiting = (position, item)
            else:
                pairs.append(self._sequence_pair(*waiting, position, item))
                waiting = None
        if waiting is not None:
            raise self._incomplete(*waiting, "ends the batch")
        return pairs

    def _pair_item(self, position: int, item: Mapping[str, Any]) -> _Pair:
        for key in (self.chosen_key, self.rejected_key):
            if key not in item:
                raise IncompletePairError(f"items[{position}] has no {key!r} field")
        prompt = self._tokens(item.get(self.prompt_key, ()), position, self.prompt_key)
        ignored = np.full(len(prompt), self.collator.ignore_index, dtype=np.int64)
        sequences = []
        for key in (self.chosen_key, self.rejected_key):
            completion = self._tokens(item[key], position, key)
            tokens = np.concatenate([prompt, completion])
            self._non_empty(tokens, position, key)
            sequences.append((tokens, np.concatenate([ignored, completion])))
        pair_id = self._pair_id(item, position) if self.pair_key in item else -1
        ref = None
        keys = ("ref_chosen_logps", "ref_rejected_logps")
        if any(key in item for key in keys):
            ref = (self._ref(item, position, keys[0]), self._ref(item, position, keys[1]))
        return _Pair((sequences[0], sequences[1]), pair_id, ref)

    def _sequence_pair(
        self,
        first_position: int,
        first: Mapping[str, Any],
        position: int,
        item: Mapping[str, Any],
    ) -> _Pair:
        first_id, first_role = (
            self._pair_id(first, first_position),
            self._role(first, first_position),
        )
        pair_id, role = self._pair_id(item, position), self._role(item, position)
        if pair_id != first_id:
            raise self._incomplete(first_position, first, f"is followed by pair {pair_id}")
        if role == first_role:
            raise IncompletePairError(
                f"items[{first_position}] and items[{position}] are both the {role!r} sequence "
                f"of pair {pair_id}"
            )
        sequences = [self._sequence(first, first_position), self._sequence(item, position)]
        ref = None
        if "ref_logps" in first or "ref_logps" in item:
            ref = (
                self._ref(first, first_position, "ref_logps"),
                self._ref(item, position, "ref_logps"),
            )
        if first_role == "rejected":
            sequences.reverse()
            ref = None if ref is None else (ref[1], ref[0])
        return _Pair((sequences[0], sequences[1]), pair_id, ref)

    def _sequence(self, item: Mapping[str, Any], position: int) -> _Sequence:
        input_key, labels_key = self.collator.input_key, self.collator.labels_key
        tokens = self._tokens(_field(item, input_key, position), position, input_key)
        self._non_empty(tokens, position, input_key)
        if item.get(labels_key) is None:
            return tokens, tokens
        labels = self._tokens(item[labels_key], position, labels_key)
        if len(labels) != len(tokens):
            raise InvalidValueError(
                f"items[{position}] has {len(tokens)} {input_key} but {len(labels)} {labels_key}"
            )
        return tokens, labels

    def _incomplete(self, position: int, item: Mapping[str, Any], what: str) -> IncompletePairError:
        pair_id = item.get(self.pair_key, "?")
        role = item.get(self.role_key, "?")
        return IncompletePairError(
            f"items[{position}], the {role!r} sequence of pair {pair_id}, {what}: a pair's two "
            "sequence items must be consecutive in one batch (a pair item always holds both)"
        )

    @staticmethod
    def _tokens(values: Any, position: int, key: str) -> npt.NDArray[np.int64]:
        return as_int64(values, f"items[{position}][{key!r}]")

    @staticmethod
    def _non_empty(tokens: npt.NDArray[np.int64], position: int, key: str) -> None:
        if not len(tokens):
            raise InvalidValueError(
                f"items[{position}] makes an empty {key} sequence; a pair's sequences need tokens"
            )

    def _pair_id(self, item: Mapping[str, Any], position: int) -> int:
        return as_int(
            _field(item, self.pair_key, position), f"items[{position}][{self.pair_key!r}]"
        )

    def _role(self, item: Mapping[str, Any], position: int) -> str:
        role = _field(item, self.role_key, position)
        if role not in _ROLES:
            raise InvalidValueError(
                f"items[{position}][{self.role_key!r}] = {role!r}; expected 'chosen' or 'rejected'"
            )
        return str(role)

    @staticmethod
    def _ref(item: Mapping[str, Any], position: int, key: str) -> float:
        value = _field(item, key, position)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise InvalidTypeError(
                f"items[{position}][{key!r}] = {value!r} is not a number"
            ) from None


def _field(item: Mapping[str, Any], key: str, position: int) -> Any:
    if key not in item:
        raise InvalidValueError(f"items[{position}] has no {key!r} field")
    return item[key]


def pair_lengths(
    dataset: Any,
    *,
    prompt_key: str = "prompt_ids",
    chosen_key: str = "chosen_ids",
    rejected_key: str = "rejected_ids",
    pad_each_to_multiple_of: int = 1,
) -> npt.NDArray[np.int64]:
    """Tokens of every pair item's row, ``2 * prompt + chosen + rejected``: the lengths
    to pack a dataset of pair items by (reads every item once, as
    :func:`~tokenbatch.torch.sequence_lengths` does).

    With the row collator's ``pad_each_to_multiple_of=k``, pass the same ``k``: each of
    the pair's two sequences is then counted at its padded length, so that a bin within
    the budget makes a row within it (the sampler's ``pad_to_multiple_of`` would round
    the pair's total only).
    """
    multiple = as_int(pad_each_to_multiple_of, "pad_each_to_multiple_of", minimum=1)

    def total(position: int) -> int:
        item = dataset[position]
        if not isinstance(item, Mapping):
            raise InvalidTypeError(f"dataset item {position} is not a mapping")
        prompt = len(item.get(prompt_key, ()))
        return sum(
            -(-(prompt + len(_field(item, key, position))) // multiple) * multiple
            for key in (chosen_key, rejected_key)
        )

    return np.fromiter((total(i) for i in range(len(dataset))), dtype=np.int64, count=len(dataset))


def sequence_logps(
    logits: torch.Tensor,
    labels: torch.Tensor,
    cu_seqlens: torch.Tensor | npt.NDArray[np.integer[Any]] | Sequence[int],
    *,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Summed log-probability of every sequence of a packed row under the model.

    Token ``t + 1`` of the row is predicted from ``logits[..., t, :]`` (the labels are
    unshifted, as Hugging Face models take them) and counts when its label is not
    ``ignore_index``; a collated row ignores the first token of every sequence, so no
    prediction crosses from one sequence into the next. Differentiable; vectorized over
    the row (one ``index_add``). Logits in half precision are summed in float32.

    Args:
        logits: ``[1, T, vocab]`` or ``[T, vocab]``, the model's output for the row.
        labels: ``[1, T]`` or ``[T]``, the row's labels (``batch["labels"]``).
        cu_seqlens: the row's sequence offsets, ``batch["cu_seqlens_padded"]`` (the
            padded offsets also hold the sequences' padding, whose labels are ignored).

    Returns:
        One value per sequence of ``cu_seqlens`` (``len(cu_seqlens) - 1``), in the dtype
        the logits are summed in.

    Raises:
        InvalidTypeError, InvalidValueError: shapes that do not fit each other.
    """
    if logits.ndim == 3 and logits.shape[0] == 1:
        logits = logits[0]
    if labels.ndim == 2 and labels.shape[0] == 1:
        labels = labels[0]
    if logits.ndim != 2 or labels.ndim != 1:
        raise InvalidTypeError(
            f"logits must be [1, T, vocab] and labels [1, T] (one row), got "
            f"{tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    n_tokens = labels.shape[0]
    if logits.shape[0] != n_tokens:
        raise InvalidValueError(f"logits hold {logits.shape[0]} tokens, labels {n_tokens}")
    offsets = torch.as_tensor(as_int64(cu_seqlens, "cu_seqlens"), device=labels.device)
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != n_tokens:
        raise InvalidValueError(
            f"cu_seqlens must run from 0 to the row's {n_tokens} tokens, got {offsets.tolist()}"
        )
    counts = torch.diff(offsets)
    if bool((counts < 0).any()):
        raise InvalidValueError("cu_seqlens must not decrease")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    targets = labels[1:]
    counted = targets != ignore_index
    predictions = logits[:-1]
    picked = predictions.gather(1, torch.where(counted, targets, 0)[:, None])[:, 0]
    token_logps = torch.where(counted, picked - torch.logsumexp(predictions, dim=1), 0.0)
    sequence = torch.repeat_interleave(torch.arange(len(counts), device=labels.device), counts)
    sums = token_logps.new_zeros(len(counts))
    return sums.index_add(0, sequence[1:].to(logits.device), token_logps)


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float = 0.1,
    num_pairs: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """The DPO sigmoid loss, ``-log sigmoid(beta * ((c - c_ref) - (r - r_ref)))`` per
    pair, summed over the pairs and divided by ``num_pairs``.

    ``num_pairs`` is the number of pairs of the whole optimizer step on all ranks (see
    :func:`~tokenbatch.torch.optimizer_steps`): the micro-batch's share of the step's
    mean loss, as a causal LM's ``num_items_in_batch`` gives it for tokens; under DDP,
    which averages gradients over ranks, multiply the loss by the number of ranks. By
    default, the pairs given (the micro-batch's mean). The reference log-probabilities
    are cast to the policy's dtype.

    Raises:
        InvalidValueError: inputs of different shapes, ``beta <= 0`` or ``num_pairs < 1``.
    """
    shape = chosen_logps.shape
    for name, values in (
        ("rejected_logps", rejected_logps),
        ("ref_chosen_logps", ref_chosen_logps),
        ("ref_rejected_logps", ref_rejected_logps),
    ):
        if values.shape != shape:
            raise InvalidValueError(
                f"{name} has shape {tuple(values.shape)}, chosen_logps {tuple(shape)}"
            )
    if not beta > 0:
        raise InvalidValueError(f"beta must be positive, got {beta}")
    dtype = chosen_logps.dtype
    margin = (chosen_logps - ref_chosen_logps.to(dtype)) - (
        rejected_logps - ref_rejected_logps.to(dtype)
    )
    total = -torch.nn.functional.logsigmoid(beta * margin).sum()
    if num_pairs is None:
        return total / max(chosen_logps.numel(), 1)
    if isinstance(num_pairs, torch.Tensor):
        if bool((num_pairs < 1).any()):
            raise InvalidValueError(f"num_pairs must be at least 1, got {num_pairs.tolist()}")
        return total / num_pairs.to(total.device, total.dtype)
    return total / as_int(num_pairs, "num_pairs", minimum=1)
