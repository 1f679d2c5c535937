"""Per-GPU memory estimates: one configuration, a broadcast grid, the largest token budget.

All arithmetic happens in the Rust core, once: a scalar estimate and the matching grid
cell run the same code, so they can never disagree. The formulas and their sources are
listed in :doc:`docs/memory.md` and in ``explanation()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError, TokenBatchOverflowError
from tokenbatch.memory.options import (
    DTYPE_BYTES,
    LAYOUT_FIELDS,
    OPTIMIZER_STATES,
    OUTPUT_FIELDS,
    OVERFLOW_REASON,
    REASON_MESSAGES,
    grid_fields,
    scalar_fields,
)
from tokenbatch.memory.results import MemoryEstimate, MemoryGrid
from tokenbatch.memory.spec import ModelSpec

__all__ = [
    "DTYPE_BYTES",
    "OPTIMIZER_STATES",
    "MemoryEstimate",
    "MemoryGrid",
    "estimate_memory",
    "estimate_memory_grid",
    "estimate_memory_stages",
    "max_micro_batch_tokens",
]

_F64 = npt.NDArray[np.float64]


def estimate_memory(spec: ModelSpec, *, seq_len: int, **options: Any) -> MemoryEstimate:
    """Estimate the per-GPU memory of training ``spec`` with one parallel layout.

    Options (defaults): ``micro_batch=1``, ``dp=1``, ``tp=1``, ``pp=1``, ``cp=1``, ``ep=1``,
    ``vpp=1`` (virtual pipeline chunks, interleaved 1F1B when > 1), ``zero=0`` (0-3; 3 is
    FSDP), ``sequence_parallel=False``, ``recompute="none"`` (``"selective"``: the
    attention core and, with ``implementation="fused"``, the MLP activation functions;
    ``"full"``; or Megatron-Core's ``recompute_modules`` joined with ``"+"`` in any order:
    ``"core_attn"``, the attention core only, its default selective recomputation and the
    same as ``"selective"`` for ``"hf"``, ``"mlp"``, ``"layernorm"``, ``"moe"``,
    ``"shared_experts"``, ``"mla_up_proj"``, ``"moe_act"``, e.g. ``"core_attn+mlp"``; see
    :data:`RECOMPUTE_MODULES`),
    ``grad_accum_steps=None`` (micro-batches per step; None fills the pipeline),
    ``optimizer="adamw"`` (see :data:`OPTIMIZER_STATES`), ``param_dtype="bf16"``
    (``"fp8"``: FP8 weights), ``grad_dtype`` (default: ``param_dtype``, bf16 for FP8
    weights), ``master_weights`` (a boolean; default: fp32 master weights when
    ``param_dtype`` is not fp32), ``optimizer_dtype="fp32"``, ``optimizer_offload=0.0``
    (the fraction of the optimizer state kept in CPU memory, Megatron's
    ``--optimizer-offload-fraction``), ``fp32_grad_accum=False`` (a boolean: an extra fp32
    gradient buffer), ``activation_dtype``
    (default: ``param_dtype``, bf16 for FP8 weights), ``fp8=False`` (FP8 linear layers,
    which keep their inputs for backward in FP8, as Transformer Engine and DeepSeek-V3's
    recipe do), ``logits_dtype="fp32"``, ``loss="standard"`` (``"fused"``: a chunked or
    fused cross-entropy that keeps no logits), ``activation_model="modern"`` (or
    ``"korthikanti"``), ``attention="flash"`` (or ``"eager"``: keeps s x s probabilities),
    ``fused_swiglu=False``, ``moe_capacity_factor=None`` (dropless routing with a balanced
    load; a number pads every expert's input to that multiple of the balanced load),
    ``cp_comm="p2p"`` (how context-parallel ranks exchange keys and values: ``"p2p"`` ring,
    ``"all_gather"`` or ``"a2a"``) and ``overhead_bytes=0``.

    Context parallelism: with ``cp > 1`` each sequence is padded to a multiple of ``2 * cp``
    and split over the ``cp`` ranks in load-balanced chunks (Transformer Engine's and
    Megatron's convention), so every rank holds ``micro_batch * ceil(seq_len / (2 cp)) * 2``
    tokens. ``seq_len`` is the length of a row: for a packed row built with
    ``pad_to_multiple_of=2 * cp`` (each document charged its padded length), the budget
    ``max_tokens`` already includes every document's padding, and the estimate at
    ``seq_len=max_tokens`` bounds any row whatever its document lengths.

    Pipeline stages (Megatron-LM's rules): ``pipeline_split="even"`` gives every stage
    ``num_layers / pp`` layers; ``first_stage_layers`` and/or ``last_stage_layers`` (with
    ``"even"``) fix those stages and split the rest evenly; ``"embedding"``, ``"loss"`` and
    ``"embedding_and_loss"`` count the embedding and/or the loss as one layer of the split
    (Megatron's ``--account-for-*-in-pipeline-split``); ``"auto"`` takes the even split when
    it exists and otherwise takes the layers left over off the last and first stages (126
    layers on 16 stages: 7 + 14 x 8 + 7).

    Raises :class:`~tokenbatch.errors.InvalidValueError` naming the parameter when the
    layout does not fit the model (``tp`` not dividing the heads, ``pp`` not dividing the
    layers, ``zero`` > 3, negative or NaN values...), and
    :class:`~tokenbatch.errors.TokenBatchOverflowError` when an input is so large that the
    estimate is past the range of a float (about 1.8e308 bytes), rather than returning
    infinite or NaN bytes.
    """
    fields = _fields(spec, seq_len, options)
    row, reason = _core.memory_estimate(spec, fields)
    if reason:
        raise _invalid(reason, {"seq_len": seq_len, **options})
    return MemoryEstimate(spec, {"seq_len": seq_len, **options}, fields, row)


def estimate_memory_stages(
    spec: ModelSpec, *, seq_len: int, **options: Any
) -> list[MemoryEstimate]:
    """The estimate of every pipeline stage, first to last.

    Takes the options of :func:`estimate_memory`, which reports the busiest of these
    stages, and raises what it raises. Useful with uneven stages, where the first and last
    stages hold fewer layers than the others and the busiest stage is not obvious.
    """
    fields = _fields(spec, seq_len, options)
    flat, reason = _core.memory_stages(spec, fields)
    if reason:
        raise _invalid(reason, {"seq_len": seq_len, **options})
    rows = flat.reshape(-1, len(OUTPUT_FIELDS)).tolist()
    given = {"seq_len": seq_len, **options}
    return [MemoryEstimate(spec, given, fields, row) for row in rows]


def _fields(spec: ModelSpec, seq_len: int, options: Mapping[str, Any]) -> list[float]:
    if not isinstance(spec, ModelSpec):
        raise InvalidTypeError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    return scalar_fields({"seq_len": seq_len, **options})


def _invalid(code: int, options: Mapping[str, Any]) -> InvalidValueError | TokenBatchOverflowError:
    """The error of reason ``code``: an overflow for an estimate past the range of a float."""
    message = REASON_MESSAGES[code - 1]
    shown = {k: v for k, v in options.items() if k in message or k == "seq_len"}
    given = ", ".join(f"{k}={v!r}" for k, v in shown.items())
    text = f"{message} (got {given})" if given else message
    if code == OVERFLOW_REASON:
        return TokenBatchOverflowError(text)
    return InvalidValueError(text)


def _run_grid(
    spec: ModelSpec, fields: list[npt.NDArray[Any]]
) -> tuple[tuple[int, ...], _F64, npt.NDArray[np.uint8]]:
    if not isinstance(spec, ModelSpec):
        raise InvalidTypeError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    try:
        shape = np.broadcast_shapes(*(a.shape for a in fields))
    except ValueError as exc:
        shapes = ", ".join(
            f"{k}{a.shape}" for k, a in zip(LAYOUT_FIELDS, fields, strict=True) if a.shape
        )
        raise InvalidValueError(f"grid parameters do not broadcast: {shapes}") from exc
    # Element strides over the grid's shape (0 along the axes a field is broadcast over).
    inputs = [
        (a.reshape(-1), [s // a.itemsize for s in np.broadcast_to(a, shape).strides])
        for a in fields
    ]
    flat, reasons = _core.memory_grid(spec, list(shape), inputs)
    return tuple(shape), flat.reshape(len(OUTPUT_FIELDS), -1), reasons.reshape(shape)


def estimate_memory_grid(spec: ModelSpec, **params: Any) -> MemoryGrid:
    """Estimate every combination of broadcast parameters at once (in Rust, on all cores).

    Takes the options of :func:`estimate_memory`, any of which may be a numpy array (or a
    list); the arrays broadcast like numpy arrays, e.g. ``tp=np.array([1, 2, 4, 8])[:, None]``
    and ``seq_len=np.array([2048, 4096])`` give a ``(4, 2)`` grid. String options accept
    arrays of strings, matched in any case. Cells whose layout is invalid (an unknown name
    among them) are NaN and flagged in ``valid``; the grid itself never fails because of
    them.
    """
    shape, table, reasons = _run_grid(spec, grid_fields(params))
    return MemoryGrid(spec, shape, table, reasons)


def max_micro_batch_tokens(
    spec: ModelSpec,
    gpu_memory: float,
    *,
    multiple_of: int = 1,
    **layout: Any,
) -> int:
    """The largest token budget per micro-batch that fits in ``gpu_memory`` bytes.

    The micro-batch is one packed row of ``tokens`` tokens (``micro_batch=1``,
    ``seq_len=tokens``), as the sampler's ``max_tokens`` produces with padding-free
    attention. ``layout`` takes the options of :func:`estimate_memory` except ``seq_len``
    and ``micro_batch``. The result is a multiple of ``multiple_of``, and with context
    parallelism (``cp > 1``) of ``2 * cp``; 0 when not even that many tokens fit.

    With ``cp > 1`` pack with ``pad_to_multiple_of=2 * cp``: the packer then charges every
    document its length rounded up to a multiple of ``2 * cp``, as load-balanced context
    parallelism pads it, so a row never holds more than the budget, padding included, and
    the estimate of a ``budget``-token row bounds it whatever the document lengths.
    """
    for name in ("seq_len", "micro_batch"):
        if name in layout:
            raise InvalidTypeError(f"{name} is set by max_micro_batch_tokens; do not pass it")
    fields = _fields(spec, 1, layout)
    if not isinstance(gpu_memory, (int, float)):
        raise InvalidTypeError(f"gpu_memory must be a number of bytes, got {gpu_memory!r}")
    step = as_int(multiple_of, "multiple_of", minimum=1)
    tokens, reason, seq_len = _core.memory_max_tokens(spec, fields, float(gpu_memory), step)
    if reason:
        error = _invalid(reason, {"seq_len": seq_len, "micro_batch": 1, **layout})
        # The seq_len the message shows is the probe's, which the caller did not pass.
        if "seq_len=" in str(error):
            error = type(error)(f"{error}, on the smallest row it tries (seq_len={seq_len})")
        raise error
    return int(tokens)
