"""The sampler's sources when it samples a mixture: reading them, the core planner of
their passes, and the position a resized resume starts from."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_int, as_lengths, as_str
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.mixture import Mixture
from tokenbatch.schedule import BatchSchedule


@dataclasses.dataclass(frozen=True)
class _Sources:
    """Named sources of a mixture: their sizes, in the order of the global indices."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    mixture: Mixture

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """``n_sources + 1`` offsets of the sources in the global indices."""
        return np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)]).astype(np.int64)

    def config(self) -> dict[str, Any]:
        return {
            "sources": list(self.names),
            "sizes": list(self.sizes),
            "mixture": repr(self.mixture),
        }


def _read_sources(
    lengths: object, mixture: object, schedule: object
) -> tuple[_Sources, npt.NDArray[np.int64]]:
    """The sources of a mixture sampler, and their lengths concatenated in the order of
    ``lengths`` (which is the order of the global indices)."""
    if not isinstance(mixture, Mixture):
        raise InvalidTypeError(
            f"mixture must be a tokenbatch.mixture.Mixture, got {type(mixture).__name__}"
        )
    if not isinstance(lengths, Mapping):
        raise InvalidTypeError(
            "with a mixture, lengths must map every source name to its lengths, got "
            f"{type(lengths).__name__}"
        )
    if not isinstance(schedule, BatchSchedule):
        raise InvalidValueError(
            "a mixture needs schedule=, the batch schedule that sets every optimizer "
            "step's tokens (e.g. tokenbatch.schedule.Piecewise([(0, 1 << 20)]) for steps "
            "of 1M tokens): the shares hold within each step"
        )
    names = tuple(as_str(name, "source name") for name in lengths)
    missing = [name for name in mixture.sources if name not in lengths]
    if missing:
        raise InvalidValueError(
            f"the mixture names source {missing[0]!r}, which lengths does not have "
            f"(it has {list(names)})"
        )
    extra = [name for name in names if name not in mixture.sources]
    if extra:
        raise InvalidValueError(
            f"lengths has source {extra[0]!r}, which the mixture gives no share "
            f"(its sources: {list(mixture.sources)})"
        )
    arrays = [np.asarray(as_lengths(lengths[name], f"lengths[{name!r}]")) for name in names]
    for name, array in zip(names, arrays, strict=True):
        if len(array) == 0:
            raise InvalidValueError(
                f"source {name!r} has no sequences; a mixture needs at least one in every source"
            )
    concatenated = np.concatenate(arrays).astype(np.int64, copy=False)
    sizes = tuple(len(array) for array in arrays)
    return _Sources(names=names, sizes=sizes, mixture=mixture), concatenated


def _mixture_dealer(options: Any) -> _core.MixtureDealer:
    """The core planner of a mixture sampler's passes (``options``: its ``_Options``)."""
    sources: _Sources = options.mixture
    shares, repetitions = sources.mixture._arguments(sources.names)
    return _core.MixtureDealer(
        list(sources.names),
        options.lengths,
        list(sources.sizes),
        repetitions,
        shares,
        sources.mixture.exhausted,
        options.schedule._raw,
        max_tokens=options.max_tokens,
        kind=options.mode,
        algorithm=options.algorithm,
        max_seqs=options.max_seqs,
        pad_to_multiple_of=options.pad_to_multiple_of,
        oversize=options.oversize,
        num_replicas=options.num_replicas,
        seed=options.seed,
        shuffle=options.shuffle,
        balance=options.balance,
        drop_last=options.drop_last,
        hidden_size=options.hidden_size,
    )


def _resized_start(state: Mapping[str, Any], step_offsets: npt.NDArray[np.int64]) -> int:
    """The micro-batch a mixture sampler on another world size starts at: the start of the
    optimizer step the state stopped before, in this world size's plan (steps hold the same
    sequences on any number of ranks; only their micro-batches differ)."""
    position = state.get("mixture_step")
    if not isinstance(position, (list, tuple)) or len(position) != 2 or isinstance(position, str):
        raise InvalidValueError(
            f"state['mixture_step'] must be [optimizer step, micro-batch in it], got {position!r}"
        )
    step = as_int(position[0], "state['mixture_step'] step", minimum=0)
    into = as_int(position[1], "state['mixture_step'] micro-batch", minimum=0)
    if into:
        raise InvalidValueError(
            f"the state was saved {into} micro-batches into optimizer step {step}: a mixture "
            "sampler resumes on another world size only at an optimizer step boundary (save "
            "after optimizer.step(), as trainers do)"
        )
    if step >= len(step_offsets):
        raise InvalidValueError(
            f"state['mixture_step'] is step {step}, beyond the {len(step_offsets) - 1} "
            "optimizer steps of the epoch"
        )
    return int(step_offsets[step])


def _step_position(step_offsets: npt.NDArray[np.int64], micro_batch: int) -> list[int]:
    """``[optimizer step, micro-batches into it]`` of micro-batch ``micro_batch``."""
    step = int(np.searchsorted(step_offsets, micro_batch, side="right")) - 1
    return [step, micro_batch - int(step_offsets[step])]
