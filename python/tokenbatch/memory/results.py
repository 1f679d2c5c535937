"""What an estimate returns: one configuration's breakdown (and its explanation), or a
grid's columns."""

from __future__ import annotations

import math
import sys
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from tokenbatch.errors import InvalidValueError
from tokenbatch.memory.options import DEFAULTS, LAYOUT_FIELDS, OUTPUT_FIELDS, REASON_MESSAGES
from tokenbatch.memory.spec import ModelSpec

__all__ = ["MemoryEstimate", "MemoryGrid"]

_F64 = npt.NDArray[np.float64]


#: Each output column's index in the core's row.
_COLUMN = {name: i for i, name in enumerate(OUTPUT_FIELDS)}

#: The activation parts, each with its output column's index.
_ACT_PARTS = [
    (name[len("act_") :], i) for i, name in enumerate(OUTPUT_FIELDS) if name.startswith("act_")
]


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

    Immutable; two estimates are equal when their spec, options and numbers are. It holds
    the core's row and reads each number from it when asked, so one estimate, a call made
    in loops, builds nothing it is not asked for.
    """

    __slots__ = ("_fields", "_options", "_row", "spec")

    spec: ModelSpec
    _options: dict[str, Any]
    _fields: list[float]
    _row: list[float]

    def __init__(
        self, spec: ModelSpec, options: dict[str, Any], fields: list[float], row: list[float]
    ) -> None:
        """Wrap the core's ``row`` (``OUTPUT_FIELDS`` order) of the layout ``fields``
        (``LAYOUT_FIELDS`` order) computed from the user's ``options``."""
        object.__setattr__(self, "spec", spec)
        object.__setattr__(self, "_options", options)
        object.__setattr__(self, "_fields", fields)
        object.__setattr__(self, "_row", row)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"MemoryEstimate is immutable; cannot set {name}")

    def __reduce__(self) -> tuple[type[MemoryEstimate], tuple[Any, ...]]:
        # Pickled and copied through the constructor: the default would set the slots.
        return MemoryEstimate, (self.spec, self._options, self._fields, self._row)

    @property
    def params(self) -> int:
        """Weight bytes."""
        return int(self._row[_COLUMN["params"]])

    @property
    def grads(self) -> int:
        """Gradient bytes."""
        return int(self._row[_COLUMN["grads"]])

    @property
    def optimizer(self) -> int:
        """Optimizer state bytes in GPU memory."""
        return int(self._row[_COLUMN["optimizer"]])

    @property
    def activations(self) -> int:
        """Activation bytes."""
        return int(self._row[_COLUMN["activations"]])

    @property
    def overhead(self) -> int:
        """Constant overhead bytes."""
        return math.ceil(self._row[_COLUMN["overhead"]])

    @property
    def total(self) -> int:
        """All bytes: model states, activations and overhead."""
        return math.ceil(self._row[_COLUMN["total"]])

    @property
    def stage(self) -> int:
        """The busiest pipeline stage's index."""
        return int(self._row[_COLUMN["stage"]])

    @property
    def layers(self) -> int:
        """The transformer layers of the busiest stage."""
        return int(self._row[_COLUMN["layers"]])

    @property
    def cpu_optimizer(self) -> int:
        """Optimizer state bytes offloaded to CPU memory, not in ``total``."""
        return int(self._row[_COLUMN["cpu_optimizer"]])

    @property
    def options(self) -> dict[str, Any]:
        """The options as given, defaults filled in (a new dict each time)."""
        return DEFAULTS | self._options

    @property
    def inputs(self) -> dict[str, float]:
        """The core's layout fields by name (a new dict each time)."""
        return dict(zip(LAYOUT_FIELDS, self._fields, strict=True))

    @property
    def activation_parts(self) -> dict[str, int]:
        """The activation bytes of each part (a new dict each time)."""
        return {part: math.ceil(self._row[i]) for part, i in _ACT_PARTS}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MemoryEstimate):
            return NotImplemented
        return (self.spec, self.options, self._row) == (other.spec, other.options, other._row)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        numbers = ", ".join(f"{k}={v}" for k, v in self.to_dict().items() if k[:4] != "act_")
        return (
            f"MemoryEstimate(spec={self.spec.name!r}, options={self._options}, {numbers}, "
            f"activation_parts={self.activation_parts})"
        )

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


GIB = 1024**3


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
