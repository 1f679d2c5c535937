"""The sampler's options: validated once at construction, frozen, and the packing and
dealer they describe."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Sized
from typing import Any, Generic, Literal, TypeVar, cast, overload

import numpy as np
import numpy.typing as npt

from tokenbatch._convert import as_choice, as_cost_matrix, as_int
from tokenbatch.distribute import Balance, Dealer, mix_seed
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.packing import (
    MAX_COST_COLUMNS,
    Algorithm,
    OversizePolicy,
    Packing,
    batch_padded,
    pack,
    pack_costs,
)
from tokenbatch.schedule import BatchSchedule
from tokenbatch.torch._mixture import _Sources

_OVERSIZE = ("error", "truncate", "split", "drop")
_BALANCES = ("attention", "tokens", "flops")


def check_early(lengths: Sized, dataset: Sized | None, balance: Balance) -> None:
    """What the samplers check before packing, so that a mistake costs no packing time:
    ``lengths`` describes ``dataset`` item for item and ``balance`` is a known cost."""
    if dataset is not None and len(dataset) != len(lengths):
        raise InvalidValueError(
            f"lengths has {len(lengths)} entries but the dataset has {len(dataset)} items; "
            "lengths must give the token count of every dataset item, in order"
        )
    if balance is not None:
        as_choice(balance, "balance", _BALANCES)


def read_extra_costs(
    costs: Any,
    budgets: Any,
    n_seqs: int,
    refused: dict[str, bool],
) -> tuple[npt.NDArray[np.int64] | None, tuple[int, ...]]:
    """The sampler's budgets besides tokens: an ``n_seqs x k`` cost matrix, copied and
    frozen, and its ``k`` budgets; ``refused`` names the options they cannot go with."""
    if costs is None and budgets is None:
        return None, ()
    if costs is None or budgets is None:
        raise InvalidValueError("extra_costs and max_extra_costs go together: give both or neither")
    matrix = np.array(as_cost_matrix(costs), dtype=np.int64)
    if matrix.shape[0] != n_seqs:
        raise InvalidValueError(
            f"extra_costs has {matrix.shape[0]} rows but there are {n_seqs} sequences; it "
            "needs one row per sequence"
        )
    if not 1 <= matrix.shape[1] < MAX_COST_COLUMNS:
        raise InvalidValueError(
            f"extra_costs has {matrix.shape[1]} columns; it takes 1 to "
            f"{MAX_COST_COLUMNS - 1} (the tokens are the first of {MAX_COST_COLUMNS} budgets)"
        )
    if isinstance(budgets, (str, bytes)) or not hasattr(budgets, "__iter__"):
        raise InvalidTypeError(
            f"max_extra_costs must be a sequence of budgets, got {type(budgets).__name__}"
        )
    limits = tuple(as_int(b, f"max_extra_costs[{c}]", minimum=1) for c, b in enumerate(budgets))
    if len(limits) != matrix.shape[1]:
        raise InvalidValueError(
            f"max_extra_costs has {len(limits)} budgets but extra_costs has "
            f"{matrix.shape[1]} columns; give one budget per column"
        )
    for option, conflicts in refused.items():
        if conflicts:
            raise InvalidValueError(
                f"extra_costs cannot be combined with {option}: batches under several "
                "budgets are packed by tokenbatch.pack_costs (first-fit decreasing, every "
                "sequence whole, in packed mode)"
            )
    matrix.flags.writeable = False
    return matrix, limits


@dataclasses.dataclass(frozen=True)
class _Options:
    """Everything that shapes the plans, validated once and never changed."""

    lengths: npt.NDArray[np.int64]
    max_tokens: int
    mode: Literal["packed", "padded"]
    algorithm: Algorithm
    shuffle: bool
    seed: int
    num_replicas: int
    rank: int
    drop_last: bool
    balance: Balance
    oversize: OversizePolicy
    max_seqs: int | None
    pad_to_multiple_of: int
    hidden_size: int | None
    schedule: BatchSchedule | None
    mixture: _Sources | None = None
    groups: npt.NDArray[np.int64] | None = None
    extra_costs: npt.NDArray[np.int64] | None = None
    max_extra_costs: tuple[int, ...] = ()

    @property
    def repacks_every_epoch(self) -> bool:
        """``first_fit_shuffled`` with ``shuffle`` packs every epoch with its own seed."""
        return self.mode == "packed" and self.algorithm == "first_fit_shuffled" and self.shuffle

    def packing_epoch(self, epoch: int) -> int:
        """The epoch whose packing ``epoch`` uses (0 unless every epoch repacks)."""
        return epoch if self.repacks_every_epoch else 0

    def packing(self, packing_epoch: int) -> Packing:
        if self.extra_costs is not None:
            return pack_costs(
                np.column_stack([self.lengths, self.extra_costs]),
                [self.max_tokens, *self.max_extra_costs],
                groups=self.groups,
                max_seqs=self.max_seqs,
                pad_to_multiple_of=self.pad_to_multiple_of,
                oversize=cast(Literal["error", "drop"], self.oversize),
            )
        if self.mode == "padded":
            return batch_padded(
                self.lengths,
                self.max_tokens,
                max_seqs=self.max_seqs,
                pad_to_multiple_of=self.pad_to_multiple_of,
                oversize=self.oversize,
                groups=self.groups,
            )
        return pack(
            self.lengths,
            self.max_tokens,
            algorithm=self.algorithm,
            max_seqs=self.max_seqs,
            pad_to_multiple_of=self.pad_to_multiple_of,
            oversize=self.oversize,
            seed=mix_seed(self.seed, packing_epoch) if self.repacks_every_epoch else self.seed,
            groups=self.groups,
        )

    def planner(self, packing: Packing) -> Dealer:
        return Dealer(
            packing,
            self.num_replicas,
            seed=self.seed,
            shuffle=self.shuffle,
            balance=self.balance,
            drop_last=self.drop_last,
            pad_to_multiple_of=self.pad_to_multiple_of,
            split_sequences=self.oversize == "split",
            hidden_size=self.hidden_size,
        )

    def config(self) -> dict[str, Any]:
        """The options a state records (the lengths enter through the fingerprint)."""
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
            **({} if self.mixture is None else {"mixture": self.mixture.config()}),
            **({} if self.extra_costs is None else {"max_extra_costs": list(self.max_extra_costs)}),
        }

    @functools.cached_property
    def fingerprint(self) -> str:
        digest = hashlib.blake2b(digest_size=16)
        digest.update(self.lengths.astype("<i8", copy=False).tobytes())
        if self.groups is not None:
            digest.update(b"groups" + self.groups.astype("<i8", copy=False).tobytes())
        if self.extra_costs is not None:
            digest.update(b"costs" + self.extra_costs.astype("<i8", copy=False).tobytes())
        options = {k: v for k, v in self.config().items() if k != "num_replicas"}
        digest.update(repr(sorted(options.items())).encode())
        return digest.hexdigest()


_T = TypeVar("_T")


class _Option(Generic[_T]):
    """A read-only attribute of the sampler: one of its frozen options."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type) -> _Option[_T]: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> _T: ...
    def __get__(self, instance: object, owner: type | None = None) -> _T | _Option[_T]:
        if instance is None:
            return self
        return cast(_T, getattr(instance._options, self._name))  # type: ignore[attr-defined]

    def __set__(self, instance: object, value: _T) -> None:
        raise AttributeError(f"{self._name} is fixed at construction")
