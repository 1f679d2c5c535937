"""The sampler's position and its saved form: the cursor, and the checks that a state
belongs to a sampler before it is restored."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tokenbatch._convert import as_int, check_same_config, check_state_format
from tokenbatch.distribute import DEAL_FORMAT
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.torch._sampler_options import _Options

_STATE_FORMAT = "tokenbatch.TokenBudgetBatchSampler/3"

#: Runs of an epoch on other world sizes before a resized resume: ``(num_replicas, steps)``.
_Runs = tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class _Cursor:
    """Where the sampler stands: an epoch, the runs of it on other world sizes before a
    resized resume, and the step the next iteration starts at."""

    epoch: int = 0
    resized: _Runs = ()
    start: int = 0

    @property
    def plan_key(self) -> tuple[int, _Runs]:
        return self.epoch, self.resized


def _read_state(
    options: _Options, state: Mapping[str, Any], allow_resize: bool
) -> tuple[_Cursor, int | None]:
    """The cursor a state describes, checked against a sampler's ``options``, and the
    tokens consumed before its epoch if it records them."""
    if not isinstance(state, Mapping):
        raise InvalidTypeError(f"state must be a mapping, got {type(state).__name__}")
    check_state_format(state.get("format"), _STATE_FORMAT, "TokenBudgetBatchSampler")
    deal_format = state.get("deal_format")
    if deal_format != DEAL_FORMAT:
        raise InvalidValueError(
            f"state was written under deal format {deal_format!r} and this version of "
            f"tokenbatch deals with format {DEAL_FORMAT}: the batches of an epoch differ "
            "between formats, so the position cannot be restored. Resume with the "
            "tokenbatch version that wrote the state, or start the epoch afresh"
        )
    config = state.get("config")
    saved_replicas = options.num_replicas
    if isinstance(config, Mapping):
        saved_replicas = as_int(config.get("num_replicas"), "state num_replicas", minimum=1)
        if saved_replicas != options.num_replicas and not allow_resize:
            raise InvalidValueError(
                f"state was saved with num_replicas={saved_replicas}, this sampler has "
                f"{options.num_replicas}; pass allow_resize=True to finish the epoch on "
                "this world size with the sequences not yet used"
            )
        current = {**options.config(), "num_replicas": saved_replicas}
        check_same_config(config, current, "sampler")
    if state.get("n_seqs") != len(options.lengths):
        raise InvalidValueError(
            f"state was saved for a dataset of {state.get('n_seqs')} sequences, "
            f"this sampler has {len(options.lengths)}"
        )
    if state.get("fingerprint") != options.fingerprint:
        raise InvalidValueError(
            "state was saved for other sequence lengths (fingerprint mismatch): "
            "a different or modified dataset"
        )
    epoch = as_int(state.get("epoch"), "state['epoch']", minimum=0)
    step = as_int(state.get("step"), "state['step']", minimum=0)
    resized = _resize_history(state.get("resized", []))
    if saved_replicas != options.num_replicas:
        if options.schedule is not None and options.drop_last:
            raise InvalidValueError(
                "a resized resume with a schedule needs drop_last=False (the tokens of "
                "earlier epochs would depend on the world size)"
            )
        resized, step = (*resized, (saved_replicas, step)), 0
    tokens_before = state.get("tokens_before_epoch")
    if tokens_before is not None:
        tokens_before = as_int(tokens_before, "state['tokens_before_epoch']", minimum=0)
    return _Cursor(epoch=epoch, resized=resized, start=step), tokens_before


def _resize_history(value: object) -> _Runs:
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
