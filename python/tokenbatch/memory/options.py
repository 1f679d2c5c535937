"""The options of an estimate as the core's layout fields.

Numbers pass as they are; names (``recompute="full"``, ``param_dtype="bf16"``...) become
the numbers the core's option enums give them, parsed in the core, which also checks
every field's range. What stays here is Python's side: which values are numbers and which
names, the defaults, and the fields derived from several options (the bytes of gradients,
master weights and optimizer states).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch.errors import InvalidTypeError, InvalidValueError, TokenBatchOverflowError

__all__ = ["DTYPE_BYTES", "OPTIMIZER_STATES", "OPTIONS", "scalar_inputs"]

LAYOUT_FIELDS, OUTPUT_FIELDS, REASON_MESSAGES, OVERFLOW_REASON = _core.memory_fields()

#: Bytes per element of the dtype names accepted by the ``*_dtype`` options.
DTYPE_BYTES: dict[str, int] = {
    name: int(size) for name, size in _core.memory_option_choices("param_dtype")
}

#: Optimizer states per parameter (each of ``optimizer_dtype``): AdamW keeps two moments,
#: Lion, Muon and SGD with momentum one.
OPTIMIZER_STATES: dict[str, int] = {
    name: int(states) for name, states in _core.memory_option_choices("optimizer")
}

DEFAULTS: dict[str, Any] = {
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
OPTIONS = tuple(DEFAULTS)

#: A field: a float for one configuration, an array for a grid.
Field = Any
_F64 = npt.NDArray[np.float64]

#: numpy dtype kinds read as names: str, bytes, and objects (as ``str()`` gives them).
_TEXT_KINDS = "USO"

#: Options whose values may be names.
_NAMED = (
    "recompute",
    "optimizer",
    "param_dtype",
    "grad_dtype",
    "optimizer_dtype",
    "activation_dtype",
    "logits_dtype",
    "activation_model",
    "attention",
    "pipeline_split",
    "cp_comm",
    "loss",
)

# Integer and boolean arrays at least this long are handed to the core as int64, int32 or bool
# and read in place; shorter ones (a grid's axes) as float64, whose extraction is cheaper.
_INTEGER_COLUMN = 4096


def _number(name: str, value: Any) -> float:
    """One number as a float: bools, integers (at most 64 bits) and floats."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (int, float, np.integer, np.floating, np.bool_)):
        if isinstance(value, int) and not -(2**63) <= value < 2**64:
            raise TokenBatchOverflowError(f"{name} = {value} does not fit in 64 bits")
        return float(value)
    raise InvalidTypeError(f"{name} must be a number or an array of numbers, got {value!r}")


def _numeric(name: str, value: Any) -> npt.NDArray[Any]:
    """An array of numbers as the grid reads them, in place: contiguous bool, int32 or
    int64 (long boolean or integer columns; other integers as int64) or float64 (other
    dtypes are converted once)."""
    array = np.asarray(value)
    if array.dtype.kind == "b" and array.size >= _INTEGER_COLUMN:
        return np.ascontiguousarray(array)
    if array.dtype.kind in "iu" and array.size >= _INTEGER_COLUMN:
        # int32 is read as it is, not copied to int64 first.
        dtype = np.int32 if array.dtype == np.int32 else np.int64
        return np.ascontiguousarray(array, dtype=dtype)
    if array.dtype.kind not in "iubf":
        if array.ndim == 0:
            _number(name, value)  # raises the scalar's error
        raise InvalidTypeError(f"{name} must be a number or an array of numbers, got {value!r}")
    return np.ascontiguousarray(array, dtype=np.float64)


def _code(option: str, value: Any) -> float:
    """The number a name stands for (the core's error, listing the choices, if none)."""
    name = value.decode() if isinstance(value, bytes) else value
    return float(_core.memory_option_code(option, name))


def _names(option: str, array: npt.NDArray[Any]) -> _F64:
    """The numbers an array of names stands for, NaN (an invalid cell) for unknown ones."""
    text = np.ascontiguousarray(array if array.dtype.kind == "U" else array.astype(str))
    if text.itemsize == 0:
        text = text.astype("U1")
    rows = text.reshape(-1).view(np.uint32).reshape(text.size, -1)
    codes: _F64 = _core.memory_option_codes(option, rows).reshape(text.shape)
    return codes


def _scalar(name: str, value: Any) -> float:
    """One configuration's value of option ``name``."""
    # The common cases first: a single estimate is called in loops.
    if type(value) is float:
        return value
    if type(value) is int and -(2**63) <= value < 2**64:
        return float(value)
    if name in _NAMED and isinstance(value, (str, bytes)):
        return _code(name, value) if value != DEFAULTS.get(name) else _DEFAULT_CODES[name]
    return _number(name, value)


#: The codes of the default names, parsed once.
_DEFAULT_CODES = {name: _code(name, DEFAULTS[name]) for name in _NAMED if DEFAULTS[name]}


def _grid_value(name: str, value: Any) -> Field:
    """A grid's value of option ``name``: a float for a scalar, else an array; a name that
    names nothing is NaN, which makes its cells invalid."""
    if isinstance(value, (list, tuple)):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray) or value.ndim == 0:
        try:
            return _scalar(name, value.item() if isinstance(value, np.ndarray) else value)
        except InvalidValueError:
            return np.nan
    if value.dtype.kind in _TEXT_KINDS:
        if name not in _NAMED:
            raise InvalidTypeError(f"{name} must be a number or an array of numbers, got {value!r}")
        return _names(name, value)
    return _numeric(name, value)


def _select(condition: Any, yes: Any, no: Any) -> Field:
    """``yes`` where ``condition`` holds, else ``no``: a plain choice for one configuration,
    :func:`numpy.where` for arrays."""
    if isinstance(condition, (bool, np.bool_)):
        return yes if condition else no
    return np.where(condition, yes, no)


def _fp32_bytes(flag: Field) -> Field:
    """4 bytes per parameter where a boolean option keeps an fp32 copy, 0 where it does
    not; NaN (an invalid byte size, which the core refuses) where it is neither True nor
    False (0.5 or 2 are not a number of copies)."""
    return _select(flag == 1, 4.0, _select(flag == 0, 0.0, np.nan))


def layout_fields(options: Mapping[str, Any], value: Callable[[str, Any], Field]) -> list[Field]:
    """The core's layout fields, in ``LAYOUT_FIELDS`` order, of user options (``seq_len``
    required), each option's value converted by ``value(name, v)``."""
    unknown = set(options) - set(DEFAULTS) - {"seq_len"}
    if unknown:
        raise InvalidTypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    if "seq_len" not in options:
        raise InvalidTypeError("seq_len is required")
    o = {**DEFAULTS, **options}

    def given(name: str, default: Any = None) -> Field:
        return default if o[name] is None else value(name, o[name])

    param = value("param_dtype", o["param_dtype"])
    # FP8 weights keep their gradients and compute their activations in 16 bits.
    at_least_16_bits = _select(param < 2, 2.0, param)
    # Without an fp32 copy asked for or refused, weights below 32 bits get one (NaN stays).
    master = (
        _select(param < 4, 4.0, param * 0.0)
        if o["master_weights"] is None
        else _fp32_bytes(value("master_weights", o["master_weights"]))
    )
    derived = {
        "grad_accum_steps": given("grad_accum_steps", 0.0),
        "param_bytes": param,
        "grad_bytes": given("grad_dtype", at_least_16_bits),
        "grad_buffer_bytes": _fp32_bytes(value("fp32_grad_accum", o["fp32_grad_accum"])),
        "master_bytes": master,
        "optimizer_state_bytes": value("optimizer", o["optimizer"])
        * value("optimizer_dtype", o["optimizer_dtype"]),
        "activation_bytes": given("activation_dtype", at_least_16_bits),
        "logits_bytes": value("logits_dtype", o["logits_dtype"]),
        "first_stage_layers": given("first_stage_layers", 0.0),
        "last_stage_layers": given("last_stage_layers", 0.0),
        "moe_capacity_factor": given("moe_capacity_factor", 0.0),
    }
    return [derived[k] if k in derived else value(k, o[k]) for k in LAYOUT_FIELDS]


def scalar_fields(options: Mapping[str, Any]) -> list[float]:
    """The layout fields of one configuration's options, as floats."""
    for name, value in options.items():
        if type(value) not in _PLAIN and isinstance(value, _SEQUENCES) and np.ndim(value) != 0:
            raise InvalidTypeError(f"{name} must be a scalar; use estimate_memory_grid for arrays")
    if "seq_len" in options and options.keys() <= _OWN_FIELD.keys():
        # Only options that are a field of their own: the defaults' fields with those set.
        fields = _DEFAULT_FIELDS.copy()
        for name, value in options.items():
            unset = value is None and name in _OPTIONAL
            fields[_OWN_FIELD[name]] = 0.0 if unset else _scalar(name, value)
        return fields
    return [float(x) for x in layout_fields(options, _scalar)]


#: Types that are never an array, checked first; then those that may be one.
_PLAIN = (int, float, str, bool)
_SEQUENCES = (list, tuple, np.ndarray)


#: The fields of the default options (``seq_len`` 1).
_DEFAULT_FIELDS = [float(x) for x in layout_fields({"seq_len": 1}, _scalar)]
#: The options that are a layout field of their own, with its index.
_OWN_FIELD = {name: i for i, name in enumerate(LAYOUT_FIELDS) if name in DEFAULTS or i == 0}
#: The options whose None means "not set" (0 for the core).
_OPTIONAL = {name for name, value in DEFAULTS.items() if value is None}


def grid_fields(options: Mapping[str, Any]) -> list[npt.NDArray[Any]]:
    """The layout fields of a grid's options, as compact (unbroadcast) arrays."""
    fields = layout_fields(options, _grid_value)
    return [x if isinstance(x, np.ndarray) else np.asarray(x, dtype=np.float64) for x in fields]


def scalar_inputs(options: Mapping[str, Any]) -> dict[str, float]:
    """The core's numeric fields for scalar options (``seq_len`` defaults to 1 here)."""
    return dict(zip(LAYOUT_FIELDS, scalar_fields({"seq_len": 1, **options}), strict=True))
