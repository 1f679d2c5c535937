"""Per-GPU memory estimates: one configuration, a broadcast grid, the largest token budget.

All arithmetic happens in the Rust core, once: :func:`estimate_memory` is a grid of one
cell, so a scalar estimate and the matching grid cell can never disagree. The formulas
and their sources are listed in :doc:`docs/memory.md` and in ``explanation()``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError, TokenBatchOverflowError
from tokenbatch.memory.recompute import RecomputeNames
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
# What the grid reads in place: float64, int64, int32 or bool.
_Numbers = (
    npt.NDArray[np.float64] | npt.NDArray[np.int64] | npt.NDArray[np.int32] | npt.NDArray[np.bool_]
)

LAYOUT_FIELDS, OUTPUT_FIELDS, REASON_MESSAGES, _OVERFLOW_REASON = _core.memory_fields()

#: Bytes per element of the dtype names accepted by the ``*_dtype`` options.
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "float32": 4,
    "tf32": 4,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp8": 1,
}

#: Optimizer states per parameter (each of ``optimizer_dtype``): AdamW keeps two moments,
#: Lion, Muon and SGD with momentum one.
OPTIMIZER_STATES: dict[str, int] = {
    "adamw": 2,
    "adam": 2,
    "lion": 1,
    "muon": 1,
    "sgd": 1,
    "sgd_no_momentum": 0,
}

_RECOMPUTE = RecomputeNames()
_ACTIVATION_MODEL = {"modern": 0, "korthikanti": 1}
_ATTENTION = {"flash": 0, "eager": 1}
_CP_COMM = {"p2p": 0, "all_gather": 1, "a2a": 2}
_LOSS = {"standard": 0, "fused": 1}
#: Rules for splitting layers over pipeline stages (see :func:`estimate_memory`).
PIPELINE_SPLITS = {"even": 0, "auto": 1, "embedding": 2, "loss": 3, "embedding_and_loss": 4}

_ACT_PARTS = (
    "attention",
    "mlp",
    "norm",
    "embedding",
    "logits",
    "checkpoints",
    "working",
    "comm",
    "mtp",
)

_DEFAULTS: dict[str, Any] = {
    "micro_batch": 1,
    "dp": 1,
    "tp": 1,
    "pp": 1,
    "cp": 1,
    "ep": 1,
    "vpp": 1,
    "zero": 0,
    "sequence_parallel": False,
    "recompute": "none",
    "grad_accum_steps": None,
    "optimizer": "adamw",
    "param_dtype": "bf16",
    "grad_dtype": None,
    "master_weights": None,
    "optimizer_dtype": "fp32",
    "fp32_grad_accum": False,
    "activation_dtype": None,
    "logits_dtype": "fp32",
    "activation_model": "modern",
    "attention": "flash",
    "fused_swiglu": False,
    "overhead_bytes": 0,
    "first_stage_layers": None,
    "last_stage_layers": None,
    "pipeline_split": "even",
    "moe_capacity_factor": None,
    "cp_comm": "p2p",
    "loss": "standard",
    "fp8": False,
    "optimizer_offload": 0.0,
}

#: Options :func:`estimate_memory` and :func:`estimate_memory_grid` accept besides ``seq_len``.
OPTIONS = tuple(_DEFAULTS)

GIB = 1024**3


def _lookup(name: str, value: Any, table: Mapping[str, int], *, strict: bool) -> _Numbers:
    """Map option names (or arrays of them) to codes, in any case; unknown names become NaN
    (invalid).

    A string array is matched against the known names in Rust, in parallel (a million
    names cost a few milliseconds, not a million dictionary look-ups), in lowercase as
    ``str.lower`` gives it.
    """
    array = np.asarray(value)
    if array.dtype.kind not in _TEXT_KINDS:
        return _numeric(name, array)
    choices = table.choices if isinstance(table, RecomputeNames) else ", ".join(sorted(set(table)))
    if array.ndim == 0:
        code = table.get(str(array.astype(str).item()).lower(), math.nan)
        if strict and math.isnan(code):
            raise InvalidValueError(f"{name} must be one of {choices}, got {value!r}")
        return np.asarray(code, dtype=np.float64)
    column = _NameColumn(_text(array), table)
    codes: _F64 = _core.memory_name_codes(column.code_points(), *column.names_and_codes())
    codes = codes.reshape(array.shape)
    if strict and np.isnan(codes).any():
        raise InvalidValueError(f"{name} must be one of {choices}, got {value!r}")
    return codes


#: numpy dtype kinds read as names: str, bytes, and objects (as ``str()`` gives them).
_TEXT_KINDS = "USO"


def _text(array: npt.NDArray[Any]) -> npt.NDArray[np.str_]:
    """A str, bytes or object array as a contiguous ``<U`` array."""
    text: npt.NDArray[np.str_] = np.ascontiguousarray(
        array if array.dtype.kind == "U" else array.astype(str)
    )
    return text


@dataclasses.dataclass(frozen=True)
class _NameColumn:
    """A string array of a named option that the grid matches against the option's names
    itself, as it reads each cell, instead of a pass that turns it into codes first."""

    text: npt.NDArray[np.str_]
    table: Mapping[str, int]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.text.shape

    def code_points(self) -> npt.NDArray[np.uint32]:
        """The strings as rows of UTF-32 code points (numpy's own layout, no copy)."""
        width = self.text.itemsize // 4
        rows: npt.NDArray[np.uint32] = self.text.reshape(-1).view(np.uint32)
        return rows.reshape(self.text.size, width)

    def names_and_codes(
        self,
    ) -> tuple[list[str], list[float], tuple[str, list[str], list[int], float] | None]:
        """The names, their codes, and the names made of parts (``recompute``'s sets of
        modules) for the core's matcher."""
        sets = self.table.sets if isinstance(self.table, RecomputeNames) else None
        return list(self.table), [float(code) for code in self.table.values()], sets


#: A field of the grid: numbers, or the names of a named option.
_Column = _Numbers | _NameColumn


def _choice(name: str, value: Any, table: Mapping[str, int], *, strict: bool) -> _Column:
    """A named option's field: codes, or for a grid (not ``strict``) an array of names as
    the grid reads it in place."""
    if (
        not strict
        and isinstance(value, np.ndarray)
        and value.ndim
        and value.dtype.kind in _TEXT_KINDS
    ):
        return _NameColumn(_text(value), table)
    return _lookup(name, value, table, strict=strict)


# Integer and boolean arrays at least this long are handed to the core as int64, int32 or bool
# and read in place; shorter ones (scalars, a grid's axes) as float64, whose extraction is
# cheaper.
_INTEGER_COLUMN = 4096


def _numeric(name: str, value: Any) -> _Numbers:
    """A number or an array of numbers as the grid reads them, in place: contiguous bool,
    int32 or int64 (long boolean or integer columns; other integers as int64) or float64
    (other dtypes are converted once)."""
    array = np.asarray(value)
    if array.dtype.kind == "b" and array.size >= _INTEGER_COLUMN:
        return np.ascontiguousarray(array)
    if array.dtype.kind in "iu" and array.size >= _INTEGER_COLUMN:
        # int32 is read as it is, not copied to int64 first.
        dtype = np.int32 if array.dtype == np.int32 else np.int64
        return np.ascontiguousarray(array, dtype=dtype)
    if array.dtype.kind in "iub":
        return np.ascontiguousarray(array, dtype=np.float64)
    if array.dtype.kind != "f":
        if isinstance(value, int):  # numpy holds integers past 64 bits as objects
            raise TokenBatchOverflowError(f"{name} = {value} does not fit in 64 bits")
        raise InvalidTypeError(f"{name} must be a number or an array of numbers, got {value!r}")
    return np.ascontiguousarray(array, dtype=np.float64)


def _optional_count(name: str, value: Any) -> _Numbers:
    """A count where None means "not set" (0 for the core)."""
    return _numeric(name, 0 if value is None else value)


def _dtype_bytes(name: str, value: Any, *, strict: bool) -> _Numbers:
    return _lookup(name, value, DTYPE_BYTES, strict=strict)


def _fp32_bytes(name: str, value: Any) -> npt.NDArray[np.float64]:
    """4 bytes per parameter where the boolean option ``name`` keeps an fp32 copy, 0 where
    it does not; NaN (an invalid byte size, which the core refuses) where it is neither
    True nor False (0.5 or 2 are not a number of copies)."""
    flag = _numeric(name, value)
    # Chosen, not multiplied: 4 x a huge flag would overflow (with a warning) before
    # being thrown away.
    return np.where(flag == 1, 4.0, np.where(flag == 0, 0.0, np.nan))


def _layout_inputs(options: Mapping[str, Any], *, strict: bool) -> dict[str, _Column]:
    """Turn user options into the core's layout fields (compact, unbroadcast): numbers,
    and for a grid (not ``strict``) arrays of names, which the grid reads itself."""
    unknown = set(options) - set(_DEFAULTS) - {"seq_len"}
    if unknown:
        raise InvalidTypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    if "seq_len" not in options:
        raise InvalidTypeError("seq_len is required")
    o = {**_DEFAULTS, **options}
    param = _dtype_bytes("param_dtype", o["param_dtype"], strict=strict)
    # FP8 weights keep their gradients and compute their activations in 16 bits.
    at_least_16_bits = np.where(param < 2, 2.0, param)
    grad = (
        at_least_16_bits
        if o["grad_dtype"] is None
        else _dtype_bytes("grad_dtype", o["grad_dtype"], strict=strict)
    )
    act = (
        at_least_16_bits
        if o["activation_dtype"] is None
        else _dtype_bytes("activation_dtype", o["activation_dtype"], strict=strict)
    )
    if o["master_weights"] is None:
        master = np.where(param < 4, 4.0, 0.0)
        master[np.isnan(param)] = math.nan
    else:
        master = _fp32_bytes("master_weights", o["master_weights"])
    states = _lookup("optimizer", o["optimizer"], OPTIMIZER_STATES, strict=strict)
    state_bytes = states * _dtype_bytes("optimizer_dtype", o["optimizer_dtype"], strict=strict)
    fields: dict[str, _Column] = {
        "seq_len": _numeric("seq_len", o["seq_len"]),
        "micro_batch": _numeric("micro_batch", o["micro_batch"]),
        "dp": _numeric("dp", o["dp"]),
        "tp": _numeric("tp", o["tp"]),
        "pp": _numeric("pp", o["pp"]),
        "cp": _numeric("cp", o["cp"]),
        "ep": _numeric("ep", o["ep"]),
        "vpp": _numeric("vpp", o["vpp"]),
        "zero": _numeric("zero", o["zero"]),
        "sequence_parallel": _numeric("sequence_parallel", o["sequence_parallel"]),
        "recompute": _choice("recompute", o["recompute"], _RECOMPUTE, strict=strict),
        "grad_accum_steps": _optional_count("grad_accum_steps", o["grad_accum_steps"]),
        "param_bytes": param,
        "grad_bytes": grad,
        "grad_buffer_bytes": _fp32_bytes("fp32_grad_accum", o["fp32_grad_accum"]),
        "master_bytes": np.ascontiguousarray(master, dtype=np.float64),
        "optimizer_state_bytes": np.ascontiguousarray(state_bytes, dtype=np.float64),
        "activation_bytes": act,
        "logits_bytes": _dtype_bytes("logits_dtype", o["logits_dtype"], strict=strict),
        "activation_model": _choice(
            "activation_model", o["activation_model"], _ACTIVATION_MODEL, strict=strict
        ),
        "attention": _choice("attention", o["attention"], _ATTENTION, strict=strict),
        "fused_swiglu": _numeric("fused_swiglu", o["fused_swiglu"]),
        "overhead_bytes": _numeric("overhead_bytes", o["overhead_bytes"]),
        "first_stage_layers": _optional_count("first_stage_layers", o["first_stage_layers"]),
        "last_stage_layers": _optional_count("last_stage_layers", o["last_stage_layers"]),
        "pipeline_split": _choice(
            "pipeline_split", o["pipeline_split"], PIPELINE_SPLITS, strict=strict
        ),
        "moe_capacity_factor": _numeric(
            "moe_capacity_factor",
            0 if o["moe_capacity_factor"] is None else o["moe_capacity_factor"],
        ),
        "cp_comm": _choice("cp_comm", o["cp_comm"], _CP_COMM, strict=strict),
        "loss": _choice("loss", o["loss"], _LOSS, strict=strict),
        "fp8": _numeric("fp8", o["fp8"]),
        "optimizer_offload": _numeric("optimizer_offload", o["optimizer_offload"]),
    }
    return {name: fields[name] for name in LAYOUT_FIELDS}


def scalar_inputs(options: Mapping[str, Any]) -> dict[str, float]:
    """The core's numeric fields for scalar options (``seq_len`` defaults to 1 here)."""
    fields = _numbers(_layout_inputs({"seq_len": 1, **options}, strict=True))
    return {name: float(array.reshape(-1)[0]) for name, array in fields.items()}


def _numbers(fields: Mapping[str, _Column]) -> dict[str, _Numbers]:
    """The fields of scalar (``strict``) options, which are numbers only."""
    numbers = {k: v for k, v in fields.items() if not isinstance(v, _NameColumn)}
    if len(numbers) != len(fields):
        raise TypeError("scalar options gave an array of names")
    return numbers


def _run_grid(
    spec: ModelSpec, fields: Mapping[str, _Column]
) -> tuple[tuple[int, ...], _F64, npt.NDArray[np.uint8]]:
    if not isinstance(spec, ModelSpec):
        raise InvalidTypeError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    try:
        shape = np.broadcast_shapes(*(a.shape for a in fields.values()))
    except ValueError as exc:
        shapes = ", ".join(f"{k}{a.shape}" for k, a in fields.items() if a.shape)
        raise InvalidValueError(f"grid parameters do not broadcast: {shapes}") from exc
    inputs: list[Any] = []
    for column in fields.values():
        array = column.text if isinstance(column, _NameColumn) else column
        # Element strides over the grid's shape (0 along the axes it is broadcast over).
        view = np.broadcast_to(array, shape)
        strides = [s // array.itemsize for s in view.strides]
        if isinstance(column, _NameColumn):
            inputs.append((column.code_points(), strides, *column.names_and_codes()))
        else:
            inputs.append((column.reshape(-1), strides))
    flat, reasons = _core.memory_grid(spec, list(shape), inputs)
    return tuple(shape), flat.reshape(len(OUTPUT_FIELDS), -1), reasons.reshape(shape)


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU memory of one configuration, in bytes, on the busiest pipeline stage.

    ``stage`` is that stage's index and ``layers`` the transformer layers it holds.

    ``total = params + grads + optimizer + activations + overhead``. ``activation_parts``
    says what activations are made of: ``attention``, ``mlp`` and ``norm`` blocks of the
    layers in flight, ``embedding`` (first stage), ``logits`` (last stage),
    ``checkpoints`` (layer inputs kept by full recomputation), ``working`` (one layer
    rebuilt during backward), ``comm`` (expert-parallel all-to-all and context-parallel
    key/value buffers of one layer) and ``mtp`` (multi-token-prediction modules, last
    stage). ``cpu_optimizer`` is the optimizer state offloaded to CPU memory, not in
    ``total``. ``options`` are the options as given (defaults filled in);
    ``inputs`` are the numbers the core computed with (bytes per element of each dtype,
    optimizer state bytes, codes of named choices), keyed by the core's field names.
    """

    spec: ModelSpec
    options: dict[str, Any]
    inputs: dict[str, float]
    params: int
    grads: int
    optimizer: int
    activations: int
    overhead: int
    total: int
    activation_parts: dict[str, int]
    stage: int
    layers: int
    cpu_optimizer: int

    @property
    def model_states(self) -> int:
        """Weights, gradients and optimizer state."""
        return self.params + self.grads + self.optimizer

    @property
    def saved_activations(self) -> int:
        """Activations saved for backward when the forward passes end: ``activations``
        without the transient ``working`` set of full recomputation and ``comm`` buffers.
        This is what :func:`~tokenbatch.profile` measures (``ProfileResult.activations``)."""
        parts = self.activation_parts
        return self.activations - parts["working"] - parts["comm"]

    def fits(self, gpu_memory: float) -> bool:
        """Whether ``total`` is at most ``gpu_memory`` bytes."""
        return self.total <= gpu_memory

    def to_dict(self) -> dict[str, Any]:
        """The numbers as a flat dict (bytes)."""
        result: dict[str, Any] = {
            "params": self.params,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "overhead": self.overhead,
            "total": self.total,
            "stage": self.stage,
            "layers": self.layers,
            "cpu_optimizer": self.cpu_optimizer,
        }
        result.update({f"act_{k}": v for k, v in self.activation_parts.items()})
        return result

    def explanation(self) -> str:
        """The breakdown as text, with the formula and source of each line."""
        return _explain(self)

    def explain(self, file: TextIO | None = None) -> None:
        """Print :meth:`explanation` (to ``file``, default standard output)."""
        print(self.explanation(), file=sys.stdout if file is None else file)


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
    fields = _scalar_fields(seq_len, options)
    _, table, reasons = _run_grid(spec, fields)
    reason = int(reasons.reshape(-1)[0])
    if reason:
        raise _invalid(reason, {"seq_len": seq_len, **options})
    return _estimate_from_row(spec, seq_len, options, fields, table[:, 0])


def estimate_memory_stages(
    spec: ModelSpec, *, seq_len: int, **options: Any
) -> list[MemoryEstimate]:
    """The estimate of every pipeline stage, first to last.

    Takes the options of :func:`estimate_memory`, which reports the busiest of these
    stages, and raises what it raises. Useful with uneven stages, where the first and last
    stages hold fewer layers than the others and the busiest stage is not obvious.
    """
    if not isinstance(spec, ModelSpec):
        raise InvalidTypeError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    fields = _scalar_fields(seq_len, options)
    values = [float(array.reshape(-1)[0]) for array in fields.values()]
    flat, reason = _core.memory_stages(spec, values)
    if reason:
        raise _invalid(reason, {"seq_len": seq_len, **options})
    rows = flat.reshape(-1, len(OUTPUT_FIELDS))
    return [_estimate_from_row(spec, seq_len, options, fields, row) for row in rows]


def _scalar_fields(seq_len: int, options: Mapping[str, Any]) -> dict[str, _Numbers]:
    for name, value in (("seq_len", seq_len), *options.items()):
        if np.ndim(value) != 0:
            raise InvalidTypeError(f"{name} must be a scalar; use estimate_memory_grid for arrays")
    return _numbers(_layout_inputs({"seq_len": seq_len, **options}, strict=True))


def _estimate_from_row(
    spec: ModelSpec,
    seq_len: int,
    options: Mapping[str, Any],
    fields: Mapping[str, _Numbers],
    row: _F64,
) -> MemoryEstimate:
    values = dict(zip(OUTPUT_FIELDS, row.tolist(), strict=True))
    return MemoryEstimate(
        spec=spec,
        options={**_DEFAULTS, "seq_len": seq_len, **options},
        inputs={name: float(array.reshape(-1)[0]) for name, array in fields.items()},
        params=int(values["params"]),
        grads=int(values["grads"]),
        optimizer=int(values["optimizer"]),
        activations=int(values["activations"]),
        overhead=math.ceil(values["overhead"]),
        total=math.ceil(values["total"]),
        activation_parts={k: math.ceil(values[f"act_{k}"]) for k in _ACT_PARTS},
        stage=int(values["stage"]),
        layers=int(values["layers"]),
        cpu_optimizer=int(values["cpu_optimizer"]),
    )


def _invalid(code: int, options: Mapping[str, Any]) -> InvalidValueError | TokenBatchOverflowError:
    """The error of reason ``code``: an overflow for an estimate past the range of a float."""
    message = REASON_MESSAGES[code - 1]
    shown = {k: v for k, v in options.items() if k in message or k == "seq_len"}
    given = ", ".join(f"{k}={v!r}" for k, v in shown.items())
    text = f"{message} (got {given})" if given else message
    if code == _OVERFLOW_REASON:
        return TokenBatchOverflowError(text)
    return InvalidValueError(text)


class MemoryGrid:
    """Estimates over a broadcast grid: every field is a read-only float64 array of ``shape``.

    Invalid cells hold NaN; ``valid`` marks the others, ``reason_code`` (uint8, 0 for a
    valid cell) says which check failed and :meth:`reasons` says it in words. Each field is
    a contiguous array. Fields: ``params``, ``grads``, ``optimizer``, ``activations``,
    ``overhead``, ``total``, ``act_attention``, ``act_mlp``, ``act_norm``,
    ``act_embedding``, ``act_logits``, ``act_checkpoints``, ``act_working`` (bytes),
    ``stage`` and ``layers`` (the busiest stage and its transformer layers).
    """

    def __init__(
        self,
        spec: ModelSpec,
        shape: tuple[int, ...],
        table: _F64,
        reason_code: npt.NDArray[np.uint8],
    ) -> None:
        table.flags.writeable = False
        reason_code.flags.writeable = False
        self.spec = spec
        self.shape = shape
        # One contiguous row per field: a field is a view, and a reduction over it reads
        # only its own bytes.
        self._table = table
        self.reason_code = reason_code
        self.valid: npt.NDArray[np.bool_] = reason_code == 0
        self.valid.flags.writeable = False

    def field(self, name: str) -> _F64:
        """One output column as an array of ``shape`` (a view, no copy)."""
        if name not in OUTPUT_FIELDS:
            raise InvalidValueError(f"unknown field {name!r}; fields: {', '.join(OUTPUT_FIELDS)}")
        column: _F64 = self._table[OUTPUT_FIELDS.index(name)].reshape(self.shape)
        return column

    params = property(lambda self: self.field("params"), doc="Weight bytes per GPU.")
    grads = property(lambda self: self.field("grads"), doc="Gradient bytes per GPU.")
    optimizer = property(lambda self: self.field("optimizer"), doc="Optimizer state bytes.")
    activations = property(lambda self: self.field("activations"), doc="Activation bytes.")
    overhead = property(lambda self: self.field("overhead"), doc="Constant overhead bytes.")
    total = property(lambda self: self.field("total"), doc="Total bytes per GPU.")
    stage = property(lambda self: self.field("stage"), doc="Busiest pipeline stage.")
    layers = property(lambda self: self.field("layers"), doc="Layers of the busiest stage.")

    @property
    def size(self) -> int:
        """Number of cells."""
        return int(np.prod(self.shape))

    def fits(self, gpu_memory: float | npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Valid cells whose total is at most ``gpu_memory`` bytes."""
        result: npt.NDArray[np.bool_] = self.valid & (self.total <= np.asarray(gpu_memory))
        return result

    def reasons(self) -> npt.NDArray[np.str_]:
        """Why each cell is invalid (an empty string for valid cells)."""
        messages = np.asarray(["", *REASON_MESSAGES])
        result: npt.NDArray[np.str_] = messages[self.reason_code]
        return result

    def to_dict(self) -> dict[str, _F64]:
        """Every output column by name."""
        return {name: self.field(name) for name in OUTPUT_FIELDS}

    def __repr__(self) -> str:
        valid = int(self.valid.sum())
        return f"MemoryGrid(spec={self.spec.name!r}, shape={self.shape}, valid={valid})"


def estimate_memory_grid(spec: ModelSpec, **params: Any) -> MemoryGrid:
    """Estimate every combination of broadcast parameters at once (in Rust, on all cores).

    Takes the options of :func:`estimate_memory`, any of which may be a numpy array (or a
    list); the arrays broadcast like numpy arrays, e.g. ``tp=np.array([1, 2, 4, 8])[:, None]``
    and ``seq_len=np.array([2048, 4096])`` give a ``(4, 2)`` grid. String options accept
    arrays of strings, matched in any case. Cells whose layout is invalid (an unknown name
    among them) are NaN and flagged in ``valid``; the grid itself never fails because of
    them.
    """
    converted = {
        k: (np.asarray(v) if isinstance(v, (list, tuple)) else v) for k, v in params.items()
    }
    fields = _layout_inputs(converted, strict=False)
    shape, table, reasons = _run_grid(spec, fields)
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
    step = as_int(multiple_of, "multiple_of", minimum=1)
    cp = as_int(layout.get("cp", 1), "cp", minimum=1)
    if cp > 1:
        step = math.lcm(step, 2 * cp)
    if not (isinstance(gpu_memory, (int, float)) and math.isfinite(gpu_memory) and gpu_memory > 0):
        raise InvalidValueError(
            f"gpu_memory must be a positive number of bytes, got {gpu_memory!r}"
        )

    def fits(units: int) -> bool:
        estimate = estimate_memory(spec, seq_len=units * step, micro_batch=1, **layout)
        return estimate.total <= gpu_memory

    try:
        smallest_fits = fits(1)
    except (InvalidValueError, TokenBatchOverflowError) as error:
        # An error that shows the probe's seq_len, which the caller did not pass, says so.
        if "seq_len=" not in str(error):
            raise
        raise type(error)(f"{error}, on the smallest row it tries (seq_len={step})") from None
    if not smallest_fits:
        return 0
    low, high = 1, 2
    while fits(high):
        low, high = high, high * 2
        if high > 2**40:
            return low * step
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low * step


def _gib(value: float) -> str:
    return f"{value / GIB:10.3f}"


def _bytes(value: float) -> str:
    return f"{value:g}"


def _explain(est: MemoryEstimate) -> str:
    o = est.options
    n = est.inputs
    spec = est.spec
    param_b = n["param_bytes"]
    grad_b = n["grad_bytes"]
    accum = n["grad_buffer_bytes"]
    master = n["master_bytes"]
    states = n["optimizer_state_bytes"]
    zero = int(o["zero"])
    group = int(o["dp"]) * int(o["cp"])
    layout = ", ".join(
        f"{k}={o[k]}" for k in ("seq_len", "micro_batch", "dp", "tp", "pp", "cp", "ep", "vpp")
    )
    lines = [
        f"{spec.name}: {spec.num_params():,} parameters ({spec.num_active_params():,} active)",
        f"layout: {layout}, zero={zero}, sequence_parallel={o['sequence_parallel']}, "
        f"recompute={o['recompute']}",
        f"per GPU, busiest pipeline stage = {est.stage} (of {o['pp']}), holding {est.layers} "
        f"of {spec.num_layers} layers (pipeline_split={o['pipeline_split']!r}"
        + (f", first_stage_layers={o['first_stage_layers']}" if o["first_stage_layers"] else "")
        + (f", last_stage_layers={o['last_stage_layers']}" if o["last_stage_layers"] else "")
        + ")",
        "",
        f"{'component':<16}{'GiB':>10}  how",
        f"{'params':<16}{_gib(est.params)}  {_bytes(param_b)} B/param ({o['param_dtype']})"
        + (f", sharded over dp*cp={group} (ZeRO-3)" if zero >= 3 else ""),
        f"{'grads':<16}{_gib(est.grads)}  {_bytes(grad_b)}"
        f"{f' + {_bytes(accum)} (fp32 accumulation)' if accum else ''} B/param"
        + (f", sharded over dp*cp={group} (ZeRO-2)" if zero >= 2 else ""),
        f"{'optimizer':<16}{_gib(est.optimizer)}  "
        f"{_bytes(master)} (master weights) + {_bytes(states)} "
        f"({o['optimizer']} states in {o['optimizer_dtype']}) B/param"
        + (f", sharded over dp*cp={group} (ZeRO-1)" if zero >= 1 else "")
        + (
            f", {_gib(est.cpu_optimizer).strip()} GiB more offloaded to CPU"
            if est.cpu_optimizer
            else ""
        ),
        f"{'activations':<16}{_gib(est.activations)}  {o['activation_model']} model"
        f" ({spec.implementation} kernels"
        + (
            f", {spec.moe_dispatcher} dispatcher"
            if spec.is_moe and spec.implementation == "fused"
            else ""
        )
        + f"), {_bytes(n['activation_bytes'])} B/element"
        + (", FP8 linear inputs" if n["fp8"] else "")
        + f", {o['micro_batch']} x {o['seq_len']} tokens / cp per micro-batch",
    ]
    how = {
        "attention": "qkv input, q/k/v, output, softmax stats (or s x s probabilities)",
        "mlp": "MLP/MoE input and inner activations",
        "norm": "norm inputs and fp32 statistics (residual stream)",
        "embedding": "token ids / embedding dropout mask, per micro-batch in flight",
        "logits": "final norm, head input, logits (or log-sum-exp) for the loss",
        "checkpoints": "layer inputs kept by full recomputation",
        "working": "one layer recomputed during backward",
        "comm": "EP all-to-all / CP key-value buffers of one layer",
        "mtp": "multi-token-prediction modules",
    }
    for part, value in est.activation_parts.items():
        if value:
            lines.append(f"  {part:<14}{_gib(value)}  {how[part]}")
    if est.overhead:
        lines.append(f"{'overhead':<16}{_gib(est.overhead)}  overhead_bytes")
    lines.append(f"{'total':<16}{_gib(est.total)}")
    lines += [
        "",
        "sources: model states 2+2+12 B/param and ZeRO divisions: Rajbhandari et al. 2020;",
        "activations: Korthikanti et al. 2022 (korthikanti) or the saved tensors of a modern",
        "block (modern); pipeline in-flight micro-batches: Narayanan et al. 2021.",
    ]
    return "\n".join(lines)
